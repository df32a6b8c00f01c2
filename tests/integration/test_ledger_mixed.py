"""The ledger's filter holds entries of every kind: RDP curves, GDP μ, and bare (ε, δ)."""

from __future__ import annotations

import pytest

from dpcore.accounting import Cost, gdp
from dpcore.accounting.filter import Spend
from dpcore.mechanisms.dpmix.accounting import DPMixEvent
from service.budgets import service as ledger
from service.errors import BudgetExceeded
from service.models import Release
from tests.conftest import Harness, npz_bytes, toy_dataset


def _release_row(session, dataset_id: str, owner_id: str) -> str:  # type: ignore[no-untyped-def]
    release = Release(
        dataset_id=dataset_id,
        requested_by=owner_id,
        mechanism="test",
        params={},
        accountant="tight",
        format="npz",
        noise={"sigma_x": 1.0, "sigma_y": 1.0},
        epsilon=0.0,
        delta=0.0,
    )
    session.add(release)
    session.flush()
    return release.id


@pytest.mark.modes("real")
def test_mixed_entries_compose_like_dpcore(harness: Harness) -> None:
    h = harness
    owner, owner_id = h.new_key("owner")
    ds = h.upload(owner, npz_bytes(*toy_dataset()), budget={"epsilon": 6.0, "delta": 1e-5}).json()
    rdp_event = DPMixEvent(200, 8, 300, 0.8, 0.8)
    costs = [
        # Own ε at a tiny δ: its curve in the Rényi group (holding the δ left) costs less.
        rdp_event.cost(1e-12),
        Cost(epsilon=gdp.epsilon_of(0.4, 1e-6), delta=1e-6, mu=0.4),
        Cost(epsilon=0.5, delta=0.0),  # pure DP: a basic charge with no δ
    ]
    with h.runtime.session_factory() as session, session.begin():
        for cost in costs:
            rid = _release_row(session, ds["id"], owner_id)
            ledger.admit(
                session,
                dataset_id=ds["id"],
                release_id=rid,
                mechanism="test",
                params={},
                description={"accountant": "tight"},
                cost=cost,
            )
    # The same decisions, taken by dpcore's filter alone.
    state, modes = Spend(6.0, 1e-5), []
    for cost in costs:
        charge, state = state.choose(cost.epsilon, cost.delta, cost.rdp)
        modes.append(charge.mode)
    got = h.client.get(f"/budgets/{ds['id']}", headers=h.headers(owner)).json()
    assert [e["charged_as"] for e in got["entries"]] == modes == ["renyi", "renyi", "basic"]
    assert got["reserved"] < sum(c.epsilon for c in costs)  # the group beats adding up
    assert got["reserved"] == pytest.approx(state.epsilon, rel=2e-9)
    assert got["reserved"] >= state.epsilon  # rounded against the user
    assert got["delta_reserved"] == pytest.approx(state.delta, rel=1e-12)
    assert got["delta_remaining"] <= 1e-5 - state.delta
    assert [e["state"] for e in got["entries"]] == ["reserved"] * 3
    totals = [e["running_total"] for e in got["entries"]]
    assert totals == sorted(totals) and totals[-1] == got["reserved"]
    consumed = [e["consumed_epsilon"] for e in got["entries"]]
    assert sum(consumed) == pytest.approx(got["reserved"], rel=1e-8)

    # One more cost that does not fit is refused and nothing is written.
    with h.runtime.session_factory() as session, pytest.raises(BudgetExceeded), session.begin():
        rid = _release_row(session, ds["id"], owner_id)
        ledger.admit(
            session,
            dataset_id=ds["id"],
            release_id=rid,
            mechanism="test",
            params={},
            description={},
            cost=Cost(epsilon=6.0, delta=1e-6),
        )
    after = h.client.get(f"/budgets/{ds['id']}", headers=h.headers(owner)).json()
    assert len(after["entries"]) == 3


def test_delta_exhaustion_is_explained(embedded: Harness) -> None:
    h = embedded
    owner, owner_id = h.new_key("owner")
    ds = h.upload(owner, npz_bytes(*toy_dataset()), budget={"epsilon": 6.0, "delta": 1e-5}).json()
    with h.runtime.session_factory() as session, session.begin():
        rid = _release_row(session, ds["id"], owner_id)
        ledger.admit(
            session,
            dataset_id=ds["id"],
            release_id=rid,
            mechanism="test",
            params={},
            description={},
            cost=Cost(epsilon=1.0, delta=1e-5),  # all of the budget's δ
        )
    body = h.release_body(ds["id"], epsilon=1.0)
    r = h.client.post("/releases", json=body, headers=h.headers(owner))
    assert r.status_code == 409
    assert "smaller 'delta'" in r.json()["error"]["message"]
    assert r.json()["error"]["detail"]["delta_after"] > 1e-5
    # Which of ε and δ is short, and by how much.
    short = r.json()["error"]["detail"]["short"]
    assert r.json()["error"]["message"].startswith("δ is short by")
    assert short == {"epsilon": 0.0, "delta": r.json()["error"]["detail"]["delta_after"] - 1e-5}
    preview = h.client.post("/releases/preview", json=body, headers=h.headers(owner))
    assert preview.status_code == 200, preview.text
    assert preview.json()["budget"]["delta_remaining"] == 0
    assert preview.json()["budget"]["delta_after"] > 1e-5
    assert preview.json()["budget"]["admissible"] is False
    body["delta"] = 1e-6
    assert h.client.post("/releases", json=body, headers=h.headers(owner)).status_code == 409
