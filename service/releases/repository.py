from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import Release


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
    stmt = select(Release.id).where(Release.status.in_(("queued", "running")))
    return list(session.scalars(stmt.order_by(Release.created_at)))
