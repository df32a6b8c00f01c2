"""The audit trail's queries. Append and read only: there is deliberately no update or
delete here (and the database refuses both)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import AuditEvent


def append(session: Session, event: AuditEvent) -> AuditEvent:
    session.add(event)
    session.flush()
    return event


def page(
    session: Session,
    *,
    object_type: str | None,
    object_id: str | None,
    actor: str | None,
    since: datetime | None,
    after_id: int | None,
    limit: int,
) -> list[AuditEvent]:
    """Oldest first, ``limit`` events with ids above ``after_id``."""
    stmt = select(AuditEvent)
    if object_type is not None:
        stmt = stmt.where(AuditEvent.object_type == object_type)
    if object_id is not None:
        stmt = stmt.where(AuditEvent.object_id == object_id)
    if actor is not None:
        stmt = stmt.where(AuditEvent.actor == actor)
    if since is not None:
        stmt = stmt.where(AuditEvent.at >= since)
    if after_id is not None:
        stmt = stmt.where(AuditEvent.id > after_id)
    return list(session.scalars(stmt.order_by(AuditEvent.id).limit(limit)))
