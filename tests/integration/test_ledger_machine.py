"""The ledger's admit/settle as a state machine against a real database built from the
migrations (a SQLite file, and a scratch Postgres database).

Releases are reserved (admitted), then committed or refunded, in any order, with costs of every
kind (RDP curves, GDP μ, bare (ε, δ)), some drawn right at the remaining budget. A model
composes the holdings with dpcore the way the ledger does; after every step the database must
agree with it, never pass the budget, round against the user, and keep committed entries as
they were."""

from __future__ import annotations

import math
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from dpcore.accounting import Cost, gdp
from dpcore.accounting.filter import Charge, Spend, spend
from dpcore.mechanisms.dpmix.accounting import DPMixEvent
from dpcore.mechanisms.dpmix.accounting_pld import DPMixPLDEvent
from service import bootstrap
from service.budgets import service as ledger
from service.db import make_engine, make_session_factory
from service.errors import BudgetExceeded, InvalidInput
from service.models import Dataset, DatasetBudget, LedgerEntry, Principal, Release
from tests.conftest import TEST_DATABASE_URL, npz_bytes, scratch_database, toy_dataset

BUDGET_DELTA = 1e-5
STEPS: Counter[str] = Counter()  # checks run, and admissions admitted/refused, per test
RDP_COSTS = [DPMixEvent(200, 8, 100, s, s).cost(1e-6) for s in (0.6, 1.0, 2.0, 4.0)]

approx_costs = st.builds(
    lambda eps, frac: Cost(epsilon=eps, delta=BUDGET_DELTA * frac),
    st.floats(0.01, 2.0),
    st.sampled_from([0.0, 0.01, 0.1, 0.3]),
)
gdp_costs = st.builds(
    lambda mu, frac: Cost(
        epsilon=gdp.epsilon_of(mu, BUDGET_DELTA * frac), delta=BUDGET_DELTA * frac, mu=mu
    ),
    st.floats(0.05, 1.5),
    st.sampled_from([0.01, 0.1, 0.5]),
)
costs = st.one_of(approx_costs, gdp_costs, st.sampled_from(RDP_COSTS))


def _snapshot(entry: LedgerEntry) -> tuple[Any, ...]:
    return (
        entry.release_id,
        entry.epsilon,
        entry.delta,
        entry.rdp,
        entry.mu,
        entry.state,
        entry.created_at,
        entry.settled_at,
    )


class LedgerMachine(RuleBasedStateMachine):
    factory: sessionmaker[Session]  # set by the test

    releases = Bundle("releases")

    def __init__(self) -> None:
        super().__init__()
        self.charges: dict[str, Charge] = {}
        self.states: dict[str, str] = {}
        self.because: dict[str, str] = {}
        self.frozen: dict[str, tuple[Any, ...]] = {}

    @initialize(budget=st.sampled_from([0.5, 1.0, 2.0, 4.0]))
    def dataset(self, budget: float) -> None:
        self.budget = budget
        with self.factory() as session, session.begin():
            owner = Principal(name="machine", role="owner")
            session.add(owner)
            session.flush()
            dataset = Dataset(
                owner_id=owner.id,
                name="machine",
                format="npz",
                filename="x.npz",
                storage_key=f"datasets/{uuid.uuid4()}",
                sha256="0" * 64,
                size_bytes=1,
                n_rows=200,
                n_features=1,
                feature_shape=[1],
                classes=[0, 1],
                classes_declared=False,
                feature_range=[0, 1],
                clipped_values=0,
            )
            session.add(dataset)
            session.flush()
            session.add(DatasetBudget(dataset_id=dataset.id, epsilon=budget, delta=BUDGET_DELTA))
            self.owner_id, self.dataset_id = owner.id, dataset.id

    # --- the model ------------------------------------------------------------------------

    def _holding(self) -> list[Charge]:
        return [self.charges[r] for r, s in self.states.items() if s in ledger.HOLDING]

    def _spend(self, items: list[Charge]) -> Spend:
        return spend(self.budget, BUDGET_DELTA, items)

    def _composed(self, items: list[Charge]) -> float:
        return self._spend(items).epsilon

    def _release_and_admit(self, session: Session, cost: Cost) -> str:
        """A release row and its admission, in the caller's transaction; the release id."""
        release = Release(
            dataset_id=self.dataset_id,
            requested_by=self.owner_id,
            mechanism="test",
            params={},
            accountant="tight",
            format="npz",
            noise={"sigma_x": 1.0, "sigma_y": 1.0},
            epsilon=cost.epsilon,
            delta=cost.delta,
        )
        session.add(release)
        session.flush()
        ledger.admit(
            session,
            dataset_id=self.dataset_id,
            release_id=release.id,
            mechanism="test",
            params={},
            description={},
            cost=cost,
        )
        return release.id

    def _admit(self, cost: Cost) -> str | None:
        """Run admission in its own transaction; the release id, or None when refused."""
        # The model's own filter decides the way and whether it fits (docs/privacy.md).
        charge, after = self._spend(self._holding()).choose(
            cost.epsilon, cost.delta, cost.rdp, slack=ledger.ROUNDING_SLACK
        )
        fits = ledger.round_up(after.epsilon) <= self.budget and after.delta <= BUDGET_DELTA
        before = self._entry_count()
        try:
            with self.factory() as session, session.begin():
                release_id = self._release_and_admit(session, cost)
        except BudgetExceeded:
            assert not fits, "refused a release that fits"
            assert self._entry_count() == before  # nothing written
            STEPS["refused"] += 1
            return None
        assert fits, "admitted a release over the budget"
        STEPS["admitted"] += 1
        self.charges[release_id] = charge
        with self.factory() as session:
            stmt = select(LedgerEntry).where(LedgerEntry.release_id == release_id)
            assert session.scalars(stmt).one().charged_as == charge.mode
        self.states[release_id] = ledger.RESERVED
        return release_id

    def _entry_count(self) -> int:
        with self.factory() as session:
            stmt = select(func.count()).select_from(LedgerEntry)
            return int(session.scalar(stmt.where(LedgerEntry.dataset_id == self.dataset_id)) or 0)

    # --- rules ----------------------------------------------------------------------------

    @rule(target=releases, cost=costs)
    def reserve(self, cost: Cost) -> Any:
        release_id = self._admit(cost)
        return multiple() if release_id is None else release_id

    @rule(target=releases, factor=st.sampled_from([0.5, 1 - 1e-6, 1.0, 1 + 1e-6, 2.0]))
    def reserve_at_the_edge(self, factor: float) -> Any:
        """An (ε, 0) release sized on what the ledger says remains: right at the boundary."""
        with self.factory() as session:
            budget = session.get(DatasetBudget, self.dataset_id)
            assert budget is not None
            remaining = ledger.status_of(session, budget=budget).remaining
        if remaining <= 0:
            return multiple()
        release_id = self._admit(Cost(epsilon=remaining * factor, delta=0.0))
        return multiple() if release_id is None else release_id

    @rule(release_id=releases, because=st.sampled_from(sorted(ledger.SETTLED_BECAUSE)))
    def settle(self, release_id: str, because: str) -> None:
        state = ledger.SETTLED_BECAUSE[because]
        holding_before = self._composed(self._holding())
        with self.factory() as session, session.begin():
            entry = ledger.settle(session, release_id=release_id, because=because)
            settled, recorded = entry.state, entry.settled_because
        if self.states[release_id] == ledger.RESERVED:
            self.states[release_id] = state
            self.because[release_id] = because
        assert settled == self.states[release_id]  # a settled entry never changes
        assert recorded == self.because[release_id]  # nor does the rule that settled it
        if settled == ledger.COMMITTED and release_id not in self.frozen:
            with self.factory() as session:
                stmt = select(LedgerEntry).where(LedgerEntry.release_id == release_id)
                self.frozen[release_id] = _snapshot(session.scalars(stmt).one())
        if state == ledger.REFUNDED and settled == ledger.REFUNDED:
            # The refund gives back exactly this reservation: what is held is what it would
            # be had the release never been admitted.
            without = self._composed(self._holding())
            assert without <= holding_before
            with self.factory() as session:
                budget = session.get(DatasetBudget, self.dataset_id)
                assert budget is not None
                assert ledger.status_of(session, budget=budget).reserved == ledger.round_up(without)

    @rule(
        bad=st.sampled_from(
            [
                Cost(epsilon=0.0, delta=0.0),
                Cost(epsilon=0.1, delta=2 * BUDGET_DELTA),
                Cost(epsilon=0.1, delta=0.0, mu=0.0),
                Cost(epsilon=0.1, delta=0.0, rdp=(-1.0,) * len(RDP_COSTS[0].rdp or ())),
            ]
        )
    )
    def invalid_amount(self, bad: Cost) -> None:
        before = self._entry_count()
        with pytest.raises(InvalidInput), self.factory() as session, session.begin():
            self._release_and_admit(session, bad)
        assert self._entry_count() == before

    # --- invariants -----------------------------------------------------------------------

    @invariant()
    def agrees_with_the_model(self) -> None:
        if not hasattr(self, "dataset_id"):
            return
        STEPS["checked"] += 1
        with self.factory() as session:
            budget = session.get(DatasetBudget, self.dataset_id)
            assert budget is not None
            status = ledger.status_of(session, budget=budget)
            rows = list(
                session.scalars(
                    select(LedgerEntry).where(LedgerEntry.dataset_id == self.dataset_id)
                )
            )
        held = self._spend(self._holding())
        holding = held.epsilon
        committed = self._composed(
            [self.charges[r] for r, s in self.states.items() if s == ledger.COMMITTED]
        )
        # Never over the budget, and composed exactly as the model composes.
        assert status.spent <= status.reserved <= self.budget
        assert status.delta_reserved == held.delta <= BUDGET_DELTA
        assert status.reserved == ledger.round_up(holding)
        assert status.spent == ledger.round_up(committed)
        # Rounded against the user: shown spend at least the exact one, remaining at most.
        assert status.reserved >= holding and status.spent >= committed
        assert status.remaining <= max(0.0, self.budget - holding)
        assert math.isfinite(status.remaining) and status.remaining >= 0
        # Every entry is in the model's state; committed entries never change.
        assert {e.release_id: e.state for e in rows} == self.states
        for entry in rows:
            if entry.release_id in self.frozen:
                assert _snapshot(entry) == self.frozen[entry.release_id]


def _database(kind: str, tmp: Path) -> Iterator[sessionmaker[Session]]:
    if kind == "sqlite":
        url = f"sqlite:///{tmp / 'ledger.db'}"
        bootstrap.upgrade(url)
        engine = make_engine(url)
        yield make_session_factory(engine)
        engine.dispose()
        return
    with scratch_database(TEST_DATABASE_URL) as url:
        bootstrap.upgrade(url)
        engine = make_engine(url)
        yield make_session_factory(engine)
        engine.dispose()


@pytest.mark.slow  # a hypothesis state machine, thousands of steps
@pytest.mark.parametrize(("kind", "examples"), [("sqlite", 80), ("postgres", 50)])
def test_ledger_state_machine(kind: str, examples: int, tmp_path: Path) -> None:
    STEPS.clear()
    for factory in _database(kind, tmp_path):
        LedgerMachine.factory = factory
        run_state_machine_as_test(
            LedgerMachine,
            settings=settings(
                max_examples=examples,
                stateful_step_count=30,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )
    print(f"ledger machine on {kind}: {dict(STEPS)}")
    # Thousands of checked steps in all, with admissions on both sides of the boundary.
    assert STEPS["checked"] >= 10 * examples and min(STEPS["admitted"], STEPS["refused"]) > 50


def test_requested_amounts_are_validated(embedded: Any) -> None:
    """Non-finite, non-positive and out-of-range ε, δ and noise never reach the ledger: 422 and
    nothing written (JSON literals NaN and Infinity included), for releases and budgets."""
    h = embedded
    owner, _ = h.new_key("owner")
    ds = h.upload(owner, npz_bytes(*toy_dataset())).json()
    base = f'"dataset_id": "{ds["id"]}", "mechanism": "dpmix", '
    base += '"params": {"mixture_degree": 8, "n_samples": 30}'
    bad_releases = [
        '"epsilon": NaN',
        '"epsilon": Infinity',
        '"epsilon": 0',
        '"epsilon": -1',
        '"epsilon": 1, "delta": NaN',
        '"epsilon": 1, "delta": Infinity',
        '"epsilon": 1, "delta": 0',
        '"epsilon": 1, "delta": 1',
        '"noise": {"sigma_x": NaN}',
        '"noise": {"sigma_x": Infinity}',
        '"noise": {"sigma_x": 0}',
        '"noise": {"sigma_x": 1, "sigma_y": -1}',
        '"epsilon": 1, "noise_ratio": Infinity',
    ]
    headers = {**h.headers(owner), "content-type": "application/json"}
    for amount in bad_releases:
        for path in ("/releases", "/releases/preview"):
            r = h.client.post(path, content="{" + base + ", " + amount + "}", headers=headers)
            assert r.status_code == 422, (path, amount, r.text)
    ledger_now = h.client.get(f"/budgets/{ds['id']}", headers=h.headers(owner)).json()
    assert ledger_now["entries"] == [] and ledger_now["reserved"] == 0
    for budget in (
        '{"epsilon": NaN, "delta": 1e-5}',
        '{"epsilon": Infinity, "delta": 1e-5}',
        '{"epsilon": 0, "delta": 1e-5}',
        '{"epsilon": 1, "delta": 1}',
        '{"epsilon": 1, "delta": 0}',
        '{"epsilon": 1, "delta": NaN}',
    ):
        meta = '{"name": "t", "feature_range": [0, 13], "budget": ' + budget + "}"
        r = h.client.post(
            "/datasets",
            files={"file": ("d.npz", npz_bytes(*toy_dataset()))},
            data={"metadata": meta},
            headers=h.headers(owner),
        )
        assert r.status_code == 422, (budget, r.text)
    # The charge of an accepted release is its accountant's ε, rounded against the user.
    body = "{" + base + ', "noise": {"sigma_x": 1.0}}'
    charge = h.client.post("/releases/preview", content=body, headers=headers).json()["charge"]
    # A noise request takes the δ share of its ε (docs/privacy.md, "Default δ").
    assert 0 < charge["delta"] <= BUDGET_DELTA
    exact = DPMixPLDEvent(200, 8, 30, 1.0, 1.0).cost(charge["delta"]).epsilon
    assert exact < charge["epsilon"] <= exact * (1 + 2e-9)
    assert len(h.client.get("/datasets", headers=h.headers(owner)).json()["items"]) == 1
