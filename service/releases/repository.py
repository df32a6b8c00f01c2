from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import ColumnElement, Text, cast, func, or_, select, update
from sqlalchemy.orm import Session, selectinload

from service.models import Release, utcnow
from service.releases.status import UNFINISHED, ReleaseStatus


class Pending(NamedTuple):
    """A release whose job is to be handed over: what routes it (its mechanism's pool, its
    declared work's lane: ``service.releases.mechanisms.route``)."""

    id: str
    mechanism: str
    work: float | None


def _pending(rows: Any) -> list[Pending]:
    return [Pending(r.id, r.mechanism, r.work) for r in rows]


def add(session: Session, release: Release) -> Release:
    session.add(release)
    session.flush()
    return release


def get(session: Session, release_id: str) -> Release | None:
    """The release row, unlocked: a read that decides nothing by itself."""
    return session.get(Release, release_id)


def requested_by(session: Session, release_id: str) -> str:
    """Who requested the release ("" when it is unknown)."""
    return session.scalar(select(Release.requested_by).where(Release.id == release_id)) or ""


def ordinary() -> ColumnElement[bool]:
    """Releases that are not research releases: ``research`` SQL NULL, or the JSON null an ORM
    write of None stores."""
    return or_(Release.research.is_(None), cast(Release.research, Text) == "null")


def research_ids(session: Session, release_ids: Sequence[str]) -> set[str]:
    """Which of ``release_ids`` are research releases (owner-only: ``service.owner_only``)."""
    if not release_ids:
        return set()
    stmt = select(Release.id).where(Release.id.in_(set(release_ids)), ~ordinary())
    return set(session.scalars(stmt))


def list_for(session: Session, *, dataset_ids: list[str] | None) -> list[Release]:
    # Each listed release shows its ledger entry's charge: one query for all, not one each.
    stmt = (
        select(Release)
        .options(selectinload(Release.ledger_entry))
        .order_by(Release.created_at, Release.id)
    )
    if dataset_ids is not None:
        stmt = stmt.where(Release.dataset_id.in_(dataset_ids))
    return list(session.scalars(stmt))


def unfinished(session: Session) -> list[Pending]:
    """Every queued or running release, oldest first."""
    stmt = select(Release.id, Release.mechanism, Release.work).where(Release.status.in_(UNFINISHED))
    return _pending(session.execute(stmt.order_by(Release.created_at)))


def pending_using(session: Session, *, dataset_id: str) -> list[str]:
    """Queued or running releases that will read the dataset's raw data: its own, and those
    using it as the held-out set of a report."""
    stmt = select(Release.id).where(
        Release.status.in_(UNFINISHED),
        or_(Release.dataset_id == dataset_id, Release.report_dataset_id == dataset_id),
    )
    return list(session.scalars(stmt.order_by(Release.created_at, Release.id)))


def reporting_on(session: Session, *, dataset_id: str) -> list[str]:
    """Releases whose owner report was computed on this dataset's raw data."""
    stmt = select(Release.id).where(Release.report_dataset_id == dataset_id)
    return list(session.scalars(stmt.order_by(Release.created_at, Release.id)))


def get_for_update(session: Session, release_id: str) -> Release | None:
    """The release row, locked until the transaction ends: the one way to lock a release, and
    every change of its status goes through it (``service.releases.lifecycle``).

    ``SELECT … FOR UPDATE`` on Postgres; SQLite has no row locks, but its transactions hold the
    write lock from ``BEGIN IMMEDIATE`` (``service.db``). ``populate_existing``: an instance this
    session loaded before taking the lock (the cancel endpoint's access check) is overwritten
    with the row as committed now, not kept as it was read."""
    stmt = (
        select(Release)
        .where(Release.id == release_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    )
    return session.scalars(stmt).first()


def set_progress(
    session: Session,
    *,
    release_id: str,
    progress: float,
    phase: str | None,
    attempt: int | None = None,
) -> bool:
    """Write a running release's progress; False (nothing written) when it is not running,
    or (given ``attempt``) when a later attempt has started since. One conditional UPDATE: the
    status is read and the row written atomically, without a read-then-write window in which a
    cancel or another delivery could settle it."""
    conditions = [Release.id == release_id, Release.status == ReleaseStatus.running]
    if attempt is not None:
        conditions.append(Release.attempts == attempt)
    stmt = (
        update(Release)
        .where(*conditions)
        .values(progress=progress, phase=phase, touched_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    return session.execute(stmt).rowcount == 1  # type: ignore[attr-defined]


def _last_sign_of_life() -> ColumnElement[Any]:
    return func.coalesce(Release.touched_at, Release.started_at, Release.created_at)


def stale_queued(session: Session, *, before: datetime, limit: int) -> list[Pending]:
    """The queued releases last handed over (or created) before ``before``, oldest first, at
    most ``limit``."""
    stmt = (
        select(Release.id, Release.mechanism, Release.work)
        .where(Release.status == ReleaseStatus.queued, _last_sign_of_life() < before)
        .order_by(Release.created_at, Release.id)
        .limit(limit)
    )
    return _pending(session.execute(stmt))


def queued_mechanisms(session: Session, release_ids: Sequence[str]) -> list[Pending]:
    """Those of ``release_ids`` that are queued, in the order given."""
    if not release_ids:
        return []
    stmt = select(Release.id, Release.mechanism, Release.work).where(
        Release.id.in_(release_ids), Release.status == ReleaseStatus.queued
    )
    found = {p.id: p for p in _pending(session.execute(stmt))}
    return [found[i] for i in release_ids if i in found]


def touch_queued(session: Session, *, release_id: str, at: datetime) -> bool:
    """Record that a queued release is handed over again now; False when it is no longer
    queued (started or settled meanwhile: nothing to send)."""
    stmt = (
        update(Release)
        .where(Release.id == release_id, Release.status == ReleaseStatus.queued)
        .values(touched_at=at)
        .execution_options(synchronize_session=False)
    )
    return session.execute(stmt).rowcount == 1  # type: ignore[attr-defined]


def stale_running(
    session: Session,
    *,
    before: datetime,
    limit: int,
    min_attempts: int | None = None,
    below_attempts: int | None = None,
) -> list[str]:
    """Ids of releases running on attempt ``min_attempts`` or later (or, with
    ``below_attempts``, on an earlier attempt than that) with no sign of life since
    ``before``, oldest first, at most ``limit``."""
    conditions = [Release.status == ReleaseStatus.running, _last_sign_of_life() < before]
    if min_attempts is not None:
        conditions.append(Release.attempts >= min_attempts)
    if below_attempts is not None:
        conditions.append(Release.attempts < below_attempts)
    stmt = (
        select(Release.id).where(*conditions).order_by(Release.created_at, Release.id).limit(limit)
    )
    return list(session.scalars(stmt))
