from __future__ import annotations

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from service.models import Release
from service.releases.status import UNFINISHED


def add(session: Session, release: Release) -> Release:
    session.add(release)
    session.flush()
    return release


def list_for(session: Session, *, dataset_ids: list[str] | None) -> list[Release]:
    stmt = select(Release).order_by(Release.created_at, Release.id)
    if dataset_ids is not None:
        stmt = stmt.where(Release.dataset_id.in_(dataset_ids))
    return list(session.scalars(stmt))


def unfinished_ids(session: Session) -> list[str]:
    stmt = select(Release.id).where(Release.status.in_(UNFINISHED))
    return list(session.scalars(stmt.order_by(Release.created_at)))


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
