"""The audit trail: every state change of datasets, releases, grants and API keys, recorded
in the same transaction as the change (a rolled-back change leaves no record).

Actors are principal ids, ``worker`` for job transitions and ``system`` for start-up. The
detail is small, and never holds secrets (keys, key hashes), raw data or figures computed
from it that only the owner may see (the upload's hash, clipped counts, class counts, a
failed job's error text, which may quote the data).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session

from service.audit_trail import repository
from service.audit_trail.schemas import AuditEventOut, AuditPage, ObjectType
from service.db import on_rollback
from service.errors import InvalidInput
from service.models import AuditEvent

log = logging.getLogger(__name__)

WORKER = "worker"
SYSTEM = "system"

# Never in a detail, at any depth: a guard against a careless future call.
FORBIDDEN_FIELDS = frozenset(
    {
        "key",
        "api_key",
        "key_hash",
        "prefix",
        "secret",
        "token",
        "sha256",
        "dataset_sha256",
        "clipped_values",
        "class_counts",
        "error",
    }
)


def _check_detail(detail: Mapping[str, Any]) -> None:
    for name, value in detail.items():
        if name in FORBIDDEN_FIELDS:
            raise ValueError(f"audit detail must not hold {name!r}")
        if isinstance(value, Mapping):
            _check_detail(value)


def _event(
    actor: str, action: str, object_type: ObjectType, object_id: str, detail: dict[str, Any]
) -> AuditEvent:
    _check_detail(detail)
    return AuditEvent(
        actor=actor, action=action, object_type=object_type, object_id=object_id, detail=detail
    )


def record(
    session: Session,
    *,
    actor: str,
    action: str,
    object_type: ObjectType,
    object_id: str,
    detail: dict[str, Any] | None = None,
) -> AuditEvent:
    """Append one event to the caller's unit of work."""
    return repository.append(session, _event(actor, action, object_type, object_id, detail or {}))


def record_despite_rollback(
    session: Session,
    *,
    actor: str,
    action: str,
    object_type: ObjectType,
    object_id: str,
    detail: dict[str, Any] | None = None,
) -> None:
    """For a refusal: the request's unit of work is rolled back, yet the attempt is worth
    keeping; it is written in a transaction of its own once the rollback is done."""
    event = _event(actor, action, object_type, object_id, detail or {})
    bind = session.get_bind()

    def write() -> None:
        try:
            with Session(bind) as own, own.begin():
                repository.append(own, event)
        except Exception:  # the refusal stands either way; only its record is lost
            log.exception("audit: could not record %s on %s", action, object_type)

    on_rollback(session, write)


def _cursor_id(cursor: str | None) -> int | None:
    if cursor is None:
        return None
    if not (cursor.isascii() and cursor.isdigit()) or len(cursor) > 18:
        raise InvalidInput("cursor must be a next_cursor returned by GET /audit")
    return int(cursor)


def list_events(
    session: Session,
    *,
    object_type: ObjectType | None,
    object_id: str | None,
    actor: str | None,
    since: datetime | None,
    cursor: str | None,
    limit: int,
) -> AuditPage:
    if since is not None and since.tzinfo is None:
        since = since.replace(tzinfo=UTC)  # a time without offset is UTC
    rows = repository.page(
        session,
        object_type=object_type,
        object_id=object_id,
        actor=actor,
        since=since,
        after_id=_cursor_id(cursor),
        limit=limit,
    )
    return AuditPage(
        items=[AuditEventOut.model_validate(row, from_attributes=True) for row in rows],
        next_cursor=str(rows[-1].id) if len(rows) == limit else None,
    )
