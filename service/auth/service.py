"""API keys: random secrets stored as SHA-256 hashes (a key has 256 bits of entropy, so a
fast hash is enough; there is nothing to brute-force)."""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from service.audit_trail import service as audit
from service.auth import repository
from service.auth.schemas import ApiKeyCreated, ApiKeyOut, Role
from service.errors import Forbidden, InvalidInput, LastAdminKey, NotAuthenticated, NotFound
from service.models import ApiKey, Principal, utcnow

log = logging.getLogger(__name__)

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
    found = repository.key_by_hash(session, key_hash=hash_key(key.strip()))
    if found is None:
        raise NotAuthenticated("unknown API key")
    principal, api_key = found
    # Telling the holder of the secret that it was revoked or has expired tells them nothing
    # they could not know; it tells them to ask for a new key.
    refusal = api_key.refusal(utcnow())
    if refusal is not None:
        raise NotAuthenticated(refusal)
    return principal


def check_role(principal: Principal, roles: tuple[Role, ...]) -> None:
    """Forbidden unless ``principal`` has one of ``roles``."""
    if principal.role not in roles:
        raise Forbidden(
            f"this operation needs role {' or '.join(roles)}; your key has role {principal.role}"
        )


def create_key(
    session: Session,
    *,
    actor: str,
    name: str | None = None,
    role: Role | None = None,
    principal_id: str | None = None,
    expires_at: datetime | None = None,
) -> ApiKeyCreated:
    """A new principal (``name``, ``role``) with its key, or (``principal_id``) another key for
    an existing one."""
    key = generate_key()
    if principal_id is not None:
        found = repository.get_principal(session, principal_id=principal_id)
        if found is None:
            raise NotFound(f"principal {principal_id} not found")
        principal = found
        api_key = repository.add_key(
            session,
            principal=principal,
            key_hash=hash_key(key),
            prefix=key[:12],
            expires_at=expires_at,
        )
    else:
        if name is None or role is None:
            raise InvalidInput("a new principal needs name and role")
        principal, api_key = repository.add_principal_with_key(
            session,
            name=name,
            role=role.value,
            key_hash=hash_key(key),
            prefix=key[:12],
            expires_at=expires_at,
        )
    _audit_created(session, actor=actor, principal=principal, api_key=api_key)
    return ApiKeyCreated(
        principal_id=principal.id,
        key_id=api_key.id,
        name=principal.name,
        role=Role(principal.role),
        key=key,
        created_at=api_key.created_at,
        expires_at=api_key.expires_at,
    )


def _key_out(key: ApiKey, principal: Principal, now: datetime) -> ApiKeyOut:
    return ApiKeyOut(
        id=key.id,
        principal_id=principal.id,
        name=principal.name,
        role=Role(principal.role),
        created_at=key.created_at,
        expires_at=key.expires_at,
        revoked_at=key.revoked_at,
        bootstrap=key.bootstrap,
        active=key.refusal(now) is None,
    )


def list_keys(session: Session, *, principal: Principal) -> list[ApiKeyOut]:
    """Admins see every key; anyone else (owners, analysts) the keys of their own principal."""
    only = None if principal.role == Role.admin else principal.id
    now = utcnow()
    return [_key_out(k, p, now) for k, p in repository.list_keys(session, principal_id=only)]


def revoke_key(session: Session, *, principal: Principal, key_id: str) -> None:
    """Revoke a key: admins any key, anyone else (owners and analysts) only their own
    (another's is a missing one). Revoking a revoked key changes nothing. The last active
    admin key is refused (``LastAdminKey``): with it gone nobody could create a key, audit or
    revoke one until a new start-up key is configured and the API restarted."""
    key = repository.get_key(session, key_id=key_id)
    if key is None or (principal.role != Role.admin and key.principal_id != principal.id):
        raise NotFound(f"API key {key_id} not found")
    if key.revoked_at is not None:
        return
    active_admin = repository.lock_active_admin_keys(session, now=utcnow())
    if [k.id for k in active_admin] == [key.id]:
        raise LastAdminKey(
            f"API key {key_id} is the last active admin key: revoking it would lock every "
            f"admin out; create another admin key first (POST /api-keys), then revoke this one"
        )
    _revoke(session, key, actor=principal.id, reason="revoked")


def _revoke(session: Session, key: ApiKey, *, actor: str, reason: str) -> None:
    key.revoked_at = utcnow()
    audit.record(
        session,
        actor=actor,
        action="api_key.revoked",
        object_type="api_key",
        object_id=key.id,
        detail={"principal_id": key.principal_id, "reason": reason},
    )
    session.flush()


def ensure_admin_key(session: Session, *, key: str) -> bool:
    """Register ``key`` as the start-up admin key; True when it was new.

    A new key replaces the previous start-up key: every active bootstrap key is revoked and
    the new one belongs to the same admin principal (so the audit trail keeps one actor).
    A key already registered is left as it is, revoked or not: a revoked admin key is never
    brought back by a restart.
    """
    key_hash = hash_key(key)
    found = repository.key_by_hash(session, key_hash=key_hash)
    if found is not None:
        if found[1].revoked_at is not None:
            log.warning(
                "the configured admin key was revoked and stays revoked; "
                "configure a new DPRELEASE_ADMIN_KEY to get an admin key"
            )
        return False
    previous = repository.bootstrap_keys(session)
    for old in previous:
        if old.revoked_at is None:
            _revoke(session, old, actor=audit.SYSTEM, reason="admin key rotated")
    admin = (
        repository.get_principal(session, principal_id=previous[0].principal_id)
        if previous
        else None
    )
    if admin is None:
        admin, api_key = repository.add_principal_with_key(
            session,
            name="admin",
            role=Role.admin.value,
            key_hash=key_hash,
            prefix=key[:12],
            bootstrap=True,
        )
    else:
        api_key = repository.add_key(
            session, principal=admin, key_hash=key_hash, prefix=key[:12], bootstrap=True
        )
    _audit_created(session, actor=audit.SYSTEM, principal=admin, api_key=api_key)
    if previous:
        log.info("admin key rotated: the previous start-up admin key is revoked")
    return True


def _audit_created(session: Session, *, actor: str, principal: Principal, api_key: ApiKey) -> None:
    # Who got a key, never the key, its hash or its prefix.
    detail: dict[str, Any] = {
        "principal_id": principal.id,
        "name": principal.name,
        "role": principal.role,
    }
    if api_key.expires_at is not None:
        detail["expires_at"] = api_key.expires_at.isoformat()
    audit.record(
        session,
        actor=actor,
        action="api_key.created",
        object_type="api_key",
        object_id=api_key.id,
        detail=detail,
    )
