"""DPGM through the service: a release trains the networks on the worker (real mode: the gpu
queue), ships the samples and the weights, and is charged one ledger entry for the whole
pipeline — the tight accountant's ε of the stored parameters; the CLI runs one in embedded
mode, where it downloads the files itself."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load

from dpcore.mechanisms import registry
from tests.conftest import Harness, npz_bytes, toy_dataset

PARAMS = {
    "epochs": 1,
    "batch_size": 50,
    "hidden": 8,
    "clusters_per_class": 2,
    "kmeans_refine": 0,
    "n_samples": 120,
    "weights": True,
}


@pytest.mark.modes("real")
def test_dpgm_release_samples_weights_and_one_charge(harness: Harness) -> None:
    h = harness
    owner, _ = h.new_key("owner")
    ds = h.upload(owner, npz_bytes(*toy_dataset()), budget={"epsilon": 20.0, "delta": 1e-5})
    assert ds.status_code == 201, ds.text
    dataset = ds.json()
    body = {"dataset_id": dataset["id"], "mechanism": "dpgm", "params": PARAMS, "epsilon": 5.0}
    r = h.client.post("/releases", json=body, headers=h.headers(owner))
    assert r.status_code == 202, r.text
    created = r.json()
    assert created["charge"]["epsilon"] <= 5.0

    # The charge is the tight accountant's ε for the stored parameters at the calibrated σ.
    spec = registry.get("dpgm")
    acc = spec.accountant("tight")
    keys = {
        k: v
        for k, v in {"n": 200, "d_x": 6, "d_y": 3, **created["params"]}.items()
        if k in acc.key_names
    }
    event = acc.at_sigma(created["noise"]["sigma_x"], keys)
    exact = event.epsilon(created["charge"]["delta"])
    # The ledger rounds against the user: never below the accountant's ε.
    assert exact <= created["charge"]["epsilon"] <= exact * (1 + 1e-8)

    done = h.wait(owner, created["id"])
    assert done["status"] == "succeeded", done
    npz = np.load(io.BytesIO(h.download(owner, done["id"])))
    assert npz["X"].shape == (120, 6) and npz["y"].shape == (120, 3)
    assert set(npz["y"].sum(axis=1).tolist()) == {1.0}
    meta = json.loads(str(npz["metadata"]))
    assert meta["mechanism"] == "dpgm" and meta["device"] == "cpu"
    (artifact,) = done["artifacts"]
    assert artifact["name"] == "weights.safetensors"
    weights = load(h.download(owner, done["id"], artifact["name"]))
    models = weights["cluster_class"].shape[0]
    assert 1 <= models <= 6 and weights["enc_w"].shape == (models, 6, 8)

    ledger = h.client.get(f"/budgets/{dataset['id']}", headers=h.headers(h.admin_key))
    assert ledger.status_code == 200, ledger.text
    entries = [e for e in ledger.json()["entries"] if e["release_id"] == done["id"]]
    assert len(entries) == 1 and entries[0]["epsilon"] == created["charge"]["epsilon"]


@pytest.mark.modes("embedded")
def test_dpgm_with_the_cli(harness: Harness, tmp_path: Path) -> None:
    h = harness
    owner, _ = h.new_key("owner")
    ds = h.upload(owner, npz_bytes(*toy_dataset()), budget={"epsilon": 20.0, "delta": 1e-5})
    assert ds.status_code == 201, ds.text
    params = [f"{k}={str(v).lower()}" for k, v in PARAMS.items()]
    # Embedded mode: the CLI downloads the files itself (real mode redirects downloads to the
    # store, which the test client cannot follow).
    out = tmp_path / "samples.npz"
    rel = h.cli(
        owner,
        "release",
        ds.json()["id"],
        "--mechanism",
        "dpgm",
        *(arg for p in params for arg in ("-p", p)),
        "--epsilon",
        "5",
        "--output",
        str(out),
        "--poll-interval",
        "0.05",
    )
    assert rel["status"] == "succeeded", rel
    assert np.load(out)["X"].shape == (120, 6)
    weights = tmp_path / "weights.safetensors"
    h.cli(
        owner, "download", rel["id"], "--artifact", "weights.safetensors", "--output", str(weights)
    )
    assert "cluster_class" in load(weights.read_bytes())
