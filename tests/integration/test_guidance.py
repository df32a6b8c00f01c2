"""Guidance before spending (issue 15.3): every parameter has a default (shape-dependent ones
resolved at admission from public facts), GET /mechanisms says what each mechanism is good for
and which are baselines, and preview states the noise in the columns' raw units."""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Any

import pytest

from dpcore.mechanisms import registry
from dpcore.mechanisms.spec import PublicFacts, mixing_degree
from service.budgets.service import ROUNDING_SLACK
from tests.conftest import Harness, npz_bytes, toy_dataset

SERVED = [spec.name for spec in registry.served()]


def _dataset(h: Harness, owner: str, **meta: Any) -> dict[str, Any]:
    r = h.upload(owner, npz_bytes(*toy_dataset()), budget={"epsilon": 50.0, "delta": 1e-5}, **meta)
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


@pytest.mark.modes("real")
@pytest.mark.parametrize("mechanism", SERVED)
def test_empty_params_are_admitted_for_every_mechanism(harness: Harness, mechanism: str) -> None:
    """`params: {}` (and no params at all) is admitted for every served mechanism on a
    typical small dataset (200 rows, 6 features, 3 balanced classes): preview answers 200
    with every shape default filled in from the public facts."""
    h = harness
    owner, _ = h.new_key("owner")
    ds = _dataset(h, owner)
    for body in (
        {"dataset_id": ds["id"], "mechanism": mechanism, "params": {}, "epsilon": 8.0},
        {"dataset_id": ds["id"], "mechanism": mechanism, "epsilon": 8.0},
    ):
        r = h.client.post("/releases/preview", json=body, headers=h.headers(owner))
        assert r.status_code == 200, r.text
        params = r.json()["params"]
        spec = registry.get(mechanism)
        for default in spec.admission.shape_defaults:
            assert params[default.name] is not None, default.name


@pytest.mark.modes("real")
def test_shape_defaults_are_stored_and_follow_the_rule(harness: Harness) -> None:
    """A release created with `params: {}` stores the resolved values: dpmix's ℓ from the
    measured rule and n_samples = n; dpcda's m half a balanced class, T a multiple of K."""
    h = harness
    owner, _ = h.new_key("owner")
    ds = _dataset(h, owner)
    body = {"dataset_id": ds["id"], "mechanism": "dpmix", "params": {}, "epsilon": 4.0}
    r = h.client.post("/releases", json=body, headers=h.headers(owner))
    assert r.status_code == 202, r.text
    assert r.json()["params"]["mixture_degree"] == mixing_degree(200) == 6
    assert r.json()["params"]["n_samples"] == 200
    # ε 20: at n = 200 the default DP class counts alone cost ε 5.3 (dpcda's defaults).
    body = {"dataset_id": ds["id"], "mechanism": "dpcda", "params": {}, "epsilon": 20.0}
    r = h.client.post("/releases/preview", json=body, headers=h.headers(owner))
    assert r.status_code == 200, r.text
    params = r.json()["params"]
    assert params["min_class_size"] == 200 // 6
    assert params["mixture_degree"] == 6
    assert params["n_samples"] == 198
    # DP class sizes by default: the count noise from its rule, β chosen for the target.
    assert params["class_sizes"] == "dp"
    assert params["count_noise"] == pytest.approx(33 / (4 * -NormalDist().inv_cdf(1e-9 / 3)))
    delta = r.json()["charge"]["delta"]
    assert params["class_size_failure_prob"] == pytest.approx(
        min(1e-9, 1e-3 * delta / (1 + math.exp(20.0 / (1 + 2 * ROUNDING_SLACK)))), rel=1e-9
    )
    # A given value wins over the default.
    body["params"] = {"mixture_degree": 3, "n_samples": 30}
    r = h.client.post("/releases/preview", json=body, headers=h.headers(owner))
    assert r.status_code == 200, r.text
    assert (r.json()["params"]["mixture_degree"], r.json()["params"]["n_samples"]) == (3, 30)


def test_default_rows_respect_the_server_caps() -> None:
    facts = PublicFacts(n=10_000, n_features=6, n_classes=3, max_release_rows=5000)
    assert facts.default_rows() == 5000
    assert facts.default_rows(3) == 4998
    capped = PublicFacts(n=10_000, n_features=6, n_classes=3, max_release_bytes=36 * 100)
    assert capped.default_rows() == 100  # 100 rows × (6 + 3) values × 4 bytes


def test_every_parameter_has_a_default_in_the_schema() -> None:
    """No served mechanism's request params has a required field; each shape default's rule
    is in its field's description."""
    for spec in registry.served():
        model = spec.request_params
        required = [n for n, f in model.model_fields.items() if f.is_required()]
        assert required == [], (spec.name, required)
        schema = model.model_json_schema()
        for default in spec.admission.shape_defaults:
            assert default.rule in schema["properties"][default.name]["description"]


def test_catalogue_says_what_each_is_for_and_marks_baselines(embedded: Harness) -> None:
    h = embedded
    owner, _ = h.new_key("owner")
    r = h.client.get("/mechanisms", headers=h.headers(owner))
    assert r.status_code == 200, r.text
    items = {m["name"]: m for m in r.json()["items"]}
    baselines = {name for name, m in items.items() if m["kind"] == "baseline"}
    assert baselines == {"local_perturbation", "random_projection"}
    assert {m["kind"] for m in items.values()} == {"mechanism", "baseline"}
    for name, m in items.items():
        assert m["good_for"].strip() and m["reference"].strip(), name


# --- preview: the noise in the columns' raw units ----------------------------------------

RANGES = {str(i): [0.0, 13.0 * (i + 1)] for i in range(6)}  # toy_dataset: 6 features in [0, 13)


def _preview(h: Harness, owner: str, ds: dict[str, Any], **body: Any) -> dict[str, Any]:
    request = {"dataset_id": ds["id"], "params": {}, **body}
    r = h.client.post("/releases/preview", json=request, headers=h.headers(owner))
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


@pytest.mark.modes("real")
def test_preview_noise_scales_with_sigma_and_with_each_columns_range(harness: Harness) -> None:
    """Local perturbation adds N(0, σ²) to every value of its rows (scaled to [0, 1], clipped
    to norm C and divided by C): in raw units σ·C·(hi − lo), per column — C the table default
    ⌈√6⌉/2 = 1.5. Doubling σ doubles every figure; a column with twice the range has twice
    the raw noise and the same noise-to-range."""
    C = 1.5
    h = harness
    owner, _ = h.new_key("owner")
    ds = _dataset(h, owner, feature_range=RANGES)
    guides = {}
    for sigma in (0.5, 1.0):
        out = _preview(
            h, owner, ds, mechanism="local_perturbation", noise={"sigma_x": sigma, "sigma_y": 1.0}
        )
        assert out["noise"]["sigma_x"] == sigma
        guides[sigma] = out["noise_guide"]
    for sigma, guide in guides.items():
        assert guide["applies"] is True
        assert guide["max_row_shrink"] == pytest.approx(6**0.5 / C)
        columns = {c["column"]: c for c in guide["columns"]}
        assert set(columns) == set(RANGES)
        for name, (lo, hi) in RANGES.items():
            assert columns[name]["range"] == [lo, hi]
            assert columns[name]["noise_std_raw"] == pytest.approx(sigma * C * (hi - lo))
            assert columns[name]["noise_to_range"] == pytest.approx(sigma * C)
        assert guide["noise_std_raw"]["max"] == pytest.approx(sigma * C * 78.0)
        assert guide["noise_std_raw"]["min"] == pytest.approx(sigma * C * 13.0)
    # σ·C = 0.75 at σ = 0.5: no column mostly noise; 1.5 at σ = 1: every one, said plainly.
    assert guides[0.5]["mostly_noise"] == [] and guides[0.5]["mostly_noise_count"] == 0
    assert sorted(guides[1.0]["mostly_noise"]) == sorted(RANGES)
    loud = _preview(
        h, owner, ds, mechanism="local_perturbation", noise={"sigma_x": 1.0, "sigma_y": 1.0}
    )
    warning = next(w for w in loud["warnings"] if w["code"] == "mostly_noise")
    assert warning["message"].startswith("values in every column (")
    assert "mostly noise at this ε" in warning["message"]
    quiet = _preview(
        h, owner, ds, mechanism="local_perturbation", noise={"sigma_x": 0.5, "sigma_y": 1.0}
    )
    assert "mostly_noise" not in [w["code"] for w in quiet["warnings"]]
    half = {c["column"]: c["noise_std_raw"] for c in guides[0.5]["columns"]}
    one = {c["column"]: c["noise_std_raw"] for c in guides[1.0]["columns"]}
    assert all(one[k] == pytest.approx(2 * half[k]) for k in one)
    assert one["1"] == pytest.approx(2 * one["0"])


@pytest.mark.modes("real")
def test_preview_noise_of_calibrated_mixing_and_where_it_does_not_apply(
    harness: Harness,
) -> None:
    """dpmix calibrated to ε: the figures are its σ_x times each column's range (no basis on
    a table); clustmix's and dpgm's noise is not per released value: applies is false."""
    h = harness
    owner, _ = h.new_key("owner")
    ds = _dataset(h, owner, feature_range=RANGES)
    for clip in (1.0, 2.0):
        out = _preview(h, owner, ds, mechanism="dpmix", epsilon=4.0, params={"clip_norm": clip})
        sigma = out["noise"]["sigma_x"]
        for column in out["noise_guide"]["columns"]:
            lo, hi = RANGES[column["column"]]
            assert column["noise_std_raw"] == pytest.approx(sigma * clip * (hi - lo))
    for mechanism in ("clustmix", "dpgm", "random_projection"):
        guide = _preview(h, owner, ds, mechanism=mechanism, epsilon=4.0)["noise_guide"]
        assert guide["applies"] is False and guide["meaning"], mechanism
        assert guide["columns"] is None and guide["noise_std_raw"] is None


def test_noise_guide_is_compact_for_wide_data_and_exact_per_pixel_with_a_basis() -> None:
    """784 pixels with DPMix's default DCT basis (k = 64): the per-pixel noise is σ·C·‖row of
    B‖ (C the image default ⌈28⌉/3: rows divided by C), whose mean square is (σC)²·k/d; past
    the column limit only the spreads are given."""
    from dpcore.accounting.events import NoiseDescription, NoiseScale
    from service.models import Dataset
    from service.releases.guidance import noise_guide

    spec = registry.get("dpmix")
    facts = PublicFacts(n=10_000, n_features=784, n_classes=10, feature_shape=(28, 28))
    params = spec.resolve(spec.request_params(), facts).model_dump()
    sigma = 0.05
    noise = NoiseDescription(
        scales=(NoiseScale("features", sigma, 0.1, ("features",)),), calibrated="features"
    )
    dataset = Dataset(n_features=784, feature_range=[0, 255], format="npz", feature_shape=[28, 28])
    wide = noise_guide(spec, params, facts, noise, dataset, max_columns=100)
    assert wide.columns is None and wide.noise_to_range is not None
    listed = noise_guide(spec, params, facts, noise, dataset, max_columns=1000)
    assert listed.columns is not None and len(listed.columns) == 784
    squares = [c.noise_to_range**2 for c in listed.columns]
    clip = params["clip_norm"]
    assert clip == pytest.approx(28 / 3)
    assert sum(squares) / 784 == pytest.approx((sigma * clip) ** 2 * 64 / 784)
    assert wide.noise_to_range.max == pytest.approx(max(c.noise_to_range for c in listed.columns))
    assert all(c.noise_std_raw == pytest.approx(255 * c.noise_to_range) for c in listed.columns)
    identity = noise_guide(
        spec, {**params, "basis": "identity"}, facts, noise, dataset, max_columns=1000
    )
    assert identity.noise_to_range is not None
    assert identity.noise_to_range.min == identity.noise_to_range.max == pytest.approx(sigma * clip)


@pytest.mark.modes("real")
def test_dpcda_default_class_size_reads_no_class_count(harness: Harness) -> None:
    """DP-CDA's default min_class_size (half a balanced class) with the default DP class
    sizes is not checked against the class counts: a dataset with a small class is planned
    like any other (the job's DP lower bounds decide whether it mixes). With the opt-in
    declared class sizes it is: refused with a request to declare one, and a declared one
    then caps the default ℓ."""
    import numpy as np

    h = harness
    owner, _ = h.new_key("owner")
    X, _ = toy_dataset()
    y = np.zeros(200, dtype=np.int64)
    y[:10] = 2  # class 2: 10 rows, below ⌊200 / 6⌋ = 33
    y[10:100] = 1
    r = h.upload(owner, npz_bytes(X, y), budget={"epsilon": 50.0, "delta": 1e-5})
    assert r.status_code == 201, r.text
    ds = r.json()
    # ε 20: at n = 200 the default count noise (33/(4·6.2) = 1.3) alone costs ε 5.3.
    body = {"dataset_id": ds["id"], "mechanism": "dpcda", "params": {}, "epsilon": 20.0}
    r = h.client.post("/releases/preview", json=body, headers=h.headers(owner))
    assert r.status_code == 200, r.text
    params = r.json()["params"]
    assert params["min_class_size"] == 33 and params["class_sizes"] == "dp"
    assert r.json()["neighbour_relation"] == "replace-one (n public)"
    body["params"] = {"class_sizes": "declared"}
    r = h.client.post("/releases/preview", json=body, headers=h.headers(owner))
    assert r.status_code == 422, r.text
    assert "min_class_size 33" in r.text and "declare a smaller one" in r.text
    body["params"] = {"class_sizes": "declared", "min_class_size": 5}
    r = h.client.post("/releases/preview", json=body, headers=h.headers(owner))
    assert r.status_code == 200, r.text
    assert r.json()["params"]["mixture_degree"] == 5
    assert "at least 5 records" in r.json()["neighbour_relation"]
