"""Publishing a written release: the upload claim, storing its files (further files first,
the artifact last), the owner's report, and the success that commits its ledger entry; or
finishing from what an earlier attempt stored."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from dpcore import evaluation
from service import owner_only
from service.datasets.parsing import UploadLimits
from service.datasets.service import upload_limits
from service.db import transaction
from service.releases import keys, lifecycle
from service.runtime import Runtime
from service.storage import ObjectExists, ObjectStore, sha256_hex
from worker.attempts import TransientError
from worker.job import Job
from worker.uploads import EarlyUploads
from worker.writing import ExtraFile, Written

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Stored:
    """What a published release's success records: the artifact's size and hash, and the
    further files with theirs."""

    size: int
    sha256: str
    artifacts: tuple[lifecycle.ArtifactRecord, ...] = ()


def publish(
    runtime: Runtime,
    job: Job,
    written: Written,
    path: Path,
    uploads: EarlyUploads | None = None,
) -> Stored | None:
    """Claim the upload and store the release written at ``path`` (with its provenance, its
    further files and the owner's report); None when the release was settled meanwhile and
    nothing was stored. ``uploads``: the files whose uploads began while they were written
    (``worker.uploads``): each is completed here, in the order below, and nowhere else; the
    caller aborts what is left when this returns or raises."""
    store = runtime.store
    uploads = uploads or EarlyUploads(None)
    meta = written.meta
    if not claim_upload(runtime, job, [e.record for e in written.extras]):
        # The release was settled meanwhile (cancelled, or another delivery gave up and
        # refunded): publishing now would leave output with no charge. This noise is never
        # stored.
        log.warning("release %s is no longer running; not publishing", job.release_id)
        return None
    # The provenance file (owner side, never served to analysts) adds the raw data's
    # hash: a deterministic function of the private data must not travel with the release.
    provenance = {**meta, "dataset_sha256": job.dataset_sha256}
    if not store.exists(job.metadata_key):
        with contextlib.suppress(ObjectExists):
            store.put(job.metadata_key, json.dumps(provenance, indent=2, sort_keys=True).encode())
    # Further files first: the artifact is stored last, so an artifact in the store means
    # the whole release is (what a redelivery relies on), and the first further file acts
    # as the lock between two attempts publishing at once.
    # The artifact's upload and the raw copy's may have sent parts while they were written;
    # they complete here, in this order: an artifact in the store still means the whole
    # release is.
    extras = tuple(_put_extra(store, uploads, job, extra) for extra in written.extras)
    if written.raw is not None:
        _put_raw(store, uploads, job, written.raw)
    try:
        uploaded = uploads.store_file(store, job.artifact_key, path)
        size, digest = uploaded.size, uploaded.sha256
    except ObjectExists:
        # Another attempt won the race (one with no further files: it could not have
        # stored ours); the stored object is the release.
        stored = store.get(job.artifact_key)
        size, digest = len(stored), sha256_hex(stored)
    if job.report_dataset is not None and not store.exists(job.report_key):
        report = owner_report(runtime, job, path, meta)
        with contextlib.suppress(ObjectExists):
            store.put(job.report_key, json.dumps(report, indent=2).encode())
    return Stored(size, digest, extras)


def _put_extra(
    store: ObjectStore, uploads: EarlyUploads, job: Job, extra: ExtraFile
) -> lifecycle.ArtifactRecord:
    key = keys.extra_artifact(job.release_id, extra.record.name)
    try:
        uploaded = uploads.store_file(store, key, extra.path)
    except ObjectExists as exc:
        # Another attempt is publishing its own draw (or died doing it): this draw must not be
        # mixed with it, nor replace it. Nothing more of it is stored; a later attempt finishes
        # from the store, or bounded attempts end the release failed, still charged.
        raise TransientError(
            f"another attempt stored {extra.record.name} first; not publishing this draw"
        ) from exc
    return replace(extra.record, bytes=uploaded.size, sha256=uploaded.sha256)


def _put_raw(store: ObjectStore, uploads: EarlyUploads, job: Job, path: Path) -> None:
    """The owner's copy of the rows as drawn: stored before the artifact, create-only, like a
    further file (another attempt's copy there means another draw is being published)."""
    try:
        uploads.store_file(store, job.raw_key, path)
    except ObjectExists as exc:
        raise TransientError("another attempt stored its raw rows first; not publishing") from exc


def finish_from_store(runtime: Runtime, job: Job) -> None:
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
    succeed(runtime, job, size=len(stored), sha256=sha256_hex(stored), artifacts=extras)


def owner_report(runtime: Runtime, job: Job, path: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """Utility of the release on the owner's held-out raw data. Not differentially private:
    stored for the owner alone, and it says so."""
    header = {
        "visibility": "owner only: computed on your held-out raw data, not differentially "
        "private; never shown to analysts or admins",
        "release_id": job.release_id,
    }
    assert job.report_dataset is not None
    key, sha, filename, test_meta, accepted = job.report_dataset
    try:
        # Mapped, as the job's own dataset is; an S3 object's copy goes beside the release
        # file, in the job's scratch directory.
        with runtime.store.open_mapped(key, scratch=path.parent) as raw:
            if sha256_hex(raw) != sha:
                raise RuntimeError("stored test dataset does not match its recorded sha256")
            limits = UploadLimits.stored(accepted, upload_limits(runtime.settings))
            test = limits.parse(content=raw, filename=filename, metadata=test_meta)
        release = evaluation.release_from_file(path, job.fmt, meta, {})
        labels = np.asarray(test.classes, dtype=object)[test.labels]
        report = evaluation.evaluate(release, test.X, labels, classifiers=("linear", "mlp"))
    except Exception as exc:  # a failed report never fails the release
        log.error("release %s: owner report failed: %s", job.release_id, owner_only.failure(exc))
        return {**header, "error": f"{type(exc).__name__}: {exc}"}
    return {**header, **report}


def claim_upload(
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


def succeed(
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
