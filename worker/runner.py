"""Running one release job: artifact production. The same code serves the Celery task and
the embedded mode.

The job parses the raw data, runs the mechanism, writes the files and stores them; every change
of the release's state (start, the private read, progress, the upload claim, success, failure)
is made by ``service.releases.lifecycle`` under the release row lock, in one transaction per
call opened here (this module is the task side, which commits).

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
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import platform
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch
from botocore.exceptions import BotoCoreError, EndpointConnectionError
from sqlalchemy.exc import OperationalError

from dpcore import evaluation
from dpcore.accounting.events import NoiseDescription
from dpcore.categorical import DECODING as CATEGORY_DECODING
from dpcore.categorical import category_proportions
from dpcore.mechanisms import registry, sharding
from dpcore.mechanisms.noise import SecureNoise
from dpcore.mechanisms.run import build, randomness
from dpcore.mechanisms.sharding import ShardPlan
from dpcore.mechanisms.spec import Cancelled, ExtraArtifact
from dpcore.preprocessing import TRANSFORM_HELP
from dpcore.release_layout import Layout
from service import owner_only
from service.datasets.parsing import ParsedDataset, parse_dataset
from service.datasets.schemas import Budget, DatasetMetadata, declared_columns
from service.db import transaction
from service.errors import ClassesUndeclared
from service.models import Dataset, DatasetBudget, Release
from service.releases import keys, lifecycle
from service.releases import noise as release_noise
from service.releases.mechanisms import VALUE_BYTES
from service.releases.status import ReleaseStatus
from service.runtime import Runtime
from service.storage import ObjectExists, ObjectStore, sha256_hex
from worker import engines, shards
from worker import scratch as scratch_dirs
from worker.artifacts import ArtifactWriter, sha256_file

log = logging.getLogger(__name__)

TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    OperationalError,
    EndpointConnectionError,
    BotoCoreError,
    ConnectionError,
    TimeoutError,
)
# Progress writes (each also reads the status: how a cancel is noticed) at most this often.
PROGRESS_EVERY_S = 0.5
# The share of the progress bar left for storing the output once the rows are written.
UPLOAD_SHARE = 0.05
# How often a retry's backoff looks whether the process is shutting down.
BACKOFF_SLICE_S = 0.25
# The phase of a job whose progress the runner counts in rows (ReleaseOutput.progress "rows").
ROWS_PHASE = "rows"


class TransientError(Exception):
    """Worth another attempt (a database or object store that did not answer)."""


# What another attempt may fix (a TransientError is also raised by the runner itself).
RETRYABLE: tuple[type[BaseException], ...] = (*TRANSIENT_ERRORS, TransientError)


class Interrupted(Exception):
    """This process is shutting down (``Runtime.stopping``): the job stopped between chunks,
    before claiming the upload, and its release was put back in the queue, its attempt not
    counted (``lifecycle.requeue``). The caller leaves it for redelivery."""


class InsufficientDisk(Exception):
    """Too little free disk for the files a job is about to write: it fails before writing,
    before any upload claim; charged all the same, as the job has read the private data."""


@dataclass(frozen=True)
class Job:
    release_id: str
    dataset_id: str
    mechanism: str
    params: dict[str, Any]
    fmt: str
    noise: NoiseDescription
    noise_sampler: str
    epsilon: float
    delta: float
    accountant: str
    attempt: int
    dataset_key: str
    dataset_sha256: str
    dataset_filename: str
    metadata: DatasetMetadata
    report_dataset: tuple[str, str, str, DatasetMetadata] | None = None  # key, sha, file, meta
    # Further files an earlier attempt's upload claim declared (none before any claim).
    declared: tuple[lifecycle.ArtifactRecord, ...] = ()
    # A research release's claim (service.releases.research): stated in its metadata.
    research: dict[str, Any] | None = None
    # When the release was requested (public): the metadata's ``created_at``. Not the time the
    # job wrote it, which would date the job's end for every reader of the file.
    requested_at: datetime | None = None

    @property
    def artifact_key(self) -> str:
        return keys.artifact(self.release_id, self.fmt)

    @property
    def raw_key(self) -> str:
        return keys.raw(self.release_id, self.fmt)

    @property
    def report_key(self) -> str:
        return keys.report(self.release_id)

    @property
    def metadata_key(self) -> str:
        return keys.metadata(self.release_id)


def run_release(runtime: Runtime, release_id: str) -> None:
    """Embedded mode: run with bounded attempts and backoff, ending in a terminal state."""
    attempts = runtime.settings.task_max_attempts
    for attempt in range(1, attempts + 1):
        try:
            execute(runtime, release_id)
            return
        except Interrupted:
            return  # left queued: the next start resumes it (service.app)
        except TransientError as exc:
            log.warning("release %s attempt %d: %s", release_id, attempt, exc)
            if attempt == attempts:
                fail(runtime, release_id, f"gave up after {attempts} attempts: {exc}")
                return
            if _backoff(runtime, min(30.0, 2.0**attempt)):
                return  # shutting down: still unfinished, resumed at the next start


def _backoff(runtime: Runtime, seconds: float) -> bool:
    """Sleep ``seconds`` in short slices, ending early (True) once the process is shutting
    down, so a backoff does not hold a shutdown up."""
    for _ in range(math.ceil(seconds / BACKOFF_SLICE_S)):
        if runtime.stopping.is_set():
            return True
        time.sleep(BACKOFF_SLICE_S)
    return runtime.stopping.is_set()


def execute(runtime: Runtime, release_id: str) -> None:
    """One attempt. Raises TransientError when another attempt may succeed, Interrupted when
    the process is shutting down (the release is then queued again, this attempt uncounted);
    any other failure is recorded as terminal here."""
    if runtime.stopping.is_set():
        raise Interrupted("shutting down: not starting a job")
    _attempt(
        runtime, release_id, lambda: _start(runtime, release_id), lambda job: _produce(runtime, job)
    )


def finish_shards(runtime: Runtime, release_id: str, attempt: int, plan_key: str) -> None:
    """A sharded release's finaliser (``worker.shards``): with every part stored, assemble,
    publish and settle the release, within the attempt that planned the split (the release is
    left alone when it is no longer running in that attempt). Raises like ``execute``."""
    if runtime.stopping.is_set():
        raise Interrupted("shutting down: not finishing a job")
    _attempt(
        runtime,
        release_id,
        lambda: _resume(runtime, release_id, attempt),
        lambda job: _produce(runtime, job, plan_key),
    )


def run_shard(runtime: Runtime, release_id: str, attempt: int, index: int, plan_key: str) -> None:
    """Shard ``index`` of a sharded release (``worker.shards``), within ``attempt``: draw and
    store its part unless stored already, then, if every part is stored, hand the release to
    the finaliser. Raises like ``execute``, except that Interrupted leaves the shard for
    redelivery and the release running."""
    if runtime.stopping.is_set():
        raise Interrupted("shutting down: not starting a shard")
    _attempt(
        runtime,
        release_id,
        lambda: _resume(runtime, release_id, attempt),
        lambda job: _shard(runtime, job, index, plan_key),
        shard=index,
        attempt=attempt,
    )


def _attempt(
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
            _requeue(runtime, release_id, None if job is None else job.attempt)
        else:
            log.info("release %s: shard %d stopped for shutdown", release_id, shard)
        raise
    except Cancelled as exc:
        # Cancelled (or settled by another delivery, or handed over again by the sweeper)
        # while this attempt ran: the lifecycle recorded the outcome; this attempt stored
        # nothing of its own.
        log.info("release %s: %s; stopped", release_id, exc)
        _discard_parts(runtime, release_id)
    except RETRYABLE as exc:
        if job is not None and _superseded(runtime, job):
            # The sweeper handed the release over again: a later attempt owns it, and this
            # one's retry would only start yet another attempt beside it.
            log.info("release %s: attempt %d superseded; not retried", release_id, job.attempt)
            return
        if isinstance(exc, TransientError):
            raise
        raise TransientError(f"{type(exc).__name__}: {exc}") from exc
    except Exception as exc:
        where = "" if shard is None else f"shard {shard}: "
        log.exception("release %s %sfailed", release_id, where)
        fail(
            runtime,
            release_id,
            f"{where}{type(exc).__name__}: {exc}",
            attempt=attempt if job is None else job.attempt,
        )
        _discard_parts(runtime, release_id)


def _shard(runtime: Runtime, job: Job, index: int, plan_key: str) -> None:
    plan = shards.plan_named(job.mechanism, plan_key)
    store = runtime.store
    if store.exists(shards.part_key(job.release_id, plan, index)):
        log.info("release %s: shard %d already stored", job.release_id, index)
    else:
        limit = runtime.settings.task_max_attempts
        if shards.count_try(store, job.release_id, plan, index, limit) > limit:
            raise RuntimeError(f"gave up after {limit} tries of this shard")
        parsed = _parsed(runtime, job)
        done = plan.count - len(shards.missing(store, job.release_id, plan))
        _draw_shard(runtime, job, parsed, plan, index, done)
    if not shards.missing(store, job.release_id, plan):
        _enqueue(
            lambda d: d.enqueue_finish(job.release_id, job.attempt, plan.key, _queue(job)),
            runtime,
        )


def _discard_parts(runtime: Runtime, release_id: str) -> None:
    """A settled (or abandoned) sharded release's parts go (best effort; never served).
    Kept while the release is still running (another attempt uses them) or when its state
    cannot be read: the next settlement removes them."""
    try:
        with transaction(runtime.session_factory) as session:
            release = session.get(Release, release_id)
            running = release is not None and release.status == ReleaseStatus.running
    except Exception:
        log.warning("release %s: state unreadable; its shard parts are kept", release_id)
        return
    if not running:
        shards.discard(runtime.store, release_id)


def _queue(job: Job) -> Any:
    return registry.get(job.mechanism).execution.queue


def _enqueue(send: Callable[[shards.ShardDispatcher], None], runtime: Runtime) -> None:
    dispatcher = runtime.dispatcher
    if not isinstance(dispatcher, shards.ShardDispatcher):
        raise RuntimeError("this process's dispatcher cannot hand shards over")
    try:
        send(dispatcher)
    except Exception as exc:
        # The broker did not take it: another attempt (this task's retry) sends it again.
        raise TransientError(f"could not hand a shard task over: {exc}") from exc


def _resume(runtime: Runtime, release_id: str, attempt: int) -> Job | None:
    """The job of a release running in ``attempt`` (a shard or the finaliser of that
    attempt's split), or None when it is not (settled, or handed over to a later attempt)."""
    with transaction(runtime.session_factory) as session:
        release = session.get(Release, release_id)
        if release is None or release.status != ReleaseStatus.running:
            return None
        if release.attempts != attempt:
            return None
        return _job_of(session, release)


def _superseded(runtime: Runtime, job: Job) -> bool:
    """Whether the release is no longer this job's attempt (queued again by the sweeper, or
    started again by another delivery). False when that cannot be read (the database may be
    what failed): the usual retry then follows, bounded by the attempts."""
    try:
        with transaction(runtime.session_factory) as session:
            release = session.get(Release, job.release_id)
            return release is None or not (
                release.status == ReleaseStatus.running and release.attempts == job.attempt
            )
    except Exception:
        log.warning("release %s: could not read its state", job.release_id, exc_info=True)
        return False


def _start(runtime: Runtime, release_id: str) -> Job | None:
    with transaction(runtime.session_factory) as session:
        release = lifecycle.start(
            session,
            release_id,
            max_attempts=runtime.settings.task_max_attempts,
        )
        return None if release is None else _job_of(session, release)


def _job_of(session: Any, release: Release) -> Job:
    """What the job needs of the release and its datasets, read in the start's transaction."""
    # A research release's job leaves no log record for the operator (service.owner_only).
    owner_only.mark(release.research is not None)
    dataset = session.get(Dataset, release.dataset_id)
    budget = session.get(DatasetBudget, release.dataset_id)
    assert dataset is not None and budget is not None
    report_dataset = None
    if release.report_dataset_id is not None:
        test = session.get(Dataset, release.report_dataset_id)
        test_budget = session.get(DatasetBudget, release.report_dataset_id)
        # An erased held-out set gives no report (the report endpoint answers 410).
        if test is not None and test_budget is not None and test.deleted_at is None:
            report_dataset = (
                test.storage_key,
                test.sha256,
                test.filename,
                _metadata_of(test, test_budget),
            )
    return Job(
        release_id=release.id,
        dataset_id=dataset.id,
        mechanism=release.mechanism,
        params=dict(release.params),
        fmt=release.format,
        noise=release_noise.description(release, dataset),
        noise_sampler=release.noise_sampler,
        epsilon=release.epsilon,
        delta=release.delta,
        accountant=release.accountant,
        attempt=release.attempts,
        dataset_key=dataset.storage_key,
        dataset_sha256=dataset.sha256,
        dataset_filename=dataset.filename,
        metadata=_metadata_of(dataset, budget),
        report_dataset=report_dataset,
        declared=lifecycle.declared_artifacts(release),
        research=release.research,
        requested_at=release.created_at,
    )


def _metadata_of(dataset: Dataset, budget: DatasetBudget) -> DatasetMetadata:
    """The upload's metadata as the owner sent it: ``classes`` only if declared (the labels
    found in an undeclared file are private, and parsing finds them again)."""
    columns = declared_columns(dataset.feature_range)
    return DatasetMetadata(
        name=dataset.name,
        label_column=dataset.label_column,
        feature_range=None if columns is not None else _range_from_json(dataset.feature_range),
        columns=columns,
        classes=dataset.classes if dataset.classes_declared else None,
        budget=Budget(epsilon=budget.epsilon, delta=budget.delta),
    )


def _range_from_json(value: Any) -> Any:
    if isinstance(value, dict):
        return {name: (lo, hi) for name, (lo, hi) in value.items()}
    return (value[0], value[1])


@dataclass(frozen=True)
class ExtraFile:
    """A further file of the release, written into the job's scratch directory."""

    record: lifecycle.ArtifactRecord  # name, media type, description
    path: Path


@dataclass(frozen=True)
class Written:
    """What ``_write_release`` produced: the artifact's metadata and the further files."""

    meta: dict[str, Any]
    extras: tuple[ExtraFile, ...] = ()
    raw: Path | None = None  # the rows as drawn, when the release was post-processed


def _produce(runtime: Runtime, job: Job, plan_key: str | None = None) -> None:
    store = runtime.store
    if store.exists(job.artifact_key):
        # A previous attempt stored its output and died before recording it: finish from the
        # stored objects instead of drawing new noise (a second, different release).
        _finish_from_store(runtime, job)
        return
    if store.exists(job.raw_key) or any(
        store.exists(keys.extra_artifact(job.release_id, a.name)) for a in job.declared
    ):
        # Further files are stored before the artifact: another attempt is publishing now, or
        # died doing it. Drawing again would only be refused at the first file; retry later
        # (it finishes from the store), and bounded attempts end it failed, still charged.
        raise TransientError("another attempt stored part of this release's files")
    if job.metadata.classes is None:
        # Admission refuses these; a release queued before it did fails here, before the raw
        # data is read or anything drawn (refunded: nothing was claimed).
        raise ClassesUndeclared(
            "the dataset has no declared classes; a release would publish the labels found "
            "in the private data"
        )
    parsed = _parsed(runtime, job)
    plan: ShardPlan | None
    if plan_key is not None:
        plan = shards.plan_named(job.mechanism, plan_key)
    elif engines.runs_on_dask(runtime.settings, job.mechanism, job.params, parsed, job.noise):
        plan = None  # the Dask engine draws it (engines.choose), whole
    else:
        plan = shards.plan_for(runtime.settings, job.mechanism, job.params, len(parsed.classes))
    if plan is not None:
        todo = shards.missing(store, job.release_id, plan)
        if todo and isinstance(runtime.dispatcher, shards.ShardDispatcher):
            # Several workers draw the shards; the one that stores the last part hands the
            # release to the finaliser (``finish_shards``), in this same attempt.
            for index in todo:
                _enqueue(
                    lambda d, j=index: d.enqueue_shard(  # type: ignore[misc]
                        job.release_id, job.attempt, j, plan.key, _queue(job)
                    ),
                    runtime,
                )
            return
        for done, index in enumerate(todo):  # embedded mode: one after the other, here
            _draw_shard(runtime, job, parsed, plan, index, plan.count - len(todo) + done)
    device = _device(runtime.settings.device)
    # Removed however the job ends (its process killed: at the next start, worker.scratch).
    with scratch_dirs.job_dir(runtime.settings.scratch_dir) as scratch:
        path = scratch / f"release.{job.fmt}"
        written = _write_release(runtime, job, parsed, device, path, plan)
        meta = written.meta
        if not _claim_upload(runtime, job, [e.record for e in written.extras]):
            # The release was settled meanwhile (cancelled, or another delivery gave up and
            # refunded): publishing now would leave output with no charge. This noise is never
            # stored.
            log.warning("release %s is no longer running; not publishing", job.release_id)
            return
        # The provenance file (owner side, never served to analysts) adds the raw data's
        # hash: a deterministic function of the private data must not travel with the release.
        provenance = {**meta, "dataset_sha256": job.dataset_sha256}
        if not store.exists(job.metadata_key):
            with contextlib.suppress(ObjectExists):
                store.put(
                    job.metadata_key, json.dumps(provenance, indent=2, sort_keys=True).encode()
                )
        # Further files first: the artifact is stored last, so an artifact in the store means
        # the whole release is (what a redelivery relies on), and the first further file acts
        # as the lock between two attempts publishing at once.
        extras = [_put_extra(store, job, extra) for extra in written.extras]
        if written.raw is not None:
            _put_raw(store, job, written.raw)
        try:
            store.put_file(job.artifact_key, path)
            size, digest = path.stat().st_size, sha256_file(path)
        except ObjectExists:
            # Another attempt won the race (one with no further files: it could not have
            # stored ours); the stored object is the release.
            stored = store.get(job.artifact_key)
            size, digest = len(stored), sha256_hex(stored)
        if job.report_dataset is not None and not store.exists(job.report_key):
            report = _owner_report(runtime, job, path, meta)
            with contextlib.suppress(ObjectExists):
                store.put(job.report_key, json.dumps(report, indent=2).encode())
    _succeed(runtime, job, size=size, sha256=digest, artifacts=extras)
    if plan is not None:
        shards.discard(store, job.release_id)


def _parsed(runtime: Runtime, job: Job) -> ParsedDataset:
    """The dataset's content, parsed: the job's one read of the private data, recorded first
    (``lifecycle.mark_private_read``): from then on the release stays charged however it
    ends. Fetching the stored bytes and checking them against their recorded hash come before
    the mark: their failures (the store, its integrity) do not depend on the content, and
    leave the release refundable."""
    raw = runtime.store.get(job.dataset_key)
    if sha256_hex(raw) != job.dataset_sha256:
        raise RuntimeError("stored dataset does not match its recorded sha256")
    with transaction(runtime.session_factory) as session:
        reading = lifecycle.mark_private_read(session, job.release_id, attempt=job.attempt)
    if not reading:
        raise Cancelled(f"release {job.release_id} is no longer running; its data is not read")
    return parse_dataset(
        content=raw, filename=job.dataset_filename, metadata=job.metadata, max_bytes=len(raw)
    )


# The share of the progress bar a sharded release's shards fill; assembling fills the rest.
SHARDS_SHARE = 0.8


def _draw_shard(
    runtime: Runtime, job: Job, parsed: ParsedDataset, plan: ShardPlan, index: int, done: int
) -> None:
    """Draw shard ``index`` and store its part, create-only, after claiming the upload: a
    stored part is output, so from then on the release stays charged. ``done``: parts stored
    before this one (for the progress bar)."""

    def write(fraction: float, phase: str | None) -> bool:
        own = fraction / (1 - UPLOAD_SHARE)
        overall = SHARDS_SHARE * min(1.0, (done + own) / plan.count)
        return _report_progress(runtime, job.release_id, job.attempt, overall, phase)

    progress = Progress(write, release_id=job.release_id, stopping=runtime.stopping.is_set)

    def report(count: float, total: float, phase: str) -> None:
        progress.report(count, total, f"shard {index + 1} of {plan.count}: {phase}")

    width = len(parsed.feature_names) + len(parsed.classes)
    with scratch_dirs.job_dir(runtime.settings.scratch_dir) as scratch:
        _check_disk(runtime, scratch, plan.rows_of(index) * width * 4)
        drawn = shards.draw(
            job.mechanism,
            job.params,
            plan,
            index,
            parsed,
            noise=job.noise,
            noise_sampler=job.noise_sampler,
            device=_device(runtime.settings.device),
            path=scratch / f"part-{index:05d}.npz",
            report=report,
        )
        if not _claim_upload(runtime, job, None):  # the files already declared stay
            raise Cancelled(f"release {job.release_id} is no longer running; part not stored")
        shards.store_part(runtime.store, job.release_id, plan, index, drawn.path)


def _put_extra(store: ObjectStore, job: Job, extra: ExtraFile) -> lifecycle.ArtifactRecord:
    try:
        store.put_file(keys.extra_artifact(job.release_id, extra.record.name), extra.path)
    except ObjectExists as exc:
        # Another attempt is publishing its own draw (or died doing it): this draw must not be
        # mixed with it, nor replace it. Nothing more of it is stored; a later attempt finishes
        # from the store, or bounded attempts end the release failed, still charged.
        raise TransientError(
            f"another attempt stored {extra.record.name} first; not publishing this draw"
        ) from exc
    return replace(extra.record, bytes=extra.path.stat().st_size, sha256=sha256_file(extra.path))


def _put_raw(store: ObjectStore, job: Job, path: Path) -> None:
    """The owner's copy of the rows as drawn: stored before the artifact, create-only, like a
    further file (another attempt's copy there means another draw is being published)."""
    try:
        store.put_file(job.raw_key, path)
    except ObjectExists as exc:
        raise TransientError("another attempt stored its raw rows first; not publishing") from exc


def _finish_from_store(runtime: Runtime, job: Job) -> None:
    """Succeed with what an earlier attempt stored: the artifact and every further file its
    upload claim declared, hashed as stored."""
    store = runtime.store
    stored = store.get(job.artifact_key)
    extras = []
    for record in job.declared:
        key = keys.extra_artifact(job.release_id, record.name)
        if not store.exists(key):
            # The artifact is stored after every further file, so this one was lost: the
            # release cannot be completed (nor drawn again: its artifact exists). It fails,
            # charged, since its output exists.
            raise RuntimeError(f"the stored release lacks its declared file {record.name}")
        data = store.get(key)
        extras.append(replace(record, bytes=len(data), sha256=sha256_hex(data)))
    _succeed(runtime, job, size=len(stored), sha256=sha256_hex(stored), artifacts=extras)


def _owner_report(runtime: Runtime, job: Job, path: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """Utility of the release on the owner's held-out raw data. Not differentially private:
    stored for the owner alone, and it says so."""
    header = {
        "visibility": "owner only: computed on your held-out raw data, not differentially "
        "private; never shown to analysts or admins",
        "release_id": job.release_id,
    }
    assert job.report_dataset is not None
    key, sha, filename, test_meta = job.report_dataset
    try:
        raw = runtime.store.get(key)
        if sha256_hex(raw) != sha:
            raise RuntimeError("stored test dataset does not match its recorded sha256")
        test = parse_dataset(content=raw, filename=filename, metadata=test_meta, max_bytes=len(raw))
        release = evaluation.release_from_file(path, job.fmt, meta, {})
        labels = np.asarray(test.classes, dtype=object)[test.labels]
        report = evaluation.evaluate(release, test.X, labels, classifiers=("linear", "mlp"))
    except Exception as exc:  # a failed report never fails the release
        log.exception("release %s: owner report failed", job.release_id)
        return {**header, "error": f"{type(exc).__name__}: {exc}"}
    return {**header, **report}


def _device(choice: str) -> torch.device:
    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        return torch.device("cuda")
    return torch.device("cpu")


NOISE_SOURCES = {
    "secure": "secure: values rounded to a power-of-two lattice, exact rounded-Gaussian noise "
    "from the OS CSPRNG (docs/privacy.md, 'Hardened noise')",
    "fast": "fast: float Gaussian noise (Box-Muller) from the release's ChaCha20 stream keyed "
    "with 256 bits from the OS CSPRNG; NOT hardened against floating-point precision attacks",
}


def _write_release(
    runtime: Runtime,
    job: Job,
    parsed: ParsedDataset,
    device: torch.device,
    path: Path,
    plan: ShardPlan | None = None,
) -> Written:
    """Run the mechanism, stream its chunks into the artifact file and write its further
    files beside it; return the metadata and those files. Sharded (``plan``): the rows are
    the stored parts', and the mechanism is only built (for its description), with
    randomness that refuses every draw."""
    classes = published_classes(parsed)  # before anything is drawn
    # A fresh secret key per attempt, never stored: knowing it would reveal subsets and noise.
    generator, sampler = randomness(job.noise_sampler) if plan is None else sharding.sealed()
    # Sharded: the shards filled the bar's first SHARDS_SHARE; assembling fills the rest.
    start, share = (0.0, 1.0) if plan is None else (SHARDS_SHARE, 1 - SHARDS_SHARE)
    progress = Progress(
        lambda fraction, phase: _report_progress(
            runtime, job.release_id, job.attempt, start + share * fraction, phase
        ),
        release_id=job.release_id,
        stopping=runtime.stopping.is_set,
    )
    output = build(
        job.mechanism,
        job.params,
        parsed,
        noise=job.noise,
        sampler=sampler,
        generator=generator,
        device=device,
        report=progress.report,
    )
    parts: shards.Parts | None = None
    if plan is not None:
        # Sharded: the rows are the stored parts' (never the Dask engine's: a release the
        # engine runs is not split, _produce).
        if output.rows != plan.rows or output.artifacts or output.extra:
            raise RuntimeError("a sharded release must be rows alone, as many as its plan's")
        parts = shards.Parts(
            runtime.store, job.release_id, plan, len(output.feature_names), path.parent
        )
        engine = engines.Engine(replace(output, chunks=parts.chunks()), "local")
    else:
        # DPRELEASE_RELEASE_ENGINE=dask: the rows from the Dask job where the mechanism has one.
        engine = engines.choose(
            runtime.settings,
            job.mechanism,
            job.params,
            parsed,
            output,
            noise=job.noise,
            sampler=sampler,
            generator=generator,
            scratch=path.parent / "dask",
        )
    output = engine.output
    counts_rows = output.progress == "rows"
    if counts_rows:
        progress.report(0, output.rows, ROWS_PHASE)
    _check_artifacts(output.artifacts)
    post = output.postprocess
    _check_disk(
        runtime,
        path.parent,
        disk_need(output.rows, len(output.feature_names) + len(classes), job.fmt, post is not None),
    )
    meta = _release_metadata(job, parsed, device, output.preprocessing, output.artifacts)
    meta["engine"] = engine.name
    if plan is not None:
        meta["shards"] = shards.describe(plan)
    if output.extra:
        # Where each of the mechanism's public arrays travels (_format_companions).
        meta["arrays"] = {
            name: f"{name}.npy inside this NPZ" if job.fmt == "npz" else array_artifact(name)
            for name in output.extra
        }
    transform = output.transform
    if transform is not None:
        meta["transform"] = {
            **transform.to_metadata(),
            "description": TRANSFORM_HELP[transform.output],
        }
    # Only a release of records (or their means) in the dataset's own feature space has the
    # categorical blocks (random projection's features are projections, SGDRM's signed
    # combinations: nothing to decode there).
    same_space = list(output.feature_names) == list(parsed.feature_names) and (
        transform is None or transform.output == "raw"
    )
    blocks = parsed.categorical_blocks if same_space else ()

    def raw_units(x: np.ndarray) -> np.ndarray:
        # The public transform's inverse: post-processing of the release.
        return transform.to_raw(x) if transform is not None else x

    def decode(x: np.ndarray) -> np.ndarray:
        # Declared categorical columns: proportions, post-processing.
        x = raw_units(x)
        return category_proportions(x, blocks) if blocks else x

    # The table's columns: the dataset's names, the label as its kind allows.
    layout = release_layout(job, output.feature_names, classes)
    meta["layout"] = layout.describe()
    writer_args: dict[str, Any] = {"rows": output.rows, "extra": output.extra}
    done = 0
    # Post-processed: the drawn rows go to the owner's raw file and to a scratch copy the
    # post-processing reads twice (fit, transform); the release file is written from it.
    raw_path = path.parent / f"raw.{job.fmt}" if post is not None else None
    raw_meta = {
        **meta,
        "preprocessing": {**meta["preprocessing"], "postprocess": "none: the rows as drawn"},
        "raw": "the owner's copy of the rows as drawn, before the release's post-processing",
    }
    raw_layout = replace(layout, as_drawn=True)
    with (
        ArtifactWriter(
            job.fmt,
            raw_path or path,
            metadata=raw_meta if post else meta,
            layout=raw_layout if post else layout,
            **writer_args,
        ) as writer,
        _Scratch(path.parent, output.rows, enabled=post is not None) as scratch,
    ):
        for mixed_x, mixed_y in output.chunks:
            x, y = mixed_x.cpu().numpy(), mixed_y.cpu().numpy()
            # The owner's raw copy keeps the rows as drawn; the release decodes categories.
            writer.write(raw_units(x) if post is not None else decode(x), y)
            if post is not None:
                post.fit(x, y)
                scratch.write(x, y)
            done += mixed_x.shape[0]
            if counts_rows:
                progress.report(done, output.rows, ROWS_PHASE)
            else:
                progress.tick()  # the generator's own figures; a cancel is still noticed
        if post is not None:
            with ArtifactWriter(
                job.fmt, path, metadata=meta, layout=layout, **writer_args
            ) as processed:
                for x, y in scratch.chunks():
                    px, py = post.transform(x, y)
                    processed.write(decode(px), py)
                    progress.tick()
    extras = list(_format_companions(job.fmt, path.parent, meta, output.extra))
    for artifact in output.artifacts:
        # After the chunks: a generator's further files (trained weights) are complete then.
        extra_path = path.parent / "artifacts" / artifact.name
        extra_path.parent.mkdir(exist_ok=True)
        artifact.write(extra_path)
        if not extra_path.is_file():
            raise RuntimeError(f"the mechanism did not write its artifact {artifact.name}")
        record = lifecycle.ArtifactRecord(artifact.name, artifact.media_type, artifact.description)
        extras.append(ExtraFile(record, extra_path))
    if isinstance(sampler, SecureNoise):
        # Lattice and raised σ per noised vector: functions of public parameters only.
        meta = {**meta, "noise_lattices": sampler.describe()}
    elif parts is not None and parts.lattices:
        meta = {**meta, "noise_lattices": parts.lattices}
    return Written(meta, tuple(extras), raw_path)


def disk_need(rows: int, width: int, fmt: str, postprocessed: bool) -> int:
    """Bytes of disk a job writes for ``rows`` rows of ``width`` values: the release file (an
    NPZ twice over while it is written: its float32 memory maps, then the zip of them), and
    for a post-processed release also the owner's raw file and a float32 scratch copy."""
    one = rows * width * VALUE_BYTES[fmt] * (2 if fmt == "npz" else 1)
    if not postprocessed:
        return one
    return 2 * one + rows * width * 4


def _check_disk(runtime: Runtime, where: Path, need: int) -> None:
    """Fail before writing when the scratch disk cannot hold the job's files plus the margin
    (a full disk mid-job fails later, and starves every other job and tenant meanwhile)."""
    margin = runtime.settings.scratch_margin_bytes
    free = shutil.disk_usage(where).free
    if free < need + margin:
        raise InsufficientDisk(
            f"not enough free disk to write this release: it needs about {need} bytes (plus "
            f"a margin of {margin}) in the scratch space and {free} are free. Nothing was "
            "written or released; its charge stands all the same, as the job had read the "
            "private data (docs/privacy.md, 'Failures and cancellations'). Ask again once "
            "space is freed, or for fewer rows"
        )


class _Scratch:
    """A disk copy of the drawn rows (float32 memory maps), read back in chunks."""

    CHUNK = 8192

    def __init__(self, where: Path, rows: int, *, enabled: bool) -> None:
        self.enabled, self.rows, self.written = enabled, rows, 0
        self._dir = tempfile.TemporaryDirectory(dir=where, prefix=".post-") if enabled else None
        self._x: np.ndarray | None = None
        self._y: np.ndarray | None = None

    def write(self, X: np.ndarray, Y: np.ndarray) -> None:
        assert self._dir is not None
        if self._x is None or self._y is None:
            base = Path(self._dir.name)
            self._x = np.lib.format.open_memmap(
                base / "X.npy", mode="w+", dtype=np.float32, shape=(self.rows, X.shape[1])
            )
            self._y = np.lib.format.open_memmap(
                base / "y.npy", mode="w+", dtype=np.float32, shape=(self.rows, Y.shape[1])
            )
        self._x[self.written : self.written + len(X)] = X
        self._y[self.written : self.written + len(Y)] = Y
        self.written += len(X)

    def chunks(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        assert self._x is not None and self._y is not None
        for start in range(0, self.written, self.CHUNK):
            stop = start + self.CHUNK
            yield np.asarray(self._x[start:stop]), np.asarray(self._y[start:stop])

    def __enter__(self) -> _Scratch:
        return self

    def __exit__(self, *exc: object) -> None:
        self._x = self._y = None
        if self._dir is not None:
            self._dir.cleanup()


def release_layout(job: Job, feature_names: Sequence[str], classes: list[Any]) -> Layout:
    """The release table's columns: the features as the mechanism names them (the dataset's
    own, or a projection's), the label under the dataset's label column name (NPZ uploads
    have none: ``dpcore.release_layout.DEFAULT_LABEL``), as the mechanism's kind gives it."""
    kind = registry.get(job.mechanism).label_kind
    return Layout.of(feature_names, job.metadata.label_column, kind, classes)


def published_classes(parsed: ParsedDataset) -> list[Any]:
    """The class names a release file carries (its label columns and metadata): the owner's
    declared label set, never the labels found in the data."""
    if not parsed.classes_declared:
        raise ClassesUndeclared("label names come only from declared classes")
    return list(parsed.classes)


# What a table format cannot hold travels beside it as further artifacts: CSV has no place
# for metadata, and neither CSV nor Parquet for a mechanism's arrays (a projection matrix),
# which an NPZ carries inside. The names are reserved for that.
METADATA_ARTIFACT = "metadata.json"


def array_artifact(name: str) -> str:
    return f"{name}.npy"


def _format_companions(
    fmt: str, where: Path, meta: dict[str, Any], arrays: dict[str, np.ndarray]
) -> Iterator[ExtraFile]:
    """The further files a release in ``fmt`` needs to carry what an NPZ holds inside: the
    metadata (CSV) and the mechanism's public arrays (CSV, Parquet). The metadata is the very
    JSON embedded in NPZ and Parquet releases; the arrays are data-independent (drawn from the
    release's secure source or fixed), as ``ReleaseOutput.extra`` requires."""
    if fmt == "npz":
        return
    folder = where / "artifacts"
    folder.mkdir(exist_ok=True)
    if fmt == "csv":
        path = folder / METADATA_ARTIFACT
        path.write_text(json.dumps(meta, sort_keys=True))
        yield ExtraFile(
            lifecycle.ArtifactRecord(
                METADATA_ARTIFACT,
                "application/json",
                "The release's metadata (columns, preprocessing, mechanism, noise, charge): "
                "what NPZ and Parquet releases embed, beside a CSV release",
            ),
            path,
        )
    for name, array in arrays.items():
        path = folder / array_artifact(name)
        np.save(path, np.asarray(array), allow_pickle=False)
        yield ExtraFile(
            lifecycle.ArtifactRecord(
                array_artifact(name),
                "application/x-npy",
                f"The mechanism's public array {name!r} (an NPZ release holds it inside), "
                "needed to use the release",
            ),
            path,
        )


def _check_artifacts(artifacts: tuple[ExtraArtifact, ...]) -> None:
    """A mechanism's further files need distinct names that are safe object-key segments (a
    programming error of the mechanism otherwise: the release fails before any claim)."""
    names = [a.name for a in artifacts]
    reserved = [n for n in names if n == METADATA_ARTIFACT or n.endswith(".npy")]
    if reserved:  # the format companions' names
        raise ValueError(f"artifact names {reserved} are reserved")
    bad = [n for n in names if not keys.valid_artifact_name(n)]
    if bad or len(set(names)) != len(names):
        raise ValueError(f"the mechanism's artifact names are invalid or repeated: {names}")


class Progress:
    """A job's progress: the latest (done, total, phase) the job knows, written at most once
    every ``PROGRESS_EVERY_S`` (the first at once). Each write reads the release's status back
    (``lifecycle.report_progress``); once the release is no longer running (cancelled, or
    settled by another delivery) the next report raises ``Cancelled``, which stops the
    generator (its ``ctx.report``) or the runner's loop (between chunks) before any more noise
    is drawn or anything is stored.

    ``write(fraction, phase)`` returns whether the release is still running. Fractions keep
    ``UPLOAD_SHARE`` of the bar for storing the output."""

    def __init__(
        self,
        write: Callable[[float, str | None], bool],
        *,
        release_id: str,
        clock: Callable[[], float] = time.monotonic,
        stopping: Callable[[], bool] = lambda: False,
    ) -> None:
        self._write = write
        self._clock = clock
        self._stopping = stopping
        self._last: float | None = None
        self.release_id = release_id
        self.done, self.total = 0.0, 0.0
        self.phase: str | None = None

    @property
    def fraction(self) -> float:
        if not (self.total > 0 and math.isfinite(self.done / self.total)):
            return 0.0
        return (1 - UPLOAD_SHARE) * min(max(self.done / self.total, 0.0), 1.0)

    def report(self, done: float, total: float, phase: str) -> None:
        """``RunContext.report``: progress in the generator's own units."""
        self.done, self.total, self.phase = float(done), float(total), str(phase)
        self.tick()

    def tick(self) -> None:
        # Every chunk and every report, unthrottled: a shutdown stops the job here, between
        # chunks, before the upload claim (nothing of this attempt is stored).
        if self._stopping():
            raise Interrupted(f"release {self.release_id}: this process is shutting down")
        now = self._clock()
        if self._last is not None and now - self._last < PROGRESS_EVERY_S:
            return
        self._last = now
        if not self._write(self.fraction, self.phase):
            raise Cancelled(f"release {self.release_id} is no longer running")


def _requeue(runtime: Runtime, release_id: str, attempt: int | None) -> None:
    with transaction(runtime.session_factory) as session:
        lifecycle.requeue(session, release_id, reason="worker shutting down", attempt=attempt)


def _report_progress(
    runtime: Runtime, release_id: str, attempt: int, fraction: float, phase: str | None
) -> bool:
    # Fenced by the attempt: once the sweeper hands the release over again and a later attempt
    # starts, this one stops here (Cancelled) instead of computing beside it.
    with transaction(runtime.session_factory) as session:
        return lifecycle.report_progress(
            session, release_id, progress=fraction, phase=phase, attempt=attempt
        )


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for package in ("dprelease", "torch", "numpy", "dp-accounting", "scipy"):
        try:
            out[package] = importlib_metadata.version(package)
        except importlib_metadata.PackageNotFoundError:
            out[package] = "unknown"
    return out


def _release_metadata(
    job: Job,
    parsed: ParsedDataset,
    device: torch.device,
    preprocessing: dict[str, Any],
    artifacts: tuple[ExtraArtifact, ...] = (),
) -> dict[str, Any]:
    further = (
        {
            "artifacts": [
                {"name": a.name, "media_type": a.media_type, "description": a.description}
                for a in artifacts
            ]
        }
        if artifacts
        else {}
    )
    return {
        "release_id": job.release_id,
        "dataset_id": job.dataset_id,
        "mechanism": job.mechanism,
        "params": job.params,
        "noise": release_noise.from_description(job.noise, job.noise_sampler).model_dump(),
        "charge": {"epsilon": job.epsilon, "delta": job.delta},
        # First thing a reader of a research release's file must know: its ε is a claim only.
        **({"research": job.research} if job.research is not None else {}),
        "accountant": {
            "name": job.accountant,
            "method": registry.accountant(job.mechanism, job.accountant).summary,
            # Replace-one unless the parameters opt in to a narrower relation (DP-CDA's
            # declared class sizes): the ε above holds for this relation only.
            "neighbouring_relation": registry.get(job.mechanism).neighbours(job.params),
            "n": parsed.n_rows,
        },
        "preprocessing": preprocessing,
        "columns": registry.get(job.mechanism).guidance.output,
        "feature_shape": list(parsed.feature_shape),
        "feature_names": list(parsed.feature_names),
        # The owner's declared (public) bounds, so analysts can preprocess their own data alike.
        "feature_range": {"lo": parsed.lo.tolist(), "hi": parsed.hi.tolist()},
        "classes": published_classes(parsed),
        # The owner's declared (public) column schema, so a reader can decode the features.
        **(
            {
                "declared_columns": [c.model_dump(mode="json") for c in job.metadata.columns],
                "categorical_decoding": CATEGORY_DECODING,
            }
            if job.metadata.columns is not None
            else {}
        ),
        "noise_source": NOISE_SOURCES[job.noise_sampler],
        "sampling_source": "ChaCha20 keystream keyed with 256 bits from the OS CSPRNG "
        "(exact uniform subsets, exact Bernoulli rates)",
        "device": device.type,
        "versions": _versions(),
        "created_at": None if job.requested_at is None else job.requested_at.isoformat(),
        **further,
    }


def _claim_upload(
    runtime: Runtime, job: Job, artifacts: Sequence[lifecycle.ArtifactRecord] | None = ()
) -> bool:
    """Record that this attempt is about to store output; False if the release is settled."""
    with transaction(runtime.session_factory) as session:
        return lifecycle.claim_upload(
            session,
            job.release_id,
            artifact_key=job.artifact_key,
            artifacts=artifacts,
            attempt=job.attempt,
        )


def _succeed(
    runtime: Runtime,
    job: Job,
    *,
    size: int,
    sha256: str,
    artifacts: Sequence[lifecycle.ArtifactRecord] = (),
) -> None:
    with transaction(runtime.session_factory) as session:
        lifecycle.succeed(
            session,
            job.release_id,
            artifact_key=job.artifact_key,
            metadata_key=job.metadata_key,
            size=size,
            sha256=sha256,
            artifacts=artifacts,
        )


def fail(runtime: Runtime, release_id: str, error: str, *, attempt: int | None = None) -> None:
    """End the release failed; refunded or charged from its recorded marks (the private read,
    the upload claim), without a word to the object store (which may be why it failed).
    Given the job's ``attempt``, only while that attempt is the release's current one."""
    with transaction(runtime.session_factory) as session:
        lifecycle.fail(session, release_id, error, attempt=attempt)
