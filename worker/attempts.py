"""A release job's attempts: what ends one (a retryable error, a shutdown, a cancel, a
failure), how the embedded mode retries with backoff, and the lifecycle calls that settle an
attempt. Whether an attempt is still the release's current one is the lifecycle's to say
(``lifecycle.current``): this module only asks."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, EndpointConnectionError
from sqlalchemy.exc import OperationalError

from dpcore.mechanisms.spec import Cancelled
from service import owner_only
from service.db import transaction
from service.releases import lifecycle
from service.runtime import Runtime
from worker import shards, staging

if TYPE_CHECKING:
    from worker.job import Job

log = logging.getLogger(__name__)

TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    OperationalError,
    EndpointConnectionError,
    BotoCoreError,
    ConnectionError,
    TimeoutError,
)
# How often a retry's backoff looks whether the process is shutting down.
BACKOFF_SLICE_S = 0.25


class TransientError(Exception):
    """Worth another attempt (a database or object store that did not answer)."""


# What another attempt may fix (a TransientError is also raised by the runner itself).
RETRYABLE: tuple[type[BaseException], ...] = (*TRANSIENT_ERRORS, TransientError)


class Interrupted(Exception):
    """This process is shutting down (``Runtime.stopping``): the job stopped between chunks,
    before claiming the upload, and its release was put back in the queue, its attempt not
    counted (``lifecycle.requeue``). The caller leaves it for redelivery."""


def retry_delay(retry: int, *, attempts: int, window_s: float) -> float:
    """Seconds to wait before retry number ``retry`` (1 for the second attempt) of a job with
    ``attempts`` attempts: a doubling back-off whose waits add up to ``window_s``
    (``DPRELEASE_TASK_RETRY_WINDOW_S``). An outage of the object store or the database shorter
    than the window is outlasted whatever the number of attempts, and the early retries stay
    quick for a blip."""
    retries = attempts - 1
    if retries < 1 or window_s <= 0:
        return 0.0
    retry = min(max(retry, 1), retries)
    return window_s * 2.0 ** (retry - 1) / (2.0**retries - 1)


def retry(runtime: Runtime, release_id: str, once: Callable[[], None]) -> None:
    """Embedded mode: run ``once`` (one attempt) with bounded attempts and backoff, ending in
    a terminal state."""
    attempts = runtime.settings.task_max_attempts
    for attempt in range(1, attempts + 1):
        try:
            once()
            return
        except Interrupted:
            return  # left queued: the next start resumes it (service.app)
        except TransientError as exc:
            log.warning("release %s attempt %d: %s", release_id, attempt, exc)
            if attempt == attempts:
                fail(runtime, release_id, f"gave up after {attempts} attempts: {exc}")
                return
            wait = retry_delay(
                attempt, attempts=attempts, window_s=runtime.settings.task_retry_window_s
            )
            if backoff(runtime, wait):
                return  # shutting down: still unfinished, resumed at the next start


def backoff(runtime: Runtime, seconds: float) -> bool:
    """Sleep ``seconds`` in short slices, ending early (True) once the process is shutting
    down, so a backoff does not hold a shutdown up."""
    for _ in range(math.ceil(seconds / BACKOFF_SLICE_S)):
        if runtime.stopping.is_set():
            return True
        time.sleep(BACKOFF_SLICE_S)
    return runtime.stopping.is_set()


def run(
    runtime: Runtime,
    release_id: str,
    begin: Callable[[], Job | None],
    work: Callable[[Job], None],
    *,
    shard: int | None = None,
    attempt: int | None = None,
) -> None:
    """Run ``work`` on the job ``begin`` returns (None: nothing to do), ending the attempt as
    its outcome says. A release's job (``shard`` None) that is interrupted is queued again;
    a shard is left for redelivery, its release still running. ``attempt``: the attempt a
    failure is fenced by when ``begin`` failed before returning a job."""
    job: Job | None = None
    try:
        job = begin()
        if job is None:
            return
        work(job)
    except Interrupted:
        if shard is None:
            log.info("release %s: stopped for shutdown; queued again", release_id)
            requeue(runtime, release_id, None if job is None else job.attempt)
        else:
            log.info("release %s: shard %d stopped for shutdown", release_id, shard)
        raise
    except Cancelled as exc:
        # Cancelled (or settled by another delivery, or handed over again by the sweeper)
        # while this attempt ran: the lifecycle recorded the outcome; this attempt stored
        # nothing of its own.
        log.info("release %s: %s; stopped", release_id, exc)
        discard_parts(runtime, release_id)
    except RETRYABLE as exc:
        if job is not None and superseded(runtime, job):
            # The sweeper handed the release over again: a later attempt owns it, and this
            # one's retry would only start yet another attempt beside it.
            log.info("release %s: attempt %d superseded; not retried", release_id, job.attempt)
            return
        if isinstance(exc, TransientError):
            raise
        raise TransientError(f"{type(exc).__name__}: {exc}") from exc
    except Exception as exc:
        where = "" if shard is None else f"shard {shard}: "
        # Where, not what: the message may quote private values (owner_only.failure); the
        # release stores it for its owner.
        log.error("release %s %sfailed: %s", release_id, where, owner_only.failure(exc))
        fail(
            runtime,
            release_id,
            f"{where}{type(exc).__name__}: {exc}",
            attempt=attempt if job is None else job.attempt,
        )
        discard_parts(runtime, release_id)


def superseded(runtime: Runtime, job: Job) -> bool:
    """Whether the release is no longer this job's attempt (queued again by the sweeper, or
    started again by another delivery). False when that cannot be read (the database may be
    what failed): the usual retry then follows, bounded by the attempts."""
    try:
        with transaction(runtime.session_factory) as session:
            return lifecycle.current(session, job.release_id, job.attempt) is None
    except Exception:
        log.warning("release %s: could not read its state", job.release_id, exc_info=True)
        return False


def discard_parts(runtime: Runtime, release_id: str) -> None:
    """A settled (or abandoned) release's worker-side objects go (best effort; never served):
    a sharded release's parts, and the partitions a Dask release's jobs staged and could not
    delete (``worker.staging``). Kept while the release is still running (another attempt
    uses them) or when its state cannot be read: the next settlement removes them."""
    try:
        with transaction(runtime.session_factory) as session:
            running = lifecycle.current(session, release_id) is not None
    except Exception:
        log.warning("release %s: state unreadable; its shard parts are kept", release_id)
        return
    if not running:
        shards.discard(runtime.store, release_id)
        if runtime.settings.release_engine == "dask":
            staging.discard(runtime.store, release_id)


def requeue(runtime: Runtime, release_id: str, attempt: int | None) -> None:
    with transaction(runtime.session_factory) as session:
        lifecycle.requeue(session, release_id, reason="worker shutting down", attempt=attempt)


def fail(runtime: Runtime, release_id: str, error: str, *, attempt: int | None = None) -> None:
    """End the release failed; refunded or charged from its recorded marks (the private read,
    the upload claim), without a word to the object store (which may be why it failed).
    Given the job's ``attempt``, only while that attempt is the release's current one."""
    with transaction(runtime.session_factory) as session:
        lifecycle.fail(session, release_id, error, attempt=attempt)
