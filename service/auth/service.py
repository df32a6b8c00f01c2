"""API keys: random secrets stored as SHA-256 hashes (a key has 256 bits of entropy, so a
fast hash is enough; there is nothing to brute-force)."""

from __future__ import annotations

import hashlib
import hmac
import secrets

from sqlalchemy.orm import Session

from service.audit_trail import service as audit
from service.auth import repository
from service.auth.schemas import ApiKeyCreated, Role
from service.errors import NotAuthenticated
from service.models import Principal

KEY_PREFIX = "dpr_"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def generate_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def authenticate(session: Session, *, authorization: str | None) -> Principal:
    if not authorization:
        raise NotAuthenticated("missing Authorization header; send 'Authorization: Bearer <key>'")
    scheme, _, key = authorization.partition(" ")
    if not hmac.compare_digest(scheme.lower(), "bearer") or not key.strip():
        raise NotAuthenticated("Authorization must be 'Bearer <key>'")
    principal = repository.principal_by_key_hash(session, key_hash=hash_key(key.strip()))
    if principal is None:
        raise NotAuthenticated("unknown or revoked API key")
    return principal


def create_key(session: Session, *, name: str, role: Role, actor: str) -> ApiKeyCreated:
    key = generate_key()
    principal, api_key = repository.add_principal_with_key(
        session, name=name, role=role.value, key_hash=hash_key(key), prefix=key[:12]
    )
    _audit_created(session, actor=actor, principal=principal, key_id=api_key.id)
    return ApiKeyCreated(
        principal_id=principal.id,
        key_id=api_key.id,
        name=principal.name,
        role=role,
        key=key,
        created_at=api_key.created_at,
    )


def ensure_admin_key(session: Session, *, key: str) -> bool:
    """Register ``key`` as an admin key unless it already exists; True when created."""
    key_hash = hash_key(key)
    if repository.key_exists(session, key_hash=key_hash):
        return False
    principal, api_key = repository.add_principal_with_key(
        session, name="admin", role=Role.admin.value, key_hash=key_hash, prefix=key[:12]
    )
    _audit_created(session, actor=audit.SYSTEM, principal=principal, key_id=api_key.id)
    return True


def _audit_created(session: Session, *, actor: str, principal: Principal, key_id: str) -> None:
    # Who got a key, never the key, its hash or its prefix.
    audit.record(
        session,
        actor=actor,
        action="api_key.created",
        object_type="api_key",
        object_id=key_id,
        detail={"principal_id": principal.id, "name": principal.name, "role": principal.role},
    )
