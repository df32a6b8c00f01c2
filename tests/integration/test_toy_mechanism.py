"""A mechanism defined only in the test suite (tests/toy_mechanism.py) runs everywhere the
built-in ones do: the request schema and GET /mechanisms, preview, release, download,
`dprelease account` and `dprelease audit`, in embedded and real mode — registered, with no edit
anywhere else. It has three noise scales in two composed steps, so it also shows that such a
release is planned, admitted, charged once and stored with its whole noise description."""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from dpcore.accounting import gdp
from dpcore.mechanisms import registry
from dprelease_cli.main import cli
from tests import toy_mechanism as toy
from tests.conftest import Harness, npz_bytes, toy_dataset

DELTA = 1e-5


def _mu(n: int, rows: int, sigma: float, sigma_y: float, totals: float) -> float:
    return math.sqrt(2 / totals**2 + rows * (2 / n**2) * (1 / sigma**2 + 1 / sigma_y**2))


def test_a_test_only_mechanism_runs_through_the_service(toy_harness: Harness) -> None:
    h = toy_harness
    owner, _ = h.new_key("owner")
    X, y = toy_dataset()
    ds = h.upload(owner, npz_bytes(X, y)).json()

    catalogue = h.client.get("/mechanisms", headers=h.headers(owner)).json()["items"]
    mine = next(m for m in catalogue if m["name"] == toy.NAME)
    assert set(mine["params_schema"]["properties"]) == {
        "rows",
        "totals_noise",
        "own_progress",
        "with_weights",
        "postprocess",
    }
    assert [a["name"] for a in mine["accountants"]] == ["tight"]
    schema = h.client.get("/openapi.json").json()["components"]["schemas"]
    assert "ToyAverageRequest" in schema and "ToyParams" in schema

    body = {
        "dataset_id": ds["id"],
        "mechanism": toy.NAME,
        "params": {"rows": 40, "totals_noise": 20.0},
        "epsilon": 2.0,
        "noise_ratio": 2.0,
    }
    preview = h.client.post("/releases/preview", json=body, headers=h.headers(owner))
    assert preview.status_code == 200, preview.text
    p = preview.json()
    scales = {s["name"]: s for s in p["noise"]["scales"]}
    assert set(scales) == {"totals", "features", "labels"}
    assert scales["totals"]["sigma"] == 20.0
    assert scales["features"]["sensitivity"] == pytest.approx(math.sqrt(2) / 200)
    assert p["noise"]["sigma_y"] == pytest.approx(2 * p["noise"]["sigma_x"])
    # One charge for both steps: the exact GDP composition, calibrated just under ε = 2.
    mu = _mu(200, 40, p["noise"]["sigma_x"], p["noise"]["sigma_y"], 20.0)
    assert p["charge"]["epsilon"] == pytest.approx(
        gdp.epsilon_of(mu, p["charge"]["delta"]), rel=1e-8
    )
    assert 1.99 < p["charge"]["epsilon"] <= 2.0

    r = h.client.post("/releases", json=body, headers=h.headers(owner))
    assert r.status_code == 202, r.text
    created = r.json()
    assert created["noise"] == p["noise"] and created["charge"] == p["charge"]
    done = h.wait(owner, created["id"])
    assert done["status"] == "succeeded", done
    assert done["noise"] == p["noise"]

    npz = np.load(io.BytesIO(h.download(owner, done["id"])))
    assert npz["X"].shape == (40, 6) and npz["y"].shape == (40, 3)
    assert npz["totals"].shape == (1, 6)
    meta = json.loads(str(npz["metadata"]))
    assert meta["mechanism"] == toy.NAME
    assert meta["noise"] == {**p["noise"]}
    assert meta["columns"] == toy.SPEC.guidance.output
    # The means are around the data's unit-scale mean; labels around the class frequencies.
    frequencies = np.bincount(y, minlength=3) / len(y)
    tolerance = 6 * p["noise"]["sigma_y"] / math.sqrt(40)
    assert np.abs(npz["y"].mean(axis=0) - frequencies).max() < tolerance

    ledger = h.client.get(f"/budgets/{ds['id']}", headers=h.headers(owner)).json()
    assert ledger["spent"] == pytest.approx(p["charge"]["epsilon"])


def test_the_toy_is_known_to_account_and_audit() -> None:
    with registry.registered(toy.SPEC):
        runner = CliRunner()
        keys = ["n=200", "rows=40", "totals_noise=20"]
        result = runner.invoke(
            cli,
            ["account", toy.NAME, *keys, "--sigma", "0.05", "--delta", "1e-5"],
            catch_exceptions=False,
        )
        assert result.exit_code == 0, result.output
        out = json.loads(result.output)
        assert [s["name"] for s in out["noise"]["scales"]] == ["totals", "features", "labels"]
        mu = _mu(200, 40, 0.05, 0.05, 20.0)
        assert out["epsilon"] == pytest.approx(gdp.epsilon_of(mu, DELTA), rel=1e-9)
        assert toy.NAME in runner.invoke(cli, ["account", "--help"]).output

        result = runner.invoke(
            cli, ["audit", toy.NAME, "--epsilon", "2", "--trials", "4000"], catch_exceptions=False
        )
        assert result.exit_code == 0, result.output
        audit = json.loads(result.output)
        assert audit["epsilon_claimed"] == pytest.approx(2.0, rel=1e-6)
        assert 0.5 < audit["epsilon_lower_bound"] < audit["epsilon_claimed"]
        assert toy.NAME in runner.invoke(cli, ["audit", "--help"]).output
    assert toy.NAME not in [s.name for s in registry.specs()]
