"""Guidance before spending (issue 15.3): every parameter has a default (shape-dependent ones
resolved at admission from public facts), GET /mechanisms says what each mechanism is good for
and which are baselines, and preview states the noise in the columns' raw units."""

from __future__ import annotations

from typing import Any

import pytest

from dpcore.mechanisms import registry
from dpcore.mechanisms.spec import PublicFacts, mixing_degree
from tests.conftest import Harness, npz_bytes, toy_dataset

SERVED = [spec.name for spec in registry.served()]


def _dataset(h: Harness, owner: str, **meta: Any) -> dict[str, Any]:
    r = h.upload(owner, npz_bytes(*toy_dataset()), budget={"epsilon": 50.0, "delta": 1e-5}, **meta)
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


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
        for default in spec.shape_defaults:
            assert params[default.name] is not None, default.name


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
    body = {"dataset_id": ds["id"], "mechanism": "dpcda", "params": {}, "epsilon": 4.0}
    r = h.client.post("/releases/preview", json=body, headers=h.headers(owner))
    assert r.status_code == 200, r.text
    params = r.json()["params"]
    assert params["min_class_size"] == 200 // 6
    assert params["mixture_degree"] == 6
    assert params["n_samples"] == 198
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
        for default in spec.shape_defaults:
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
