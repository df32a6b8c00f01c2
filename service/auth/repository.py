from __future__ import annotations

from datetime import datetime

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from service.auth.schemas import Role
from service.models import ApiKey, Principal


def key_by_hash(session: Session, *, key_hash: str) -> tuple[Principal, ApiKey] | None:
    stmt = (
        select(Principal, ApiKey)
        .join(ApiKey, ApiKey.principal_id == Principal.id)
        .where(ApiKey.key_hash == key_hash)
    )
    row = session.execute(stmt).first()
    return None if row is None else (row[0], row[1])


def get_key(session: Session, *, key_id: str) -> ApiKey | None:
    return session.get(ApiKey, key_id)


def list_keys(session: Session, *, principal_id: str | None) -> list[tuple[ApiKey, Principal]]:
    """Every key (``principal_id`` None) or one principal's, oldest first."""
    stmt = select(ApiKey, Principal).join(Principal, ApiKey.principal_id == Principal.id)
    if principal_id is not None:
        stmt = stmt.where(ApiKey.principal_id == principal_id)
    stmt = stmt.order_by(ApiKey.created_at, ApiKey.id)
    return [(key, principal) for key, principal in session.execute(stmt).all()]


def lock_active_admin_keys(session: Session, *, now: datetime) -> list[ApiKey]:
    """The admin keys neither revoked nor expired at ``now``, locked until the transaction
    ends (``FOR UPDATE`` on Postgres; SQLite's transactions hold the write lock from ``BEGIN
    IMMEDIATE``): two revocations at once cannot each see the other's key as the spare one."""
    stmt = (
        select(ApiKey)
        .join(Principal, ApiKey.principal_id == Principal.id)
        .where(
            Principal.role == Role.admin.value,
            ApiKey.revoked_at.is_(None),
            or_(ApiKey.expires_at.is_(None), ApiKey.expires_at > now),
        )
        .order_by(ApiKey.id)
        .with_for_update(of=ApiKey)
    )
    return list(session.scalars(stmt))


def bootstrap_keys(session: Session) -> list[ApiKey]:
    """The start-up admin keys, revoked ones included, newest first."""
    stmt = (
        select(ApiKey)
        .where(ApiKey.bootstrap.is_(True))
        .order_by(ApiKey.created_at.desc(), ApiKey.id)
    )
    return list(session.scalars(stmt))


def get_principal(session: Session, *, principal_id: str) -> Principal | None:
    return session.get(Principal, principal_id)


def add_principal_with_key(
    session: Session,
    *,
    name: str,
    role: str,
    key_hash: str,
    prefix: str,
    expires_at: datetime | None = None,
    bootstrap: bool = False,
) -> tuple[Principal, ApiKey]:
    principal = Principal(name=name, role=role)
    session.add(principal)
    session.flush()
    key = add_key(
        session,
        principal=principal,
        key_hash=key_hash,
        prefix=prefix,
        expires_at=expires_at,
        bootstrap=bootstrap,
    )
    return principal, key


def add_key(
    session: Session,
    *,
    principal: Principal,
    key_hash: str,
    prefix: str,
    expires_at: datetime | None = None,
    bootstrap: bool = False,
) -> ApiKey:
    key = ApiKey(
        principal_id=principal.id,
        key_hash=key_hash,
        prefix=prefix,
        expires_at=expires_at,
        bootstrap=bootstrap,
    )
    session.add(key)
    session.flush()
    return key
