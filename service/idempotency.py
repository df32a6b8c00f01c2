"""``Idempotency-Key`` for POSTs that charge or store: the same key and body replay the first
response (one charge, one object); the same key with another body is refused.

The key's row is written before any work, so a concurrent duplicate waits on the unique index
until the first request commits, then finds the stored response; if the first request fails,
its row is rolled back with everything else and the key is free again.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from fastapi.encoders import jsonable_encoder
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.errors import Conflict, InvalidInput
from service.models import IdempotencyRecord

MAX_KEY_LENGTH = 200


@dataclass(frozen=True)
class Replay:
    status_code: int
    body: Any


def request_hash(*parts: bytes | str) -> str:
    digest = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)
    return digest.hexdigest()


def canonical_json(value: Any) -> str:
    return json.dumps(jsonable_encoder(value), sort_keys=True, separators=(",", ":"))


def _find(session: Session, principal_id: str, key: str) -> IdempotencyRecord | None:
    stmt = select(IdempotencyRecord).where(
        IdempotencyRecord.principal_id == principal_id, IdempotencyRecord.key == key
    )
    return session.scalars(stmt).first()


def _replay(record: IdempotencyRecord, scope: str, digest: str) -> Replay:
    if record.scope != scope or record.request_hash != digest:
        raise InvalidInput(
            "this Idempotency-Key was already used with a different request; use a new key"
        )
    if record.status_code is None:
        raise Conflict("a request with this Idempotency-Key is still in progress; retry later")
    return Replay(record.status_code, record.response)


def begin(
    session: Session, *, principal_id: str, key: str, scope: str, digest: str
) -> Replay | IdempotencyRecord:
    """The stored response to replay, or the new record to ``finish`` once the work is done."""
    if not key or len(key) > MAX_KEY_LENGTH:
        raise InvalidInput(f"Idempotency-Key must have 1 to {MAX_KEY_LENGTH} characters")
    existing = _find(session, principal_id, key)
    if existing is not None:
        return _replay(existing, scope, digest)
    record = IdempotencyRecord(principal_id=principal_id, key=key, scope=scope, request_hash=digest)
    session.add(record)
    try:
        session.flush()
    except IntegrityError:
        # A concurrent request with this key committed first: replay its answer.
        session.rollback()
        existing = _find(session, principal_id, key)
        if existing is None:
            raise
        return _replay(existing, scope, digest)
    return record


def finish(session: Session, record: IdempotencyRecord, *, status_code: int, body: Any) -> None:
    record.status_code = status_code
    record.response = jsonable_encoder(body)
    session.flush()


def rewrite_replays(
    session: Session, *, principal_id: str, scope: str, object_id: str, body: Any
) -> None:
    """Replace the stored response that created ``object_id`` with ``body`` (the object as it
    now is), e.g. once a dataset is deleted, so that a replay neither keeps statistics that
    were erased nor shows the dataset as active."""
    stmt = select(IdempotencyRecord).where(
        IdempotencyRecord.principal_id == principal_id, IdempotencyRecord.scope == scope
    )
    for record in session.scalars(stmt):
        if isinstance(record.response, dict) and record.response.get("id") == object_id:
            record.response = jsonable_encoder(body)
    session.flush()
