from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import Dataset, Grant, Principal


def add(session: Session, dataset: Dataset) -> Dataset:
    session.add(dataset)
    session.flush()
    return dataset


def get(session: Session, dataset_id: str) -> Dataset | None:
    return session.get(Dataset, dataset_id)


def list_by_ids(session: Session, *, ids: list[str] | None) -> list[Dataset]:
    stmt = select(Dataset).order_by(Dataset.created_at, Dataset.id)
    if ids is not None:
        stmt = stmt.where(Dataset.id.in_(ids))
    return list(session.scalars(stmt))


def list_owned(session: Session, *, owner_id: str) -> list[Dataset]:
    stmt = select(Dataset).where(Dataset.owner_id == owner_id)
    return list(session.scalars(stmt.order_by(Dataset.created_at, Dataset.id)))


def find_grant(session: Session, *, dataset_id: str, principal_id: str) -> Grant | None:
    stmt = select(Grant).where(Grant.dataset_id == dataset_id, Grant.principal_id == principal_id)
    return session.scalars(stmt).first()


def add_grant(session: Session, grant: Grant) -> Grant:
    session.add(grant)
    session.flush()
    return grant


def get_principal(session: Session, *, principal_id: str) -> Principal | None:
    return session.get(Principal, principal_id)


def list_grants(session: Session, *, dataset_id: str) -> list[Grant]:
    stmt = select(Grant).where(Grant.dataset_id == dataset_id)
    return list(session.scalars(stmt.order_by(Grant.created_at, Grant.id)))


def delete_grant(session: Session, grant: Grant) -> None:
    session.delete(grant)
    session.flush()
