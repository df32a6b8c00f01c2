from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import ApiKey, Principal


def principal_by_key_hash(session: Session, *, key_hash: str) -> Principal | None:
    stmt = (
        select(Principal)
        .join(ApiKey, ApiKey.principal_id == Principal.id)
        .where(ApiKey.key_hash == key_hash, ApiKey.revoked_at.is_(None))
    )
    return session.scalars(stmt).first()


def get_principal(session: Session, *, principal_id: str) -> Principal | None:
    return session.get(Principal, principal_id)


def add_principal_with_key(
    session: Session, *, name: str, role: str, key_hash: str, prefix: str
) -> tuple[Principal, ApiKey]:
    principal = Principal(name=name, role=role)
    session.add(principal)
    session.flush()
    key = ApiKey(principal_id=principal.id, key_hash=key_hash, prefix=prefix)
    session.add(key)
    session.flush()
    return principal, key


def key_exists(session: Session, *, key_hash: str) -> bool:
    return session.scalars(select(ApiKey.id).where(ApiKey.key_hash == key_hash)).first() is not None
