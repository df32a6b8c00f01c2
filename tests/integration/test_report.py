"""The owner-only utility report: computed on the owner's held-out raw data, shown to nobody
else."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import Harness, npz_bytes, toy_dataset


@pytest.mark.modes("real")
def test_owner_report(harness: Harness) -> None:
    h = harness
    owner, _ = h.new_key("owner")
    other, _ = h.new_key("owner")
    analyst, analyst_id = h.new_key("analyst")
    ds = h.upload(
        owner, npz_bytes(*toy_dataset(n=300, seed=0)), budget={"epsilon": 20.0, "delta": 1e-5}
    ).json()
    held_out = h.upload(owner, npz_bytes(*toy_dataset(n=150, seed=1))).json()
    body = h.release_body(
        ds["id"],
        params={"mixture_degree": 4, "n_samples": 400},
        epsilon=10.0,
        report_test_dataset_id=held_out["id"],
    )
    r = h.client.post("/releases", json=body, headers=h.headers(owner))
    assert r.status_code == 202, r.text
    rid = r.json()["id"]
    assert r.json()["report"] == f"/releases/{rid}/report"
    assert h.wait(owner, rid)["status"] == "succeeded"

    report = h.client.get(f"/releases/{rid}/report", headers=h.headers(owner))
    assert report.status_code == 200, report.text
    body_json = report.json()
    assert (
        "owner only" in body_json["visibility"]
        and "not differentially private" in body_json["visibility"]
    )
    assert body_json["test_rows"] == 150
    assert 0.0 <= body_json["accuracy"]["linear"] <= 1.0

    h.client.post(
        f"/datasets/{ds['id']}/grants", json={"principal_id": analyst_id}, headers=h.headers(owner)
    )
    assert h.client.get(f"/releases/{rid}", headers=h.headers(analyst)).json()["report"] is None
    # Refused by role before any lookup (the same for any id); another owner: not theirs.
    for key, code in ((analyst, 403), (h.admin_key, 403), (other, 404)):
        assert h.client.get(f"/releases/{rid}/report", headers=h.headers(key)).status_code == code


def test_report_dataset_must_be_the_owners_and_compatible(embedded: Harness) -> None:
    h = embedded
    owner, _ = h.new_key("owner")
    other, _ = h.new_key("owner")
    ds = h.upload(owner, npz_bytes(*toy_dataset())).json()
    X, y = toy_dataset(d=4)
    narrow = h.upload(owner, npz_bytes(X, y)).json()
    foreign = h.upload(other, npz_bytes(*toy_dataset())).json()
    cases = [
        (narrow["id"], 422, "same features"),
        (foreign["id"], 404, "not found"),
        (ds["id"], 422, "held out"),
    ]
    for test_id, status, phrase in cases:
        body = h.release_body(ds["id"], report_test_dataset_id=test_id)
        r = h.client.post("/releases", json=body, headers=h.headers(owner))
        assert r.status_code == status, r.text
        assert phrase in r.json()["error"]["message"]
    no_report = h.client.post(
        "/releases", json=h.release_body(ds["id"]), headers=h.headers(owner)
    ).json()
    assert (
        h.client.get(f"/releases/{no_report['id']}/report", headers=h.headers(owner)).status_code
        == 404
    )
    assert np.isfinite(no_report["charge"]["epsilon"])
