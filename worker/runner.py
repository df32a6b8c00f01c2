"""Running one release job: artifact production. The same code serves the Celery task and
the embedded mode.

The job parses the raw data, runs the mechanism, writes the files and stores them; every change
of the release's state (start, the private read, progress, the upload claim, success, failure)
is made by ``service.releases.lifecycle`` under the release row lock, in one transaction per
call opened by the worker's modules (the task side, which commits).

A job is idempotent by release id: it does nothing for a release already in a terminal state,
and it never draws fresh noise for a release whose artifact already exists (a previous attempt
that stored its output and died before recording it is finished from the stored object).
The ledger entry is committed in the same transaction that marks the release succeeded, and
refunded only when a job fails before any attempt began reading the dataset's content or
claimed the artifact's upload: each is recorded under the release row lock before it happens
(``lifecycle.mark_private_read``, ``lifecycle.claim_upload``), so a failure (or a cancel)
whose cause may lie in the private data is never refunded, a release settled by another
delivery (one that gave up) is never published, and one that may have been published is never
refunded (docs/privacy.md, "Failures and cancellations").

This module holds the entry points; the work is in the modules it names:

- ``worker.job``: the read-only view of the release a job works from;
- ``worker.attempts``: retries, and how an attempt ends;
- ``worker.production``: the private read, the engine's choice, the shards;
- ``worker.engines``: local, sharded and Dask rows;
- ``worker.writing`` and ``worker.metadata``: the release's files and their metadata;
- ``worker.publishing``: the upload claim, the store, success;
- ``worker.progress``: progress, and how a job notices it should stop.
"""

from __future__ import annotations

from service.runtime import Runtime
from worker import attempts, job, production
from worker.attempts import RETRYABLE, TRANSIENT_ERRORS, Interrupted, TransientError, fail
from worker.metadata import published_classes
from worker.progress import PROGRESS_EVERY_S, UPLOAD_SHARE, Progress
from worker.writing import InsufficientDisk, disk_need

__all__ = [
    "PROGRESS_EVERY_S",
    "RETRYABLE",
    "TRANSIENT_ERRORS",
    "UPLOAD_SHARE",
    "InsufficientDisk",
    "Interrupted",
    "Progress",
    "TransientError",
    "disk_need",
    "execute",
    "fail",
    "finish_shards",
    "published_classes",
    "run_release",
    "run_shard",
]


def run_release(runtime: Runtime, release_id: str) -> None:
    """Embedded mode: run with bounded attempts and backoff, ending in a terminal state."""
    attempts.retry(runtime, release_id, lambda: execute(runtime, release_id))


def execute(runtime: Runtime, release_id: str) -> None:
    """One attempt. Raises TransientError when another attempt may succeed, Interrupted when
    the process is shutting down (the release is then queued again, this attempt uncounted);
    any other failure is recorded as terminal here."""
    if runtime.stopping.is_set():
        raise Interrupted("shutting down: not starting a job")
    attempts.run(
        runtime,
        release_id,
        lambda: job.start(runtime, release_id),
        lambda j: production.produce(runtime, j),
    )


def finish_shards(runtime: Runtime, release_id: str, attempt: int, plan_key: str) -> None:
    """A sharded release's finaliser (``worker.shards``): with every part stored, assemble,
    publish and settle the release, within the attempt that planned the split (the release is
    left alone when it is no longer running in that attempt). Raises like ``execute``."""
    if runtime.stopping.is_set():
        raise Interrupted("shutting down: not finishing a job")
    attempts.run(
        runtime,
        release_id,
        lambda: job.resume(runtime, release_id, attempt),
        lambda j: production.produce(runtime, j, plan_key),
    )


def run_shard(runtime: Runtime, release_id: str, attempt: int, index: int, plan_key: str) -> None:
    """Shard ``index`` of a sharded release (``worker.shards``), within ``attempt``: draw and
    store its part unless stored already, then, if every part is stored, hand the release to
    the finaliser. Raises like ``execute``, except that Interrupted leaves the shard for
    redelivery and the release running."""
    if runtime.stopping.is_set():
        raise Interrupted("shutting down: not starting a shard")
    attempts.run(
        runtime,
        release_id,
        lambda: job.resume(runtime, release_id, attempt),
        lambda j: production.shard(runtime, j, index, plan_key),
        shard=index,
        attempt=attempt,
    )
