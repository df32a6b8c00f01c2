"""Upload → preview → release → download → ledger: the whole path and a failing job in
embedded and real modes, the admission and accounting checks in real mode."""

from __future__ import annotations

import hashlib
import io
import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from dpcore.mechanisms.dpmix.accounting import DPMixRecordEvent
from dpcore.mechanisms.dpmix.accounting_paper import DPMixPaperEvent
from dpcore.mechanisms.dpmix.accounting_pld import DPMixPLDEvent
from tests.conftest import Harness, npz_bytes, toy_dataset


def _dataset(h: Harness, owner: str, **meta: object) -> dict[str, object]:
    X, y = toy_dataset()
    r = h.upload(owner, npz_bytes(X, y), **meta)
    assert r.status_code == 201, r.text
    body: dict[str, object] = r.json()
    return body


def test_release_end_to_end(harness: Harness) -> None:
    h = harness
    owner, _ = h.new_key("owner")
    ds = _dataset(h, owner)
    assert ds["n_rows"] == 200 and ds["n_features"] == 6 and ds["classes"] == [0, 1, 2]
    assert ds["budget"] == {
        "epsilon": 5.0,
        "delta": 1e-5,
        "spent": 0.0,
        "reserved": 0.0,
        "remaining": 5.0,
        "delta_spent": 0.0,
        "delta_reserved": 0.0,
        "delta_remaining": 1e-5,
    }

    body = h.release_body(ds["id"], epsilon=2.0, delta=1e-5)
    preview = h.client.post("/releases/preview", json=body, headers=h.headers(owner))
    assert preview.status_code == 200, preview.text
    p = preview.json()
    assert p["charge"]["epsilon"] <= 2.0
    assert p["budget"]["admissible"] is True
    assert p["budget"]["remaining_after"] == pytest.approx(5.0 - p["charge"]["epsilon"], abs=1e-6)
    # The calibrated noise costs what the accountant says, independently recomputed.
    event = DPMixPLDEvent(200, 8, 300, p["noise"]["sigma_x"], p["noise"]["sigma_y"])
    assert event.epsilon(1e-5) <= 2.0
    assert event.epsilon(1e-5) == pytest.approx(p["charge"]["epsilon"], rel=1e-6)
    assert p["charge"]["charged_as"] == p["budget"]["charged_as"] == "basic"
    assert p["charge"]["consumed_epsilon"] == p["budget"]["total_after"]
    # Preview charges nothing.
    ledger = h.client.get(f"/budgets/{ds['id']}", headers=h.headers(owner)).json()
    assert ledger["entries"] == [] and ledger["reserved"] == 0.0

    r = h.client.post("/releases", json=body, headers=h.headers(owner))
    assert r.status_code == 202, r.text
    created = r.json()
    assert created["status"] in ("queued", "running", "succeeded")
    assert created["noise"] == p["noise"] and created["charge"] == p["charge"]

    done = h.wait(owner, created["id"])
    assert done["status"] == "succeeded", done
    assert done["progress"] == 1.0 and done["attempts"] == 1
    assert done["timings"]["run_seconds"] is not None
    content = h.download(owner, created["id"])
    assert hashlib.sha256(content).hexdigest() == done["artifact"]["sha256"]
    assert len(content) == done["artifact"]["bytes"]

    npz = np.load(io.BytesIO(content))
    assert npz["X"].shape == (300, 6) and npz["y"].shape == (300, 3)
    meta = json.loads(str(npz["metadata"]))
    assert meta["mechanism"] == "dpmix" and meta["release_id"] == created["id"]
    own = {k: p["charge"][k] for k in ("epsilon", "delta")}  # the release's own guarantee
    assert meta["noise"] == p["noise"] and meta["charge"] == own
    # No function of the raw data travels with the release (a hash would let anyone who knows
    # all records but one test candidates for the last); the owner-side provenance has it.
    assert "dataset_sha256" not in meta and ds["sha256"] not in json.dumps(meta)
    provenance = json.loads(h.runtime.store.get(f"releases/{created['id']}/metadata.json"))
    assert provenance["dataset_sha256"] == ds["sha256"]
    assert {"torch", "numpy", "dp-accounting"} <= set(meta["versions"])
    # Mixed one-hot labels: rows sum to ≈ 1 plus noise of std σ_y·√k.
    row_sums = npz["y"].sum(axis=1)
    assert abs(row_sums.mean() - 1.0) < 5 * p["noise"]["sigma_y"] * np.sqrt(3 / 300) + 1e-3

    ledger = h.client.get(f"/budgets/{ds['id']}", headers=h.headers(owner)).json()
    assert [e["state"] for e in ledger["entries"]] == ["committed"]
    assert ledger["spent"] == pytest.approx(p["charge"]["epsilon"], rel=1e-8)
    assert ledger["entries"][0]["release_id"] == created["id"]
    assert ledger["entries"][0]["running_total"] == ledger["spent"]


@pytest.mark.modes("real")
def test_budget_refusal_leaves_ledger_unchanged(harness: Harness) -> None:
    h = harness
    owner, _ = h.new_key("owner")
    ds = _dataset(h, owner)
    first = h.client.post(
        "/releases", json=h.release_body(ds["id"], epsilon=5.0), headers=h.headers(owner)
    )
    assert first.status_code == 202, first.text
    before = h.client.get(f"/budgets/{ds['id']}", headers=h.headers(owner)).json()

    second = h.client.post(
        "/releases", json=h.release_body(ds["id"], epsilon=0.5), headers=h.headers(owner)
    )
    assert second.status_code == 409, second.text
    err = second.json()["error"]
    assert err["code"] == "budget_exceeded"
    assert err["detail"]["requested"]["epsilon"] <= 0.5
    assert err["detail"]["remaining"] < 0.5
    assert err["detail"]["total_after"] > 5.0
    # ε is short, by the total's excess over the budget (δ too here: the first release
    # took the budget's default δ share).
    excess = err["detail"]["total_after"] - err["detail"]["budget"]["epsilon"]
    delta_excess = err["detail"]["delta_after"] - err["detail"]["budget"]["delta"]
    assert err["detail"]["short"] == {
        "epsilon": pytest.approx(excess),
        "delta": pytest.approx(max(0.0, delta_excess)),
    }
    assert err["message"].startswith(f"ε is short by {excess:.4g}"), err["message"]
    assert "smaller 'epsilon'" in err["message"]
    h.wait(owner, first.json()["id"])
    after = h.client.get(f"/budgets/{ds['id']}", headers=h.headers(owner)).json()
    assert len(after["entries"]) == len(before["entries"]) == 1
    releases = h.client.get(f"/releases?dataset_id={ds['id']}", headers=h.headers(owner)).json()
    assert len(releases["items"]) == 1


@pytest.mark.modes("real")
def test_the_filter_adds_up_releases_and_refuses_what_would_pass(harness: Harness) -> None:
    h = harness
    owner, _ = h.new_key("owner")
    ds = _dataset(h, owner, budget={"epsilon": 3.0, "delta": 1e-5})
    ids = []
    for _ in range(2):
        r = h.client.post(
            "/releases", json=h.release_body(ds["id"], epsilon=1.2), headers=h.headers(owner)
        )
        assert r.status_code == 202, r.text
        # Default δ: the δ left times the release's share of the ε left; after basic charges
        # that is the budget's δ share (a hair less: calibration lands just under its ε).
        assert r.json()["charge"]["delta"] == pytest.approx(1e-5 * 1.2 / 3.0, rel=1e-6)
        assert r.json()["charge"]["delta"] < 1e-5 * 1.2 / 3.0
        ids.append(r.json()["id"])
    # A third at the same noise would bring the filter to 3.6 > 3 (these PLD-calibrated
    # releases are cheapest as basic charges, and their RDP curves do not fit either).
    third = h.client.post(
        "/releases", json=h.release_body(ds["id"], epsilon=1.2), headers=h.headers(owner)
    )
    assert third.status_code == 409, third.text
    assert third.json()["error"]["detail"]["total_after"] > 3.0
    for rid in ids:
        assert h.wait(owner, rid)["status"] == "succeeded"
    summary = h.client.get("/budgets", headers=h.headers(owner)).json()["items"]
    (mine,) = [s for s in summary if s["dataset_id"] == ds["id"]]
    assert mine["release_count"] == 2
    charges = [
        h.client.get(f"/releases/{rid}", headers=h.headers(owner)).json()["charge"] for rid in ids
    ]
    assert [c["charged_as"] for c in charges] == ["basic", "basic"]
    assert mine["spent"] == pytest.approx(sum(c["epsilon"] for c in charges), rel=1e-8)
    assert mine["delta_spent"] == pytest.approx(sum(c["delta"] for c in charges), rel=1e-12)
    assert 0 < mine["delta_remaining"] <= 1e-5 - mine["delta_spent"]


@pytest.mark.modes("real")
def test_noise_mode_reports_epsilon(harness: Harness) -> None:
    h = harness
    owner, _ = h.new_key("owner")
    ds = _dataset(h, owner)
    body = h.release_body(ds["id"], noise={"sigma_x": 0.5, "sigma_y": 1.0})
    del body["epsilon"]
    r = h.client.post("/releases/preview", json=body, headers=h.headers(owner))
    assert r.status_code == 200, r.text
    expected = DPMixPLDEvent(200, 8, 300, 0.5, 1.0).epsilon(r.json()["charge"]["delta"])
    assert r.json()["charge"]["epsilon"] == pytest.approx(expected, rel=1e-8)
    assert r.json()["charge"]["epsilon"] >= expected
    noise = r.json()["noise"]
    assert (noise["sigma_x"], noise["sigma_y"], noise["sampler"]) == (0.5, 1.0, "secure")
    assert {s["name"]: (s["sigma"], s["sensitivity"]) for s in noise["scales"]} == {
        "features": (0.5, pytest.approx(2**0.5 / 8)),
        "labels": (1.0, pytest.approx(2**0.5 / 8)),
    }


@pytest.mark.modes("real")
@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_tabular_formats(harness: Harness, fmt: str) -> None:
    h = harness
    owner, _ = h.new_key("owner")
    ds = _dataset(h, owner)
    r = h.client.post(
        "/releases",
        json=h.release_body(ds["id"], format=fmt, params={"mixture_degree": 4, "n_samples": 50}),
        headers=h.headers(owner),
    )
    assert r.status_code == 202, r.text
    done = h.wait(owner, r.json()["id"])
    assert done["status"] == "succeeded", done
    content = h.download(owner, done["id"])
    if fmt == "parquet":
        table = pq.read_table(io.BytesIO(content))
        meta = json.loads(table.schema.metadata[b"dprelease"])
        assert meta["release_id"] == done["id"]
        columns = table.column_names
    else:
        columns = content.decode().splitlines()[0].replace('"', "").split(",")
        assert len(content.decode().strip().splitlines()) == 51
    # An NPZ upload's features are named by index and its label "label" (it has no label
    # column); dpmix's noisy labels are class proportions.
    assert columns == [str(i) for i in range(6)] + ["label=0", "label=1", "label=2"]


def test_failed_job_before_output_is_refunded(harness: Harness) -> None:
    h = harness
    owner, _ = h.new_key("owner")
    ds = _dataset(h, owner)
    # Corrupt the stored raw data: the worker checks its sha256 and must fail cleanly.
    key = f"datasets/{ds['id']}/raw.npz"
    h.runtime.store.delete(key)
    h.runtime.store.put(key, b"not the dataset")
    r = h.client.post("/releases", json=h.release_body(ds["id"]), headers=h.headers(owner))
    assert r.status_code == 202
    done = h.wait(owner, r.json()["id"])
    assert done["status"] == "failed"
    assert "sha256" in done["error"]
    assert done["artifact"] is None
    ledger = h.client.get(f"/budgets/{ds['id']}", headers=h.headers(owner)).json()
    assert [e["state"] for e in ledger["entries"]] == ["refunded"]
    assert ledger["spent"] == 0.0 and ledger["remaining"] == 5.0
    dl = h.client.get(f"/releases/{done['id']}/download", headers=h.headers(owner))
    assert dl.status_code == 409
    # A granted analyst learns that it failed, not the error text (it may quote raw data).
    analyst, analyst_id = h.new_key("analyst")
    h.client.post(
        f"/datasets/{ds['id']}/grants", json={"principal_id": analyst_id}, headers=h.headers(owner)
    )
    seen = h.client.get(f"/releases/{done['id']}", headers=h.headers(analyst)).json()
    assert seen["status"] == "failed" and seen["error"] == "failed"


@pytest.mark.modes("real")
def test_release_validation(harness: Harness) -> None:
    h = harness
    owner, _ = h.new_key("owner")
    ds = _dataset(h, owner)
    cases = [
        (h.release_body(ds["id"], params={"mixture_degree": 201, "n_samples": 10}), "exceeds"),
        (h.release_body(ds["id"], delta=1e-3), "larger than the dataset's budget delta"),
        (h.release_body(ds["id"], epsilon=-1), "epsilon"),
        (h.release_body(ds["id"], noise={"sigma_x": 1.0}), "exactly one"),
        (h.release_body(ds["id"], mechanism="nope"), "mechanism"),
        (h.release_body(ds["id"], params={"mixture_degree": 0, "n_samples": 10}), "mixture"),
    ]
    for body, phrase in cases:
        r = h.client.post("/releases", json=body, headers=h.headers(owner))
        assert r.status_code == 422, (body, r.text)
        assert phrase in r.json()["error"]["message"], r.text
    missing = h.client.post(
        "/releases", json=h.release_body("no-such-dataset"), headers=h.headers(owner)
    )
    assert missing.status_code == 404
    assert h.client.get(f"/budgets/{ds['id']}", headers=h.headers(owner)).json()["entries"] == []


@pytest.mark.modes("real")
def test_paper_accountant_through_the_service(harness: Harness) -> None:
    h = harness
    owner, _ = h.new_key("owner")
    ds = _dataset(h, owner, budget={"epsilon": 50.0, "delta": 1e-5})
    body = h.release_body(ds["id"], accountant="paper", epsilon=20.0)
    r = h.client.post("/releases/preview", json=body, headers=h.headers(owner))
    assert r.status_code == 200, r.text
    p = r.json()
    assert p["accountant"] == "paper" and p["charge"]["epsilon"] <= 20.0
    # Same numbers as the offline accountant (`dprelease account dpmix --accountant paper`).
    paper = DPMixPaperEvent(200, 8, 300, p["noise"]["sigma_x"], p["noise"]["sigma_y"], 6, 3)
    assert paper.epsilon(p["charge"]["delta"]) == pytest.approx(p["charge"]["epsilon"], rel=1e-8)
    tight = h.client.post(
        "/releases/preview", json={**body, "accountant": "tight"}, headers=h.headers(owner)
    ).json()
    assert tight["noise"]["sigma_x"] < p["noise"]["sigma_x"]
    created = h.client.post("/releases", json=body, headers=h.headers(owner))
    assert created.status_code == 202, created.text
    done = h.wait(owner, created.json()["id"])
    assert done["status"] == "succeeded" and done["accountant"] == "paper"
    ledger = h.client.get(f"/budgets/{ds['id']}", headers=h.headers(owner)).json()
    assert ledger["entries"][0]["accountant"] == "paper"
    # A basic charge: the spend is the charge (rounded up once more by the ledger).
    assert p["charge"]["epsilon"] <= ledger["spent"] <= p["charge"]["epsilon"] * (1 + 2e-9)


@pytest.mark.modes("real")
def test_record_assignment_release(harness: Harness) -> None:
    h = harness
    owner, _ = h.new_key("owner")
    ds = _dataset(h, owner)
    params = {"mixture_degree": 8, "n_samples": 100, "assignment": "record"}
    body = h.release_body(ds["id"], params=params, epsilon=3.0)
    r = h.client.post("/releases", json=body, headers=h.headers(owner))
    assert r.status_code == 202, r.text
    created = r.json()
    assert created["params"]["assignment"] == "record"
    # Charged with the record variant's accountant (Gaussian mechanism, GDP), not Theorem 1's.
    event = DPMixRecordEvent(200, 8, 100, created["noise"]["sigma_x"], created["noise"]["sigma_y"])
    delta = created["charge"]["delta"]
    assert event.epsilon(delta) == pytest.approx(created["charge"]["epsilon"], rel=1e-8)
    done = h.wait(owner, created["id"])
    assert done["status"] == "succeeded", done
    npz = np.load(io.BytesIO(h.download(owner, done["id"])))
    assert npz["X"].shape == (100, 6) and npz["y"].shape == (100, 3)
