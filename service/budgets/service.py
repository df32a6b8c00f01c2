"""The privacy ledger: admission, settlement and reporting.

Every figure shown to users is rounded against them: spends up, what remains down, and
admission compares the rounded-up composed spend with the budget.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from sqlalchemy.orm import Session

from dpcore.accounting import Cost, compose_epsilon
from service.access import dataset_for
from service.budgets import repository
from service.budgets.schemas import BudgetList, BudgetSummary, Ledger, LedgerEntryOut
from service.datasets.schemas import BudgetStatus
from service.errors import BudgetExceeded, InvalidInput, NotFound
from service.models import DatasetBudget, LedgerEntry, Principal, utcnow

RESERVED, COMMITTED, REFUNDED = "reserved", "committed", "refunded"
HOLDING = (RESERVED, COMMITTED)

# Relative slack added to every composed spend before it is compared or shown. It covers
# floating-point error in composition; calibration aims this much below its target so that
# a release calibrated to exactly the remaining budget is still admitted.
ROUNDING_SLACK = 1e-9


def round_up(value: float) -> float:
    return math.nextafter(value * (1 + ROUNDING_SLACK), math.inf) if value > 0 else 0.0


def remaining(budget: float, spent: float) -> float:
    """What is left of ``budget`` after ``spent`` (already rounded up), rounded down."""
    if spent <= 0:
        return budget
    return max(0.0, math.nextafter(budget - spent, -math.inf))


def encode_rdp(curve: Sequence[float] | None) -> list[float | None] | None:
    # JSON (and Postgres) have no infinity: None stands for +inf.
    if curve is None:
        return None
    return [float(v) if math.isfinite(v) else None for v in curve]


def decode_rdp(values: Sequence[float | None] | None) -> tuple[float, ...] | None:
    if values is None:
        return None
    return tuple(math.inf if v is None else float(v) for v in values)


def cost_of(entry: LedgerEntry) -> Cost:
    return Cost(epsilon=entry.epsilon, delta=entry.delta, rdp=decode_rdp(entry.rdp), mu=entry.mu)


def _composed(entries: Sequence[LedgerEntry], budget: DatasetBudget, extra: Cost | None) -> float:
    costs = [cost_of(e) for e in entries]
    if extra is not None:
        costs.append(extra)
    return round_up(compose_epsilon(costs, delta=budget.delta))


def status_of(session: Session, *, budget: DatasetBudget) -> BudgetStatus:
    holding = repository.entries(session, dataset_id=budget.dataset_id, states=HOLDING)
    committed = [e for e in holding if e.state == COMMITTED]
    reserved_total = _composed(holding, budget, None)
    return BudgetStatus(
        epsilon=budget.epsilon,
        delta=budget.delta,
        spent=_composed(committed, budget, None),
        reserved=reserved_total,
        remaining=remaining(budget.epsilon, reserved_total),
    )


def preview(session: Session, *, dataset_id: str, cost: Cost) -> dict[str, Any]:
    budget = _budget(session, dataset_id)
    status = status_of(session, budget=budget)
    holding = repository.entries(session, dataset_id=dataset_id, states=HOLDING)
    total_after = _composed(holding, budget, cost)
    return {
        **status.model_dump(),
        "total_after": total_after if math.isfinite(total_after) else None,
        "remaining_after": remaining(budget.epsilon, total_after),
        "admissible": total_after <= budget.epsilon,
    }


def admit(
    session: Session,
    *,
    dataset_id: str,
    release_id: str,
    mechanism: str,
    params: dict[str, Any],
    description: dict[str, Any],
    cost: Cost,
) -> LedgerEntry:
    """Reserve ``cost`` for a release, or refuse with 409 if the composed spend would pass
    the budget. Runs under the budget row lock; the caller's transaction commits."""
    budget = repository.lock_budget(session, dataset_id=dataset_id)
    if budget is None:
        raise NotFound(f"dataset {dataset_id} not found")
    _check_amount(cost, budget)
    holding = repository.entries(session, dataset_id=dataset_id, states=HOLDING)
    total_after = _composed(holding, budget, cost)
    if total_after > budget.epsilon:
        status = status_of(session, budget=budget)
        reason = (
            f"this release would bring the dataset's composed spend to ε = {total_after:.6g} "
            f"at δ = {budget.delta:g}, over its budget ε = {budget.epsilon:g} "
            f"(remaining {status.remaining:.6g})"
        )
        if math.isinf(total_after):
            reason += (
                "; the δ of releases known only as (ε, δ) adds up to the budget's δ, leaving "
                "none for composition: ask for a smaller 'delta' with such releases"
            )
        raise BudgetExceeded(
            reason,
            detail={
                "budget": {"epsilon": budget.epsilon, "delta": budget.delta},
                "spent": status.spent,
                "reserved": status.reserved,
                "remaining": status.remaining,
                "requested": {"epsilon": cost.epsilon, "delta": cost.delta},
                # JSON has no infinity: null means "no valid bound fits".
                "total_after": total_after if math.isfinite(total_after) else None,
            },
        )
    return repository.add_entry(
        session,
        LedgerEntry(
            dataset_id=dataset_id,
            release_id=release_id,
            mechanism=mechanism,
            params=params,
            description=description,
            epsilon=cost.epsilon,
            delta=cost.delta,
            rdp=encode_rdp(cost.rdp),
            mu=cost.mu,
            state=RESERVED,
        ),
    )


def _check_amount(cost: Cost, budget: DatasetBudget) -> None:
    """The ledger's own guard, whatever the caller checked: a release that reads private data
    costs a finite ε > 0, at a δ within the budget's (``Cost`` already keeps δ in [0, 1))."""
    if not (math.isfinite(cost.epsilon) and cost.epsilon > 0):
        raise InvalidInput(f"a release must cost a finite ε > 0, got {cost.epsilon!r}")
    if not 0 <= cost.delta <= budget.delta:
        raise InvalidInput(
            f"a release's δ must be in [0, {budget.delta:g}] (the budget's δ), got {cost.delta!r}"
        )
    if cost.mu is not None and not (math.isfinite(cost.mu) and cost.mu > 0):
        raise InvalidInput(f"a release's GDP μ must be finite and > 0, got {cost.mu!r}")
    if cost.rdp is not None and not all(v >= 0 for v in cost.rdp):  # also refuses NaN
        raise InvalidInput("a release's RDP curve must be >= 0 at every order")


def settle(session: Session, *, release_id: str, state: str) -> LedgerEntry:
    """Move a reservation to committed or refunded. Idempotent; a settled entry never
    changes again (a committed charge is never refunded)."""
    if state not in (COMMITTED, REFUNDED):
        raise ValueError(f"cannot settle to {state!r}")
    entry = repository.entry_for_release(session, release_id=release_id)
    if entry is None:
        raise NotFound(f"no ledger entry for release {release_id}")
    if entry.state == RESERVED:
        entry.state = state
        entry.settled_at = utcnow()
        session.flush()
    return entry


def _budget(session: Session, dataset_id: str) -> DatasetBudget:
    budget = repository.get_budget(session, dataset_id=dataset_id)
    if budget is None:
        raise NotFound(f"dataset {dataset_id} not found")
    return budget


def list_budgets(session: Session, *, principal: Principal) -> BudgetList:
    owner_id = None if principal.role == "admin" else principal.id
    datasets = repository.visible_datasets(session, owner_id=owner_id)
    counts = repository.release_counts(session, dataset_ids=[d.id for d in datasets])
    items = []
    for dataset in datasets:
        status = status_of(session, budget=_budget(session, dataset.id))
        items.append(
            BudgetSummary(
                dataset_id=dataset.id,
                dataset_name=dataset.name,
                **status.model_dump(),
                release_count=counts.get(dataset.id, 0),
            )
        )
    return BudgetList(items=items)


def ledger(session: Session, *, principal: Principal, dataset_id: str) -> Ledger:
    dataset_for(session, principal=principal, dataset_id=dataset_id)
    budget = _budget(session, dataset_id)
    rows = repository.entries(session, dataset_id=dataset_id)
    out: list[LedgerEntryOut] = []
    holding: list[LedgerEntry] = []
    for entry in rows:
        if entry.state in HOLDING:
            holding.append(entry)
        out.append(
            LedgerEntryOut(
                release_id=entry.release_id,
                mechanism=entry.mechanism,
                params=entry.params,
                accountant=str(entry.description.get("accountant", "")),
                epsilon=entry.epsilon,
                delta=entry.delta,
                state=entry.state,
                created_at=entry.created_at,
                settled_at=entry.settled_at,
                running_total=_composed(holding, budget, None),
            )
        )
    status = status_of(session, budget=budget)
    return Ledger(dataset_id=dataset_id, entries=out, **status.model_dump())
