"""The life of a release after admission: a job starts it, reports progress, claims the
upload of its output, and ends it succeeded or failed; its owner may cancel it meanwhile.

Every transition locks the release row first (``repository.get_for_update``) and decides on
what it reads under that lock, so the attempts of a job (a redelivery may run beside a worker
presumed dead, and a cancel request arrives at any moment) see one order of events. Each
function works in its caller's unit of work and never commits: the task wrapper
(``worker.runner``, one transaction per call) or the request boundary (cancel) does.

Settlement (docs/privacy.md, "Failures and cancellations"): a release that ends without
succeeding (failed, cancelled, abandoned) stays charged when an attempt claimed the upload of
its output (output may exist) or when a job had begun reading its dataset's content
(``mark_private_read``: from then on whether it fails, and when, may depend on the private
data, so a refund would release that fact uncharged); it is refunded only when it ended before
any read. It is decided from the recorded marks alone, never by asking the object store: the
claim and the read mark are each recorded under the row lock before what they announce
happens, so no mark means it did not happen, and a settlement must not depend on a store that
may be the very thing that is down (an attempt that failed because S3 was unreachable must
still end).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from service.audit_trail import service as audit
from service.budgets import service as budget_service
from service.errors import NotFound, ReleaseFinished
from service.meta import metrics
from service.models import Dataset, Release, utcnow
from service.releases import repository
from service.releases.status import TERMINAL, ReleaseStatus

log = logging.getLogger(__name__)

# Error texts are for people; stored truncated.
MAX_ERROR_CHARS = 2000
MAX_PHASE_CHARS = 64  # releases.phase


def start(session: Session, release_id: str, *, max_attempts: int) -> Release | None:
    """Mark the release running for one more attempt and return it; None when there is
    nothing to run (unknown, already ended, out of attempts, or its dataset erased; the last
    two end it failed here)."""
    release = repository.get_for_update(session, release_id)
    if release is None:
        log.error("release %s does not exist", release_id)
        return None
    if release.status in TERMINAL:
        return None
    if release.attempts >= max_attempts:
        _fail(session, release, f"gave up after {release.attempts} attempts")
        return None
    dataset = session.get(Dataset, release.dataset_id)
    if dataset is None or dataset.deleted_at is not None:
        # Deletion waits for queued releases, so only a job started by hand gets here; its raw
        # data is gone, and nothing was produced: fail (refunded, unless an earlier attempt
        # had begun reading the data: _settle_unfinished).
        _fail(session, release, "the dataset was deleted before this release ran")
        return None
    release.status = ReleaseStatus.running
    release.attempts += 1
    release.started_at = release.started_at or utcnow()
    release.touched_at = utcnow()
    _audit(session, release, "release.running", attempt=release.attempts)
    return release


def current(session: Session, release_id: str, attempt: int | None = None) -> Release | None:
    """The release while it is running and (given a job's ``attempt``) still in that attempt;
    None once it is settled or handed over to a later attempt, which a job of this one must
    leave alone. A read without the row lock: every transition checks again under it."""
    release = repository.get(session, release_id)
    if release is None or release.status != ReleaseStatus.running:
        return None
    if attempt is not None and release.attempts != attempt:
        return None
    return release


def requeue(session: Session, release_id: str, *, reason: str, attempt: int | None = None) -> bool:
    """Put a running release back in the queue, its attempt not counted: its job stopped
    before claiming the upload because its process is shutting down (``worker.runner``), so
    nothing of this attempt was stored and its draw is discarded; the reservation stays, and
    the next delivery runs it as if this attempt had not started. False when it is not
    running (settled meanwhile: nothing to put back), or (given the job's ``attempt``) when it
    is no longer this job's attempt: a later one runs it, which this job must not disturb."""
    release = repository.get_for_update(session, release_id)
    if release is None or release.status != ReleaseStatus.running:
        return False
    if attempt is not None and release.attempts != attempt:
        return False
    release.attempts = max(0, release.attempts - 1)
    release.started_at = None
    _back_to_queue(session, release, reason=reason)
    return True


def _back_to_queue(session: Session, release: Release, *, reason: str) -> None:
    """A running release queued again, its reservation and any upload claim kept. Touched
    now: the outbox sweeper re-sends it if no delivery picks it up."""
    release.status = ReleaseStatus.queued
    release.progress = 0.0
    release.phase = None
    release.touched_at = utcnow()
    _audit(session, release, "release.requeued", reason=reason, attempts=release.attempts)


def report_progress(
    session: Session,
    release_id: str,
    *,
    progress: float,
    phase: str | None,
    attempt: int | None = None,
) -> bool:
    """Record a running job's progress (a fraction, clamped to [0, 1]) and what it is doing.
    False when the release is no longer running (cancelled, settled by another delivery, or
    handed over again by the sweeper) or, given the job's ``attempt``, when a later attempt
    has started: the job should stop, so that one attempt at a time computes."""
    value = round(min(max(progress, 0.0), 1.0), 4) if math.isfinite(progress) else 0.0
    return repository.set_progress(
        session,
        release_id=release_id,
        progress=value,
        phase=None if phase is None else phase[:MAX_PHASE_CHARS],
        attempt=attempt,
    )


@dataclass(frozen=True)
class ArtifactRecord:
    """A further file of a release, as ``releases.artifacts`` holds it: declared by the upload
    claim, with its size and hash once the release succeeded."""

    name: str
    media_type: str
    description: str
    bytes: int | None = None
    sha256: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> ArtifactRecord:
        return cls(**value)


def declared_artifacts(release: Release) -> tuple[ArtifactRecord, ...]:
    return tuple(ArtifactRecord.from_json(a) for a in release.artifacts or ())


def mark_private_read(session: Session, release_id: str, *, attempt: int | None = None) -> bool:
    """Record, before a job first reads the dataset's content, that its reading begins: from
    then on the release is never refunded (``_settle_unfinished``). Set once and never
    cleared; a later attempt (a retry, a redelivery) finds it set and leaves it. False (and
    nothing read) when the release is no longer running or, given the job's ``attempt``,
    when a later attempt has started: the job must stop before reading."""
    release = repository.get_for_update(session, release_id)
    if release is None or release.status != ReleaseStatus.running:
        return False
    if attempt is not None and release.attempts != attempt:
        return False
    if release.private_read_at is None:
        release.private_read_at = utcnow()
    return True


def claim_upload(
    session: Session,
    release_id: str,
    *,
    artifact_key: str,
    artifacts: Sequence[ArtifactRecord] | None = (),
    attempt: int | None = None,
) -> bool:
    """Record, before its first byte is stored, that an attempt is about to store output (the
    artifact, and the further ``artifacts`` it declares; None: leave the declared ones as they
    are, as a sharded release's part does): from now on the release stays charged. False
    when the release is no longer running (cancelled, settled by another delivery, handed
    over again by the sweeper) or, given the job's ``attempt``, when a later attempt has
    started: the attempt must then store nothing, or output would exist with no charge, or
    two draws would race to be published."""
    release = repository.get_for_update(session, release_id)
    if release is None or release.status != ReleaseStatus.running:
        return False
    if attempt is not None and release.attempts != attempt:
        return False
    release.artifact_key = artifact_key
    # A later attempt (a redelivery) finds here which further files to expect in the store.
    if artifacts is not None:
        release.artifacts = [a.to_json() for a in artifacts] or None
    return True


def succeed(
    session: Session,
    release_id: str,
    *,
    artifact_key: str,
    metadata_key: str,
    size: int,
    sha256: str,
    artifacts: Sequence[ArtifactRecord] = (),
) -> bool:
    """Mark the release succeeded (with its artifact and further files, each stored, sized
    and hashed) and commit its charge, in one unit of work; False (and no change) when it
    already ended."""
    if any(a.bytes is None or a.sha256 is None for a in artifacts):
        raise ValueError("a succeeded release's artifacts all have a size and a hash")
    release = repository.get_for_update(session, release_id)
    if release is None or release.status in TERMINAL:
        return False
    release.status = ReleaseStatus.succeeded
    release.progress = 1.0
    release.error = None
    release.finished_at = utcnow()
    release.artifact_key = artifact_key
    release.metadata_key = metadata_key
    release.artifact_bytes = size
    release.artifact_sha256 = sha256
    release.artifacts = [a.to_json() for a in artifacts] or None
    entry = budget_service.settle(session, release_id=release.id, because=budget_service.SUCCEEDED)
    _job_ended(release)
    detail: dict[str, Any] = {"artifacts": [a.name for a in artifacts]} if artifacts else {}
    _audit(
        session,
        release,
        "release.succeeded",
        attempts=release.attempts,
        artifact_bytes=size,
        ledger=entry.state,
        **detail,
    )
    return True


def fail(session: Session, release_id: str, error: str, *, attempt: int | None = None) -> bool:
    """End the release failed and settle its charge from its recorded marks; False (and no
    change) when it already ended, or (given the failing job's ``attempt``) when it is no
    longer running that attempt: the sweeper handed it over again, and a stale attempt's
    error must not end the release a later attempt is running (or is queued to run)."""
    release = repository.get_for_update(session, release_id)
    if release is None or release.status in TERMINAL:
        return False
    if attempt is not None and (
        release.status != ReleaseStatus.running or release.attempts != attempt
    ):
        return False
    _fail(session, release, error)
    _job_ended(release)
    return True


def _job_ended(release: Release) -> None:
    # Timed by the process that ran the job (the sweeper's settlements are not jobs' ends).
    # A research release's run time is its owner's alone (docs/privacy.md, "Research releases").
    if release.research is not None:
        return
    if release.started_at is not None and release.finished_at is not None:
        seconds = (release.finished_at - release.started_at).total_seconds()
        metrics.job_ended(release.mechanism, release.status.value, seconds)


def _fail(session: Session, release: Release, error: str) -> None:
    release.status = ReleaseStatus.failed
    release.error = error[:MAX_ERROR_CHARS]
    release.finished_at = utcnow()
    state, because = _settle_unfinished(session, release)
    # The error text stays out: it may quote the raw data.
    _audit(
        session,
        release,
        "release.failed",
        attempts=release.attempts,
        ledger=state,
        **({"settled_because": because} if because else {}),
    )


def settle_stalled(
    session: Session, release_id: str, *, max_attempts: int, stale_before: datetime
) -> bool:
    """End failed a release left running on its last attempt with no sign of life (start,
    progress) since ``stale_before``: the job that ran it died, or could not record its end
    (``service.releases.sweeper``). Settled from its recorded marks like any failure. Checked
    again under the row lock; False when it no longer qualifies. Should the job still be
    alive after all, it finds the release settled: it stores nothing if it had not claimed
    the upload yet, and cannot mark it succeeded if it had (the charge then stays)."""
    release = repository.get_for_update(session, release_id)
    if (
        release is None
        or release.status != ReleaseStatus.running
        or release.attempts < max_attempts
        or (release.touched_at or release.started_at or release.created_at) >= stale_before
    ):
        return False
    _fail(
        session,
        release,
        f"abandoned: still running after its last attempt ({release.attempts} of "
        f"{max_attempts}) with no progress since {stale_before.isoformat()}",
    )
    return True


def requeue_stalled(
    session: Session, release_id: str, *, max_attempts: int, stale_before: datetime
) -> bool:
    """Put back in the queue a release left running with attempts left and no sign of life
    (start, progress) since ``stale_before``: its attempt failed and the retry's message was
    lost, or its job died and no redelivery came (``service.releases.sweeper``, which then
    hands it over again). Checked again under the row lock; False when it no longer qualifies.

    The attempt stays counted (attempts stay bounded: a release whose every retry is lost
    reaches its last attempt, which ``settle_stalled`` ends). Nothing is settled: the
    reservation stays, and an upload claim stays recorded (the release stays charged whatever
    follows, and the next attempt finishes from what is stored). Should the old job still be
    alive, it stops at its next progress write or upload claim, which find the release queued
    or on a later attempt; so at most one attempt stores output."""
    release = repository.get_for_update(session, release_id)
    if (
        release is None
        or release.status != ReleaseStatus.running
        or release.attempts >= max_attempts
        or (release.touched_at or release.started_at or release.created_at) >= stale_before
    ):
        return False
    # The sweeper sends it next; due again for the outbox if that is lost.
    _back_to_queue(session, release, reason=f"no sign of life since {stale_before.isoformat()}")
    return True


def cancel(session: Session, release_id: str, *, actor: str) -> Release:
    """Cancel a queued or running release; a cancelled one is returned as it is.

    Nothing of a cancelled release is ever served. Its charge is refunded unless a job of it
    had begun reading the dataset's content or an attempt claimed the upload (committed: the
    job's course, and so the moment of the cancel, may depend on the private data, and output
    may exist). A job running for it notices at its next progress write and stops; one that
    already drew its noise finds the release settled when it tries to claim the upload, and
    stores nothing; one that claimed before the cancel may finish storing, but cannot mark
    the release succeeded.
    Raises ``ReleaseFinished`` (409) for a release that succeeded or failed."""
    release = repository.get_for_update(session, release_id)
    if release is None:
        raise NotFound(f"release {release_id} not found")
    if release.status == ReleaseStatus.cancelled:
        return release
    if release.status in TERMINAL:
        raise ReleaseFinished(
            f"release {release_id} already {release.status}: only a queued or running release "
            f"can be cancelled",
            detail={"status": str(release.status)},
        )
    was = release.status
    release.status = ReleaseStatus.cancelled
    release.finished_at = utcnow()
    state, because = _settle_unfinished(session, release)
    if release.research is not None:
        return release  # no audit event: see ``_audit``
    detail: dict[str, Any] = {"dataset_id": release.dataset_id, "was": str(was), "ledger": state}
    if because:
        detail["settled_because"] = because
    audit.record(
        session,
        actor=actor,
        action="release.cancelled",
        object_type="release",
        object_id=release.id,
        detail=detail,
    )
    return release


def output_may_exist(release: Release) -> bool:
    """Whether output of the release may have been stored (and so may be read): an attempt
    claimed its upload (it may be storing now, or have stored it). Read from the row only:
    every attempt records its claim before it stores anything."""
    return release.artifact_key is not None


def private_data_read(release: Release) -> bool:
    """Whether a job of the release had begun reading its dataset's content (``mark_private_
    read``): every job records it under the row lock before its first read."""
    return release.private_read_at is not None


def unfinished_settlement(release: Release) -> str:
    """Why a release that ends now without succeeding is charged or refunded (a
    ``budget_service.SETTLED_BECAUSE`` rule): committed when output may exist, or when a job
    had begun reading the private data (the failure, or the moment of a cancel, may depend on
    it); refunded only when it ends before any read (nothing of the data escaped)."""
    if output_may_exist(release):
        return budget_service.UPLOAD_CLAIMED
    if private_data_read(release):
        return budget_service.PRIVATE_DATA_READ
    return budget_service.BEFORE_PRIVATE_READ


def _settle_unfinished(session: Session, release: Release) -> tuple[str, str | None]:
    """Settle the charge of a release that ends without succeeding (``unfinished_
    settlement``). Returns the entry's state and the rule that settled it (a research
    release's entry stays ``research``, with no rule: it holds nothing to settle)."""
    if release.research is not None:
        return budget_service.RESEARCH, None
    entry = budget_service.settle(
        session, release_id=release.id, because=unfinished_settlement(release)
    )
    return entry.state, entry.settled_because


def _audit(session: Session, release: Release, action: str, **detail: Any) -> None:
    # The audit trail is read by admins: a research release leaves no event in it (its own
    # row, which its owner reads, holds its state and times).
    if release.research is not None:
        return
    audit.record(
        session,
        actor=audit.WORKER,
        action=action,
        object_type="release",
        object_id=release.id,
        detail={"dataset_id": release.dataset_id, **detail},
    )
