"""Every served mechanism runs through POST /releases with the accountant the CLI uses."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from dpcore.mechanisms import registry
from tests.conftest import Harness, npz_bytes, toy_dataset


def _dataset(h: Harness, owner: str) -> dict:  # type: ignore[type-arg]
    r = h.upload(owner, npz_bytes(*toy_dataset()), budget={"epsilon": 50.0, "delta": 1e-5})
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


def test_catalogue_lists_mechanisms_params_and_accountants(embedded: Harness) -> None:
    h = embedded
    owner, _ = h.new_key("owner")
    r = h.client.get("/mechanisms", headers=h.headers(owner))
    assert r.status_code == 200, r.text
    items = {m["name"]: m for m in r.json()["items"]}
    assert {"dpmix", "local_perturbation", "random_projection"} <= set(items)
    assert "mixture_degree" in items["dpmix"]["params_schema"]["properties"]
    assert "projection_dim" in items["random_projection"]["params_schema"]["properties"]
    paper = {a["name"]: a for a in items["local_perturbation"]["accountants"]}["paper"]
    assert paper["valid_bound"] is False and paper["caveat"]
    assert h.client.get("/mechanisms").status_code == 401


@pytest.mark.modes("real")
@pytest.mark.parametrize(
    ("mechanism", "params", "width"),
    [
        ("local_perturbation", {}, 6),
        ("random_projection", {"projection_dim": 3, "spectral_norm": 2.0}, 3),
        ("sgdrm", {"mixture_width": 16, "n_samples": 150}, 6),
        ("sgdrm", {"mixture_width": 16, "n_samples": 150, "coefficients": "gaussian"}, 6),
    ],
)
def test_baseline_release(harness: Harness, mechanism: str, params: dict, width: int) -> None:  # type: ignore[type-arg]
    h = harness
    owner, _ = h.new_key("owner")
    ds = _dataset(h, owner)
    body = {
        "dataset_id": ds["id"],
        "mechanism": mechanism,
        "params": params,
        "epsilon": 8.0,
    }
    r = h.client.post("/releases", json=body, headers=h.headers(owner))
    assert r.status_code == 202, r.text
    created = r.json()
    # The stored params carry what the accountant fixed (sgdrm/gaussian: the coupling's c).
    keys = {"n": 200, "d_x": 6, "d_y": 3, **created["params"]}
    if params.get("coefficients") == "gaussian":
        assert created["params"]["coefficient_bound"] >= 3 / 4
    acc = registry.accountant(mechanism, "tight")
    declared = {k.name for k in acc.keys}
    event = acc.at_sigma(
        created["noise"]["sigma_x"],
        {
            k: v
            for k, v in {**keys, "sigma_y": created["noise"]["sigma_y"]}.items()
            if k in declared
        },
    )
    delta = created["charge"]["delta"]  # the ε share of the budget's δ (no 'delta' asked)
    assert event.epsilon(delta) == pytest.approx(created["charge"]["epsilon"], rel=1e-8)
    assert created["charge"]["epsilon"] <= 8.0
    done = h.wait(owner, created["id"])
    assert done["status"] == "succeeded", done
    npz = np.load(io.BytesIO(h.download(owner, done["id"])))
    rows = params.get("n_samples", 200)
    assert npz["X"].shape == (rows, width) and npz["y"].shape == (rows, 3)
    meta = json.loads(str(npz["metadata"]))
    assert meta["mechanism"] == mechanism
    if mechanism == "random_projection":
        projection = npz["projection"]
        assert projection.shape == (3, 6)
        assert np.linalg.norm(projection, ord=2) == pytest.approx(2.0, rel=1e-9)
    ledger = h.client.get(f"/budgets/{ds['id']}", headers=h.headers(owner)).json()
    assert ledger["entries"][0]["mechanism"] == mechanism


def test_invalid_paper_accountants_are_refused(embedded: Harness) -> None:
    h = embedded
    owner, _ = h.new_key("owner")
    ds = _dataset(h, owner)
    body = {
        "dataset_id": ds["id"],
        "mechanism": "local_perturbation",
        "params": {},
        "epsilon": 8.0,
        "accountant": "paper",
    }
    r = h.client.post("/releases/preview", json=body, headers=h.headers(owner))
    assert r.status_code == 422
    assert "not a valid bound" in r.json()["error"]["message"]


def test_projection_dim_is_checked(embedded: Harness) -> None:
    h = embedded
    owner, _ = h.new_key("owner")
    ds = _dataset(h, owner)
    body = {
        "dataset_id": ds["id"],
        "mechanism": "random_projection",
        "params": {"projection_dim": 7},
        "epsilon": 8.0,
    }
    r = h.client.post("/releases", json=body, headers=h.headers(owner))
    assert r.status_code == 422 and "projection_dim" in r.json()["error"]["message"]


def test_sgdrm_has_one_noise_level(embedded: Harness) -> None:
    h = embedded
    owner, _ = h.new_key("owner")
    ds = _dataset(h, owner)
    body = {
        "dataset_id": ds["id"],
        "mechanism": "sgdrm",
        "params": {"mixture_width": 16, "n_samples": 50},
        "noise": {"sigma_x": 1.0, "sigma_y": 2.0},
    }
    r = h.client.post("/releases/preview", json=body, headers=h.headers(owner))
    assert r.status_code == 422 and "no separate label noise" in r.json()["error"]["message"]
    body["noise"] = {"sigma_x": 1.0}
    r = h.client.post("/releases/preview", json=body, headers=h.headers(owner))
    assert r.status_code == 200, r.text
    noise = r.json()["noise"]
    assert (noise["sigma_x"], noise["sigma_y"], noise["sampler"]) == (1.0, 1.0, "secure")
    # One Gaussian on each mixture's joint (features, labels) row.
    assert [(s["name"], s["perturbs"]) for s in noise["scales"]] == [
        ("mixtures", ["features", "labels"])
    ]


@pytest.mark.modes("real")
@pytest.mark.parametrize("standardization", ["unit_range", "declared", "dp"])
def test_dpcda_release(harness: Harness, standardization: str) -> None:
    h = harness
    owner, _ = h.new_key("owner")
    ds = _dataset(h, owner)
    counts = np.bincount(toy_dataset()[1], minlength=3)
    params: dict = {  # type: ignore[type-arg]
        "mixture_degree": 8,
        "n_samples": 90,
        "clip_norm": 2.0,
        "min_class_size": int(counts.min()),
        "standardization": standardization,
        # m is read off the private counts here: the opt-in narrower relation (the default
        # 'dp' class sizes are test_default_dpcda_is_admitted_alike_on_neighbours').
        "class_sizes": "declared",
    }
    if standardization == "declared":
        params |= {"feature_mean": [6.0] * 6, "feature_std": [3.0] * 6}
    if standardization == "dp":
        params |= {"stats_noise": 5.0}
    body = {"dataset_id": ds["id"], "mechanism": "dpcda", "params": params, "epsilon": 4.0}
    r = h.client.post("/releases", json=body, headers=h.headers(owner))
    assert r.status_code == 202, r.text
    created = r.json()
    acc = registry.accountant("dpcda", "tight")
    keys = {
        "n": 200,
        "mixture_degree": 8,
        "n_samples": 90,
        "clip_norm": 2.0,
        "n_classes": 3,
        "min_class_size": int(counts.min()),
        "standardization": standardization,
        "class_sizes": "declared",
    }
    if standardization == "dp":
        # DP statistics are charged with the release: μ = √(2d)/stats_noise, d = 6.
        keys |= {"stats_noise": 5.0, "d_x": 6}
    event = acc.at_sigma(created["noise"]["sigma_x"], keys)
    delta = created["charge"]["delta"]  # the ε share of the budget's δ (no 'delta' asked)
    assert event.epsilon(delta) == pytest.approx(created["charge"]["epsilon"], rel=1e-8)
    assert created["noise"]["sigma_y"] is None  # exact labels
    scales = {s["name"]: s for s in created["noise"]["scales"]}
    # √2·C/ℓ where the features are in [0, 1] (records at most √2·C apart), else 2C/ℓ.
    spread = 2**0.5 if standardization == "unit_range" else 2.0
    assert scales["features"]["sensitivity"] == pytest.approx(spread * 2.0 / 8)
    if standardization == "dp":
        assert scales["statistics"]["sigma"] == 5.0
        assert scales["statistics"]["sensitivity"] == pytest.approx(12**0.5)
    else:
        assert set(scales) == {"features"}
    done = h.wait(owner, created["id"])
    assert done["status"] == "succeeded", done
    npz = np.load(io.BytesIO(h.download(owner, done["id"])))
    assert npz["X"].shape == (90, 6)
    assert set(np.unique(npz["y"])) == {0.0, 1.0} and (npz["y"].sum(axis=1) == 1).all()
    assert (npz["y"].sum(axis=0) == 30).all()  # class-balanced
    meta = json.loads(str(npz["metadata"]))
    # The narrower relation is stated on the release, its metadata and its ledger entry, and
    # replace-one is claimed nowhere for it.
    relation = done["neighbour_relation"]
    assert relation.startswith("replace-one (n public) over datasets whose every class has at")
    assert f"at least {int(counts.min())} records" in relation
    assert meta["accountant"]["neighbouring_relation"] == relation
    ledger = h.client.get(f"/budgets/{ds['id']}", headers=h.headers(owner)).json()
    (entry,) = [e for e in ledger["entries"] if e["release_id"] == done["id"]]
    assert entry["neighbour_relation"] == relation
    expected = {
        "declared": "declared public by the owner",
        "dp": "estimated under differential privacy, cost included in the charge",
        "unit_range": "none",
    }[standardization]
    assert meta["preprocessing"]["statistics"] == expected
    if standardization == "declared":
        # Declared statistics are public: published verbatim with the parameters.
        assert meta["params"]["feature_mean"] == [6.0] * 6
        assert meta["params"]["feature_std"] == [3.0] * 6
        assert entry["params"]["feature_mean"] == [6.0] * 6
    if standardization == "dp":
        stats = meta["preprocessing"]["dp_statistics"]
        assert len(stats["feature_mean"]) == 6 and min(stats["feature_std"]) > 0


def test_dpcda_checks_declared_facts(embedded: Harness) -> None:
    h = embedded
    owner, _ = h.new_key("owner")
    ds = _dataset(h, owner)
    counts = np.bincount(toy_dataset()[1], minlength=3)
    base = {"mixture_degree": 4, "n_samples": 30}
    cases = [
        (
            {**base, "min_class_size": int(counts.min()) + 1, "class_sizes": "declared"},
            "not a lower bound",
        ),
        ({**base, "mixture_degree": 9, "min_class_size": 8}, "at least mixture_degree"),
        ({**base, "min_class_size": 8, "standardization": "declared"}, "feature_mean"),
        (
            {
                **base,
                "min_class_size": 8,
                "standardization": "declared",
                "feature_mean": [0.0],
                "feature_std": [1.0],
            },
            "needs 6 values",
        ),
    ]
    for params, phrase in cases:
        body = {"dataset_id": ds["id"], "mechanism": "dpcda", "params": params, "epsilon": 1.0}
        r = h.client.post("/releases/preview", json=body, headers=h.headers(owner))
        assert r.status_code == 422, r.text
        assert phrase in r.json()["error"]["message"], r.text


@pytest.mark.modes("real")
@pytest.mark.parametrize("fmt", ["npz", "parquet"])
def test_postprocessed_release_keeps_the_raw_rows_for_the_owner_only(
    harness: Harness, fmt: str
) -> None:
    h = harness
    owner, _ = h.new_key("owner")
    analyst, analyst_id = h.new_key("analyst")
    ds = _dataset(h, owner)
    grant = h.client.post(
        f"/datasets/{ds['id']}/grants", json={"principal_id": analyst_id}, headers=h.headers(owner)
    )
    assert grant.status_code == 201, grant.text
    body = {
        "dataset_id": ds["id"],
        "mechanism": "dpmix",
        "params": {
            "mixture_degree": 4,
            "n_samples": 300,
            "basis": "dct",
            "basis_dim": 3,
            "postprocess": "denoise",
        },
        "epsilon": 2.0,
        "format": fmt,
    }
    r = h.client.post("/releases", json=body, headers=h.headers(owner))
    assert r.status_code == 202, r.text
    done = h.wait(owner, r.json()["id"])
    assert done["status"] == "succeeded", done
    rid = done["id"]

    def rows(content: bytes) -> tuple[np.ndarray, np.ndarray, dict]:  # type: ignore[type-arg]
        if fmt == "npz":
            npz = np.load(io.BytesIO(content))
            return npz["X"], npz["y"], json.loads(str(npz["metadata"]))
        import pyarrow.parquet as pq

        table = pq.read_table(io.BytesIO(content))
        data = np.column_stack([c.to_numpy() for c in table.columns])
        return data[:, :6], data[:, 6:], json.loads(table.schema.metadata[b"dprelease"])

    X, Y, meta = rows(h.download(analyst, rid))
    X_raw, Y_raw, raw_meta = rows(h.download(owner, rid, "raw"))
    assert X.shape == X_raw.shape == (300, 6) and Y.shape == Y_raw.shape == (300, 3)
    # Released: denoised into the public domain, labels class probabilities.
    assert meta["params"]["postprocess"] == "denoise"
    assert meta["preprocessing"]["postprocess"].startswith("Free post-processing")
    assert meta["preprocessing"]["basis"].startswith("dct: rows projected on the first 3")
    # Values in raw units: back on the mechanism's scale through the metadata's transform.
    t = meta["transform"]
    assert raw_meta["transform"] == t

    def unit(values: np.ndarray) -> np.ndarray:
        return (values - np.asarray(t["shift"])) / (np.asarray(t["scale"]) * t["divisor"])

    U, U_raw = unit(X), unit(X_raw)
    assert U.min() >= -1e-5 and U.max() <= 1 + 1e-5
    assert np.linalg.norm(U, axis=1).max() <= 1 + 1e-5
    assert np.allclose(Y.sum(axis=1), 1, atol=1e-5) and Y.min() >= 0
    # Raw: the noisy rows as drawn (outside the domain), which the release was made from.
    assert raw_meta["preprocessing"]["postprocess"].startswith("none")
    assert U_raw.min() < 0 and not np.allclose(X, X_raw)
    # The owner only: the analyst, granted the release, does not see the raw rows.
    denied = h.client.get(f"/releases/{rid}/raw", headers=h.headers(analyst))
    assert denied.status_code == 403  # by role, before any lookup
    # Without post-processing the noisy mixtures are clipped into the declared bounds; the
    # owner's raw copy holds them as drawn.
    body["params"] = {"mixture_degree": 4, "n_samples": 30, "postprocess": "none"}
    r = h.client.post("/releases", json=body, headers=h.headers(owner))
    plain = h.wait(owner, r.json()["id"])
    assert plain["status"] == "succeeded", plain
    X, _, meta = rows(h.download(owner, plain["id"]))
    X_raw, _, _ = rows(h.download(owner, plain["id"], "raw"))
    lo, hi = np.asarray(meta["feature_range"]["lo"]), np.asarray(meta["feature_range"]["hi"])
    assert ((lo <= X) & (hi >= X)).all() and not ((X_raw >= lo) & (X_raw <= hi)).all()
    assert np.array_equal(X, np.clip(X_raw, lo, hi).astype(X.dtype))
    # Rows drawn within the domain (ClustMix's sampled records) have no separate raw copy.
    body.update(mechanism="clustmix", params={})
    r = h.client.post("/releases", json=body, headers=h.headers(owner))
    inside = h.wait(owner, r.json()["id"])
    assert inside["status"] == "succeeded", inside
    none = h.client.get(f"/releases/{inside['id']}/raw", headers=h.headers(owner))
    assert none.status_code == 404 and "no separate raw copy" in none.text
