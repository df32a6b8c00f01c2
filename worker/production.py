"""Producing a release within an attempt: reading the private data once, choosing the engine
before anything is built, drawing the shards of a split (here or on other workers), writing
the release and publishing it."""

from __future__ import annotations

import logging
from collections.abc import Callable

from dpcore.mechanisms.sharding import ShardPlan
from dpcore.mechanisms.spec import Cancelled
from service.datasets.parsing import ParsedDataset, UploadLimits
from service.datasets.service import upload_limits
from service.db import transaction
from service.errors import ClassesUndeclared
from service.releases import keys, lifecycle
from service.releases.mechanisms import route
from service.runtime import Route, Runtime
from service.storage import sha256_hex
from worker import engines, publishing, shards, staging, writing
from worker import progress as progress_of
from worker import scratch as scratch_dirs
from worker.attempts import TransientError
from worker.job import Job
from worker.progress import SHARDS_SHARE, UPLOAD_SHARE, Progress
from worker.uploads import EarlyUploads

log = logging.getLogger(__name__)


def produce(runtime: Runtime, job: Job, plan_key: str | None = None) -> None:
    """Produce the job's release: finish from the store when an earlier attempt stored it,
    else read the data, draw (whole, or the shards of a split: ``plan_key`` names the split
    whose parts are stored, for its finaliser), write and publish."""
    store = runtime.store
    if store.exists(job.artifact_key):
        # A previous attempt stored its output and died before recording it: finish from the
        # stored objects instead of drawing new noise (a second, different release).
        publishing.finish_from_store(runtime, job)
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
    parsed = read_private(runtime, job)
    choice = engines.choose(
        runtime.settings, job.mechanism, job.params, parsed, job.noise, plan_key=plan_key
    )
    plan = choice.plan
    if plan is not None:
        todo = shards.missing(store, job.release_id, plan)
        if todo and isinstance(runtime.dispatcher, shards.ShardDispatcher):
            # Several workers draw the shards; the one that stores the last part hands the
            # release to the finaliser (``finish_shards``), in this same attempt.
            for index in todo:
                _enqueue(
                    lambda d, j=index: d.enqueue_shard(  # type: ignore[misc]
                        job.release_id, job.attempt, j, plan.key, _route(runtime, job)
                    ),
                    runtime,
                )
            return
        for done, index in enumerate(todo):  # embedded mode: one after the other, here
            draw_shard(runtime, job, parsed, plan, index, plan.count - len(todo) + done)
    device = writing.device_of(runtime.settings.device)
    # Removed however the job ends (its process killed: at the next start, worker.scratch).
    # The artifact and the raw copy start going up while they are written; what publishing
    # did not complete is aborted on the way out, before the scratch files go.
    with (
        scratch_dirs.job_dir(runtime.settings.scratch_dir) as scratch,
        EarlyUploads(store) as uploads,
    ):
        path = scratch / f"release.{job.fmt}"
        written = writing.write_release(runtime, job, parsed, device, path, choice, uploads)
        stored = publishing.publish(runtime, job, written, path, uploads)
    if stored is None:
        return
    publishing.succeed(
        runtime, job, size=stored.size, sha256=stored.sha256, artifacts=stored.artifacts
    )
    if plan is not None:
        shards.discard(store, job.release_id)
    if choice.job is not None:  # what an earlier attempt of this Dask release staged, if any
        staging.discard(store, job.release_id)


def read_private(runtime: Runtime, job: Job) -> ParsedDataset:
    """The dataset's content, parsed: the job's one read of the private data, recorded first
    (``lifecycle.mark_private_read``): from then on the release stays charged however it
    ends. Fetching the stored bytes and checking them against their recorded hash come before
    the mark: their failures (the store, its integrity) do not depend on the content, and
    leave the release refundable."""
    # The stored file mapped, never one bytes object of it: an S3 object is streamed into a
    # private file in this job's scratch directory first, both removed however this ends.
    with (
        scratch_dirs.job_dir(runtime.settings.scratch_dir) as scratch,
        runtime.store.open_mapped(job.dataset_key, scratch=scratch) as raw,
    ):
        if sha256_hex(raw) != job.dataset_sha256:
            raise RuntimeError("stored dataset does not match its recorded sha256")
        with transaction(runtime.session_factory) as session:
            reading = lifecycle.mark_private_read(session, job.release_id, attempt=job.attempt)
        if not reading:
            raise Cancelled(f"release {job.release_id} is no longer running; its data is not read")
        # Under the caps the upload was accepted under, not the file's size: a compressed NPZ
        # or a dictionary-encoded Parquet file holds more values than bytes, and was admitted.
        limits = UploadLimits.stored(job.dataset_limits, upload_limits(runtime.settings))
        return limits.parse(content=raw, filename=job.dataset_filename, metadata=job.metadata)


def shard(runtime: Runtime, job: Job, index: int, plan_key: str) -> None:
    """Shard ``index`` of the split ``plan_key``: draw and store its part unless stored
    already, then, if every part is stored, hand the release to the finaliser."""
    plan = shards.plan_named(job.mechanism, plan_key)
    store = runtime.store
    if store.exists(shards.part_key(job.release_id, plan, index)):
        log.info("release %s: shard %d already stored", job.release_id, index)
    else:
        limit = runtime.settings.task_max_attempts
        if shards.count_try(store, job.release_id, plan, index, limit) > limit:
            raise RuntimeError(f"gave up after {limit} tries of this shard")
        parsed = read_private(runtime, job)
        done = plan.count - len(shards.missing(store, job.release_id, plan))
        draw_shard(runtime, job, parsed, plan, index, done)
    if not shards.missing(store, job.release_id, plan):
        _enqueue(
            lambda d: d.enqueue_finish(job.release_id, job.attempt, plan.key, _route(runtime, job)),
            runtime,
        )


def draw_shard(
    runtime: Runtime, job: Job, parsed: ParsedDataset, plan: ShardPlan, index: int, done: int
) -> None:
    """Draw shard ``index`` and store its part, create-only, after claiming the upload: a
    stored part is output, so from then on the release stays charged. ``done``: parts stored
    before this one (for the progress bar)."""

    def write(fraction: float, phase: str | None) -> bool:
        own = fraction / (1 - UPLOAD_SHARE)
        overall = SHARDS_SHARE * min(1.0, (done + own) / plan.count)
        return progress_of.report(runtime, job.release_id, job.attempt, overall, phase)

    progress = Progress(write, release_id=job.release_id, stopping=runtime.stopping.is_set)

    def report(count: float, total: float, phase: str) -> None:
        progress.report(count, total, f"shard {index + 1} of {plan.count}: {phase}")

    width = len(parsed.feature_names) + len(parsed.classes)
    with scratch_dirs.job_dir(runtime.settings.scratch_dir) as scratch:
        writing.check_disk(runtime, scratch, plan.rows_of(index) * width * 4)
        drawn = shards.draw(
            job.mechanism,
            job.params,
            plan,
            index,
            parsed,
            noise=job.noise,
            noise_sampler=job.noise_sampler,
            device=writing.device_of(runtime.settings.device),
            path=scratch / f"part-{index:05d}.npz",
            report=report,
        )
        if not publishing.claim_upload(runtime, job, None):  # the files already declared stay
            raise Cancelled(f"release {job.release_id} is no longer running; part not stored")
        shards.store_part(runtime.store, job.release_id, plan, index, drawn.path)


def _route(runtime: Runtime, job: Job) -> Route:
    """The release's own pool and lane: its shards and finaliser wait where it did."""
    return route(job.mechanism, job.work, runtime.settings)


def _enqueue(send: Callable[[shards.ShardDispatcher], None], runtime: Runtime) -> None:
    dispatcher = runtime.dispatcher
    if not isinstance(dispatcher, shards.ShardDispatcher):
        raise RuntimeError("this process's dispatcher cannot hand shards over")
    try:
        send(dispatcher)
    except Exception as exc:
        # The broker did not take it: another attempt (this task's retry) sends it again.
        raise TransientError(f"could not hand a shard task over: {exc}") from exc
