"""The privacy ledger: admission, settlement and reporting.

Admission is the privacy filter of ``dpcore.accounting.filter`` (valid for adaptively chosen
releases, docs/privacy.md "The ledger"): each release is charged ``basic`` (its own (ε, δ)) or
``renyi`` (its RDP curve), fixed at admission and stored on its entry, and a request is
admitted only if the filter's spent ε and δ stay within the budget. Every figure shown to
users is rounded against them: ε spends up, what remains down; δ sums are never rounded down.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from sqlalchemy.orm import Session

from dpcore.accounting import Cost
from dpcore.accounting.filter import Charge, Spend, spend
from dpcore.mechanisms import registry
from dpcore.mechanisms.spec import REPLACE_ONE
from service import owner_only
from service.access import dataset_for
from service.budgets import repository
from service.budgets.schemas import BudgetList, BudgetSummary, Ledger, LedgerEntryOut
from service.datasets.schemas import BudgetStatus
from service.errors import BudgetExceeded, InvalidInput, NotFound
from service.meta import metrics
from service.models import DatasetBudget, LedgerEntry, Principal, utcnow

RESERVED, COMMITTED, REFUNDED = "reserved", "committed", "refunded"
# A research release's entry (service.releases.research): born final, ε = δ = 0, never held.
RESEARCH = "research"
HOLDING = (RESERVED, COMMITTED)

# Why an entry was settled as it was (``ledger_entries.settled_because``), the rules of
# ``service.releases.lifecycle``: committed when its release succeeded, when an attempt had
# claimed the upload of its output (output may exist), or when a job had begun reading the
# dataset's content (whether it failed may depend on the private data); refunded only when it
# ended before any job read the content.
SUCCEEDED = "succeeded"
UPLOAD_CLAIMED = "upload_claimed"
PRIVATE_DATA_READ = "private_data_read"
BEFORE_PRIVATE_READ = "before_private_read"
SETTLED_BECAUSE = {
    SUCCEEDED: COMMITTED,
    UPLOAD_CLAIMED: COMMITTED,
    PRIVATE_DATA_READ: COMMITTED,
    BEFORE_PRIVATE_READ: REFUNDED,
}

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


def charge_of(entry: LedgerEntry) -> Charge:
    """How the filter holds a ledger entry (the way fixed at its admission)."""
    if entry.charged_as == "renyi":
        assert entry.group_delta is not None
        return Charge("renyi", 0.0, 0.0, decode_rdp(entry.rdp), entry.group_delta)
    return Charge("basic", entry.epsilon, entry.delta)


def _spend(entries: Sequence[LedgerEntry], budget: DatasetBudget) -> Spend:
    return spend(budget.epsilon, budget.delta, [charge_of(e) for e in entries])


def _fits(state: Spend) -> bool:
    """Admission's test, rounded against the user: the ε spend is rounded up (``round_up``)
    before it is compared, δ sums are compared as they are (never rounded down)."""
    return state.within_budget(ROUNDING_SLACK)


def spend_of(session: Session, *, budget: DatasetBudget) -> Spend:
    """The filter's state over a dataset's holding entries (for planning a release's δ)."""
    holding = repository.entries(session, dataset_id=budget.dataset_id, states=HOLDING)
    return _spend(holding, budget)


def consumed_of(entry: LedgerEntry) -> tuple[float, float]:
    """What an entry's admission added to the filter's spent (ε, δ); entries from before the
    filter (migration 0013) show their own (ε, δ)."""
    return (
        entry.epsilon if entry.consumed_epsilon is None else entry.consumed_epsilon,
        entry.delta if entry.consumed_delta is None else entry.consumed_delta,
    )


def _status(budget: DatasetBudget, holding: Sequence[LedgerEntry]) -> BudgetStatus:
    committed = _spend([e for e in holding if e.state == COMMITTED], budget)
    reserved = _spend(holding, budget)
    reserved_epsilon = round_up(reserved.epsilon)
    return BudgetStatus(
        epsilon=budget.epsilon,
        delta=budget.delta,
        spent=round_up(committed.epsilon),
        reserved=reserved_epsilon,
        remaining=remaining(budget.epsilon, reserved_epsilon),
        delta_spent=committed.delta,
        delta_reserved=reserved.delta,
        delta_remaining=remaining(budget.delta, reserved.delta),
    )


def status_of(session: Session, *, budget: DatasetBudget) -> BudgetStatus:
    holding = repository.entries(session, dataset_id=budget.dataset_id, states=HOLDING)
    return _status(budget, holding)


def _decide(
    budget: DatasetBudget, holding: Sequence[LedgerEntry], cost: Cost
) -> tuple[Charge, Spend, Spend]:
    before = _spend(holding, budget)
    charge, after = before.choose(cost.epsilon, cost.delta, cost.rdp, slack=ROUNDING_SLACK)
    return charge, before, after


def preview(session: Session, *, dataset_id: str, cost: Cost) -> dict[str, Any]:
    budget = _budget(session, dataset_id)
    holding = repository.entries(session, dataset_id=dataset_id, states=HOLDING)
    charge, _before, after = _decide(budget, holding, cost)
    total_after = round_up(after.epsilon)
    return {
        **_status(budget, holding).model_dump(),
        "total_after": total_after if math.isfinite(total_after) else None,
        "remaining_after": remaining(budget.epsilon, total_after),
        "delta_after": after.delta,
        "delta_remaining_after": remaining(budget.delta, after.delta),
        "charged_as": charge.mode,
        "admissible": _fits(after),
        "renyi_group": after.renyi is not None,
    }


# Below this fraction of the budget's ε left, the budget is spent: no δ warning is useful.
_EPSILON_SPENT = 1e-6
# A δ left below this fraction of the budget's δ is floating-point dust of δ sums: none left.
_DELTA_DUST = 1e-9


def delta_warnings(
    budget_epsilon: float, budget_delta: float, after: dict[str, Any], *, ratio: float
) -> list[dict[str, str]]:
    """Warnings for a preview (``preview``'s figures ``after``) whose admission would leave δ
    unusable while ε remains: no δ left (``delta_exhausted``), or a δ left smaller than
    ``ratio`` times its proportion of the ε left (``delta_low``). Public figures only (the
    ledger's spends and the budget)."""
    if not after["admissible"]:
        return []
    epsilon_left = after["remaining_after"]
    delta_left = after["delta_remaining_after"]
    if epsilon_left <= _EPSILON_SPENT * budget_epsilon:
        return []
    if delta_left <= _DELTA_DUST * budget_delta:
        group = (
            " Releases whose RDP curve joins the Rényi group it holds can still be admitted."
            if after["charged_as"] == "renyi" or after.get("renyi_group")
            else ""
        )
        return [
            {
                "code": "delta_exhausted",
                "message": f"admitting this release leaves no δ of the budget's "
                f"{budget_delta:g} while ε = {epsilon_left:.6g} remains: every later release "
                f"that charges δ will be refused.{group} Ask for a smaller 'delta' to keep "
                'some for later releases (docs/privacy.md, "Default δ").',
            }
        ]
    if delta_left / budget_delta < ratio * (epsilon_left / budget_epsilon):
        return [
            {
                "code": "delta_low",
                "message": f"admitting this release leaves δ = {delta_left:.3g} of the budget's "
                f"{budget_delta:g} for ε = {epsilon_left:.6g}: δ is spent much faster than ε, "
                "so later releases get a small default δ (a share of the δ left) and need "
                "more noise for the same ε. Ask for a smaller 'delta' to keep more.",
            }
        ]
    return []


def consumed(before: Spend, after: Spend) -> tuple[float, float]:
    """What a charge adds to the filter's spend: (ε, δ), the ε rounded up."""
    return (
        round_up(max(0.0, after.epsilon - before.epsilon)),
        max(0.0, after.delta - before.delta),
    )


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
    """Reserve ``cost`` for a release, or refuse with 409 if the filter would pass the
    budget. Runs under the budget row lock; the caller's transaction commits."""
    budget = _locked_budget(session, dataset_id)
    check_amount(cost, budget)
    holding = repository.entries(session, dataset_id=dataset_id, states=HOLDING)
    charge, before, after = _decide(budget, holding, cost)
    if not _fits(after):
        metrics.ledger_decision(admitted=False)
        status = _status(budget, holding)
        total_after = round_up(after.epsilon)
        short = shortfall(budget, after, total_after)
        reason = (
            f"{short['message']}: this release would bring the dataset's spend to "
            f"ε = {total_after:.6g}, δ = {after.delta:.6g}, over its budget "
            f"ε = {budget.epsilon:g}, δ = {budget.delta:g} (left before it: "
            f"ε = {status.remaining:.6g}, δ = {status.delta_remaining:.6g}). "
            f"{short['advice']}"
        )
        raise BudgetExceeded(
            reason,
            detail={
                "budget": {"epsilon": budget.epsilon, "delta": budget.delta},
                "spent": status.spent,
                "reserved": status.reserved,
                "remaining": status.remaining,
                "delta_remaining": status.delta_remaining,
                "requested": {"epsilon": cost.epsilon, "delta": cost.delta},
                # JSON has no infinity: null means "no valid bound fits".
                "total_after": total_after if math.isfinite(total_after) else None,
                "delta_after": after.delta,
                # By how much each of ε and δ passes the budget (0: it fits; ε null: no
                # finite ε bound holds at the δ left).
                "short": {"epsilon": short["epsilon"], "delta": short["delta"]},
            },
        )
    consumed_epsilon, consumed_delta = consumed(before, after)
    metrics.ledger_decision(admitted=True)
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
            charged_as=charge.mode,
            group_delta=charge.group_delta if charge.mode == "renyi" else None,
            consumed_epsilon=consumed_epsilon,
            consumed_delta=consumed_delta,
            state=RESERVED,
        ),
    )


def shortfall(budget: DatasetBudget, after: Spend, total_after: float) -> dict[str, Any]:
    """Which of ε and δ a refused release is short of, by how much, and what to ask for
    instead (public ledger figures only)."""
    epsilon_over = max(0.0, total_after - budget.epsilon) if math.isfinite(total_after) else None
    delta_over = max(0.0, after.delta - budget.delta)
    parts = []
    if epsilon_over is None:
        parts.append("no finite ε bound holds within the budget's δ")
    elif epsilon_over > 0:
        parts.append(f"ε is short by {epsilon_over:.4g}")
    if delta_over > 0:
        parts.append(f"δ is short by {delta_over:.3g}")
    advice = []
    if epsilon_over is None or epsilon_over > 0:
        advice.append("ask for a smaller 'epsilon' (or more noise)")
    if delta_over > 0 or epsilon_over is None:
        advice.append(
            "ask for a smaller 'delta' (the δ of every release adds up under the ledger's filter)"
        )
    said = " or ".join(advice) or "ask for less"
    return {
        "epsilon": epsilon_over,
        "delta": delta_over,
        "message": " and ".join(parts) or "the budget is spent",
        "advice": said[0].upper() + said[1:] + ".",
    }


def _locked_budget(session: Session, dataset_id: str) -> DatasetBudget:
    """The dataset's budget row, locked until the transaction ends (every ledger write takes
    it, so the ledger's order is admission's); 404 when there is none."""
    budget = repository.lock_budget(session, dataset_id=dataset_id)
    if budget is None:
        raise NotFound(f"dataset {dataset_id} not found")
    return budget


def record_research(
    session: Session,
    *,
    dataset_id: str,
    release_id: str,
    mechanism: str,
    params: dict[str, Any],
    description: dict[str, Any],
) -> LedgerEntry:
    """Record a research release: an entry in its final state ``research`` at ε = δ = 0,
    which the filter never holds. Its description carries the accountant's claim in words
    (``description["research"]``); the database pins such entries free (migration 0014).
    Takes the budget row lock like every other entry, so the ledger's order is admission's."""
    if not isinstance(description.get("research"), dict):
        raise ValueError("a research entry must describe its claim")
    _locked_budget(session, dataset_id)
    now = utcnow()
    return repository.add_entry(
        session,
        LedgerEntry(
            dataset_id=dataset_id,
            release_id=release_id,
            mechanism=mechanism,
            params=params,
            description=description,
            epsilon=0.0,
            delta=0.0,
            rdp=None,
            mu=None,
            charged_as="basic",
            group_delta=None,
            consumed_epsilon=0.0,
            consumed_delta=0.0,
            state=RESEARCH,
            created_at=now,
            # Settled at admission: its end time would otherwise follow the job's run time.
            settled_at=now,
        ),
    )


def preview_free(session: Session, *, dataset_id: str) -> dict[str, Any]:
    """``preview`` of a release that charges nothing (a research release): the budget as it
    is, admissible whatever is left."""
    budget = _budget(session, dataset_id)
    holding = repository.entries(session, dataset_id=dataset_id, states=HOLDING)
    status = _status(budget, holding)
    return {
        **status.model_dump(),
        "total_after": status.reserved,
        "remaining_after": status.remaining,
        "delta_after": status.delta_reserved,
        "delta_remaining_after": status.delta_remaining,
        "charged_as": RESEARCH,
        "admissible": True,
    }


def check_amount(cost: Cost, budget: DatasetBudget) -> None:
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


def settle(session: Session, *, release_id: str, because: str) -> LedgerEntry:
    """Move a reservation to the state ``because`` (one of ``SETTLED_BECAUSE``) calls for,
    recording why. Idempotent; a settled entry never changes again (a committed charge is
    never refunded)."""
    state = SETTLED_BECAUSE.get(because)
    if state is None:
        raise ValueError(f"no settlement rule {because!r}")
    entry = repository.entry_for_release(session, release_id=release_id)
    if entry is None:
        raise NotFound(f"no ledger entry for release {release_id}")
    if entry.state == RESERVED:
        entry.state = state
        entry.settled_because = because
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
    """The dataset's entries, oldest first. Research entries (owner-only releases) are listed
    to the dataset's owner alone: an admin's ledger omits them, and since they are free and
    never held by the filter, every other figure (spends, running totals, what each
    admission consumed) is the same with or without them (docs/privacy.md, "Research
    releases")."""
    dataset = dataset_for(session, principal=principal, dataset_id=dataset_id)
    budget = _budget(session, dataset_id)
    rows = repository.entries(session, dataset_id=dataset_id)
    if dataset.owner_id == principal.id:
        owner_only.mark(any(entry.state == RESEARCH for entry in rows))
    else:
        rows = [entry for entry in rows if entry.state != RESEARCH]
    out: list[LedgerEntryOut] = []
    holding: list[LedgerEntry] = []
    for entry in rows:
        if entry.state in HOLDING:
            holding.append(entry)
        state = _spend(holding, budget)
        consumed_epsilon, consumed_delta = consumed_of(entry)
        out.append(
            LedgerEntryOut(
                release_id=entry.release_id,
                mechanism=entry.mechanism,
                params=entry.params,
                accountant=str(entry.description.get("accountant", "")),
                epsilon=entry.epsilon,
                delta=entry.delta,
                charged_as=entry.charged_as,
                consumed_epsilon=consumed_epsilon,
                consumed_delta=consumed_delta,
                state=entry.state,
                settled_because=entry.settled_because,
                neighbour_relation=_relation(entry),
                research=_research_statement(entry),
                created_at=entry.created_at,
                settled_at=entry.settled_at,
                running_total=round_up(state.epsilon),
                running_delta=state.delta,
            )
        )
    return Ledger(dataset_id=dataset_id, entries=out, **_status(budget, holding).model_dump())


def _relation(entry: LedgerEntry) -> str:
    """As admission stored it; entries written before it was stored: from their parameters."""
    stored = entry.description.get("neighbour_relation")
    if isinstance(stored, str):
        return stored
    try:
        return registry.get(entry.mechanism).neighbours(entry.params)
    except ValueError:  # a mechanism no longer registered
        return REPLACE_ONE


def _research_statement(entry: LedgerEntry) -> str | None:
    claim = entry.description.get("research") if entry.state == RESEARCH else None
    return str(claim.get("statement")) if isinstance(claim, dict) else None
