from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.models import Dataset, DatasetBudget, LedgerEntry


def lock_budget(session: Session, *, dataset_id: str) -> DatasetBudget | None:
    """The budget row, locked until the transaction ends (no-op lock on SQLite, whose
    transactions already hold the database write lock from BEGIN IMMEDIATE)."""
    stmt = select(DatasetBudget).where(DatasetBudget.dataset_id == dataset_id).with_for_update()
    return session.scalars(stmt).first()


def lock_budgets(session: Session, *, dataset_ids: Sequence[str]) -> None:
    """Lock several budget rows, always in id order, so that two transactions locking the
    same rows cannot deadlock."""
    for dataset_id in sorted(set(dataset_ids)):
        lock_budget(session, dataset_id=dataset_id)


def get_budget(session: Session, *, dataset_id: str) -> DatasetBudget | None:
    return session.get(DatasetBudget, dataset_id)


def add_budget(session: Session, *, dataset_id: str, epsilon: float, delta: float) -> None:
    session.add(DatasetBudget(dataset_id=dataset_id, epsilon=epsilon, delta=delta))
    session.flush()


def entries(
    session: Session, *, dataset_id: str, states: Sequence[str] | None = None
) -> list[LedgerEntry]:
    stmt = select(LedgerEntry).where(LedgerEntry.dataset_id == dataset_id)
    if states is not None:
        stmt = stmt.where(LedgerEntry.state.in_(states))
    return list(session.scalars(stmt.order_by(LedgerEntry.id)))


def entry_for_release(session: Session, *, release_id: str) -> LedgerEntry | None:
    stmt = select(LedgerEntry).where(LedgerEntry.release_id == release_id).with_for_update()
    return session.scalars(stmt).first()


def add_entry(session: Session, entry: LedgerEntry) -> LedgerEntry:
    session.add(entry)
    session.flush()
    return entry


def release_counts(session: Session, *, dataset_ids: Sequence[str]) -> dict[str, int]:
    if not dataset_ids:
        return {}
    stmt = (
        select(LedgerEntry.dataset_id, func.count())
        .where(
            LedgerEntry.dataset_id.in_(dataset_ids),
            LedgerEntry.state.not_in(("refunded", "research")),
        )
        .group_by(LedgerEntry.dataset_id)
    )
    return {dataset_id: int(count) for dataset_id, count in session.execute(stmt)}


def visible_datasets(session: Session, *, owner_id: str | None) -> list[Dataset]:
    stmt = select(Dataset).order_by(Dataset.created_at, Dataset.id)
    if owner_id is not None:
        stmt = stmt.where(Dataset.owner_id == owner_id)
    return list(session.scalars(stmt))
