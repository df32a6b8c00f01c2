"""Research releases: an accountant whose ε is not a bound runs only under the owner's opt-in,
is seen by the dataset's owner alone, charges nothing and says so in the response, the ledger
and the file. ClustMix runs both variants through POST /releases and the CLI."""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
import pytest

from tests.conftest import Harness, npz_bytes, toy_dataset

BUDGET = {"epsilon": 50.0, "delta": 1e-5}


def _dataset(h: Harness, owner: str, n: int = 200) -> dict[str, Any]:
    r = h.upload(owner, npz_bytes(*toy_dataset(n=n)), budget=BUDGET)
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


def _lp(dataset_id: str, **extra: Any) -> dict[str, Any]:
    """local_perturbation under its paper accountant (not a bound) — the quickest research job."""
    return {
        "dataset_id": dataset_id,
        "mechanism": "local_perturbation",
        "params": {},
        "epsilon": 8.0,
        "accountant": "paper",
        **extra,
    }


def _error(r: Any) -> str:
    assert r.status_code == 422, r.text
    return str(r.json()["error"]["message"])


def test_research_needs_its_opt_in_and_only_where_the_bound_is_invalid(
    embedded: Harness,
) -> None:
    h = embedded
    owner, _ = h.new_key("owner")
    ds = _dataset(h, owner)
    for path in ("/releases/preview", "/releases"):
        refused = _error(h.client.post(path, json=_lp(ds["id"]), headers=h.headers(owner)))
        assert "not a valid bound" in refused and "research: true" in refused
        # A valid accountant takes no opt-in: an ordinary release must not pass as research.
        valid = {**_lp(ds["id"], research=True), "accountant": "tight"}
        assert "drop `research`" in _error(
            h.client.post(path, json=valid, headers=h.headers(owner))
        )
        # ClustMix's fixed accountant analyses a clustering nobody runs: not even research.
        fixed = {
            "dataset_id": ds["id"],
            "mechanism": "clustmix",
            "params": {"variant": "paper", "cluster_size": 20},
            "epsilon": 8.0,
            "accountant": "fixed",
            "research": True,
        }
        message = _error(h.client.post(path, json=fixed, headers=h.headers(owner)))
        assert "does not run" in message and "dprelease account clustmix" in message
    # Each variant is analysed by its own accountant only.
    mixed = {
        "dataset_id": ds["id"],
        "mechanism": "clustmix",
        "params": {"variant": "paper", "cluster_size": 20},
        "epsilon": 8.0,
    }
    assert "variant='dp' only" in _error(
        h.client.post("/releases/preview", json=mixed, headers=h.headers(owner))
    )
    # Fields of one variant are refused under the other, never silently ignored.
    r = h.client.post(
        "/releases/preview",
        json={**mixed, "params": {"alpha": 0.2}},
        headers=h.headers(owner),
    )
    assert r.status_code == 422 and "alpha does not apply to variant dp" in r.text
    assert h.client.get(f"/budgets/{ds['id']}", headers=h.headers(owner)).json()["entries"] == []


@pytest.mark.modes("real")
def test_a_research_release_is_owner_only_free_and_says_so(harness: Harness) -> None:
    h = harness
    owner, _ = h.new_key("owner")
    analyst, analyst_id = h.new_key("analyst")
    ds = _dataset(h, owner)
    r = h.client.post(
        f"/datasets/{ds['id']}/grants",
        json={"principal_id": analyst_id},
        headers=h.headers(owner),
    )
    assert r.status_code == 201, r.text
    body = _lp(ds["id"], research=True)

    preview = h.client.post("/releases/preview", json=body, headers=h.headers(owner))
    assert preview.status_code == 200, preview.text
    p = preview.json()
    assert p["charge"] == {
        "epsilon": 0.0,
        "delta": 0.0,
        "charged_as": "research",
        "consumed_epsilon": 0.0,
        "consumed_delta": 0.0,
    }
    assert p["budget"]["admissible"] and p["budget"]["remaining_after"] == BUDGET["epsilon"]
    claim = p["research"]
    assert (
        0 < claim["claimed_epsilon"] <= 8.0 and "NOT differentially private" in claim["statement"]
    )

    created = h.client.post("/releases", json=body, headers=h.headers(owner))
    assert created.status_code == 202, created.text
    release = created.json()
    assert release["research"]["statement"] == claim["statement"]
    assert release["charge"]["epsilon"] == 0.0 and release["charge"]["charged_as"] == "research"
    done = h.wait(owner, release["id"])
    assert done["status"] == "succeeded", done

    # The budget is untouched; the ledger states the claim in words, at zero cost.
    ledger = h.client.get(f"/budgets/{ds['id']}", headers=h.headers(owner)).json()
    assert ledger["spent"] == 0 and ledger["remaining"] == BUDGET["epsilon"]
    (entry,) = ledger["entries"]
    assert entry["state"] == "research" and entry["epsilon"] == 0 and entry["delta"] == 0
    assert entry["research"] == claim["statement"] and entry["running_total"] == 0
    assert entry["settled_at"] == entry["created_at"]  # its timing says nothing of the job
    summary = h.client.get("/budgets", headers=h.headers(owner)).json()["items"]
    assert [s["release_count"] for s in summary if s["dataset_id"] == ds["id"]] == [0]

    # The file says it first thing.
    npz = np.load(io.BytesIO(h.download(owner, release["id"])))
    meta = json.loads(str(npz["metadata"]))
    assert meta["research"]["statement"] == claim["statement"]
    assert meta["charge"] == {"epsilon": 0.0, "delta": 0.0}

    # Nobody else sees it: the granted analyst and the admin get the 404 of a missing id.
    for key in (analyst, h.admin_key):
        for path in ("", "/download"):
            r = h.client.get(f"/releases/{release['id']}{path}", headers=h.headers(key))
            assert r.status_code == 404, (key, path, r.text)
        listed = h.client.get("/releases", headers=h.headers(key)).json()["items"]
        assert release["id"] not in {x["id"] for x in listed}
    # Nor its ledger entry: the admin's ledger omits it (tests/integration/
    # test_research_privacy.py checks every channel).
    audit = h.client.get(f"/budgets/{ds['id']}", headers=h.headers(h.admin_key)).json()
    assert audit["entries"] == []

    # An ordinary release afterwards is charged as if the research release had not happened.
    normal = h.client.post(
        "/releases",
        json={**body, "accountant": "tight", "research": False},
        headers=h.headers(owner),
    )
    assert normal.status_code == 202, normal.text
    assert h.wait(owner, normal.json()["id"])["status"] == "succeeded"
    after = h.client.get(f"/budgets/{ds['id']}", headers=h.headers(owner)).json()
    assert after["spent"] == pytest.approx(normal.json()["charge"]["epsilon"], rel=1e-8)
    listed = h.client.get("/releases", headers=h.headers(analyst)).json()["items"]
    assert [x["id"] for x in listed] == [normal.json()["id"]]


@pytest.mark.modes("real")
def test_clustmix_both_variants_through_the_cli(harness: Harness) -> None:
    # The CLI waits for each release; files come through the harness, which follows real
    # mode's presigned redirect to the object store (the test client cannot).
    h = harness
    owner, _ = h.new_key("owner")
    ds = _dataset(h, owner, n=300)
    common = ("--mechanism", "clustmix", "--epsilon", "8", "--poll-interval", "0.05")

    dp = h.cli(owner, "release", ds["id"], *common, "-p", "clusters_per_class=2", "--wait")
    assert dp["status"] == "succeeded" and dp["research"] is None
    assert 0 < dp["charge"]["epsilon"] <= 8.0 and dp["params"]["variant"] == "dp"

    # The paper variant: σ_max fixes l_min (recorded in the params), research opt-in required.
    paper_args = ("-p", "variant=paper", "-p", "sigma_max=0.5", "--accountant", "paper")
    preview = h.cli(owner, "preview", ds["id"], *common[:4], *paper_args, "--research")
    ell = preview["params"]["cluster_size"]
    assert ell >= 2 and preview["noise"]["sigma_x"] <= 0.5
    assert preview["charge"]["epsilon"] == 0 and preview["research"]["claimed_epsilon"] <= 8.0
    paper = h.cli(owner, "release", ds["id"], *common, *paper_args, "--research", "--wait")
    assert paper["status"] == "succeeded" and paper["research"]["claimed_epsilon"] <= 8.0
    assert paper["params"]["cluster_size"] == ell
    npz = np.load(io.BytesIO(h.download(owner, paper["id"])))
    X, y = npz["X"], npz["y"]
    # One row per cluster of ≥ l records within a class: at most ⌊n_c/l⌋ per class.
    _, labels = toy_dataset(n=300)[:2]
    counts = np.bincount(np.asarray(labels, dtype=np.int64), minlength=3)
    assert 0 < len(X) <= int((counts // ell).sum())
    assert np.all(y.sum(axis=1) == 1)
    assert json.loads(str(npz["metadata"]))["research"]["claimed_epsilon"] <= 8.0

    ledger = h.cli(owner, "budgets", ds["id"])
    states = sorted(e["state"] for e in ledger["entries"])
    assert states == ["committed", "research"]
    assert ledger["spent"] == pytest.approx(dp["charge"]["epsilon"], rel=1e-8)


def test_the_database_keeps_research_entries_free(harness: Harness) -> None:
    """Whatever code writes, a research entry never holds budget (migration 0014)."""
    from sqlalchemy import select
    from sqlalchemy.exc import IntegrityError

    from service.models import LedgerEntry

    h = harness
    owner, _ = h.new_key("owner")
    ds = _dataset(h, owner)
    created = h.client.post(
        "/releases", json=_lp(ds["id"], research=True), headers=h.headers(owner)
    )
    assert created.status_code == 202, created.text
    h.wait(owner, created.json()["id"])
    for change in ({"epsilon": 0.5}, {"consumed_delta": 1e-6}, {"delta": 1e-7}):
        with h.runtime.session_factory() as session:
            entry = session.scalars(
                select(LedgerEntry).where(LedgerEntry.release_id == created.json()["id"])
            ).one()
            for name, value in change.items():
                setattr(entry, name, value)
            with pytest.raises(IntegrityError):
                session.commit()
