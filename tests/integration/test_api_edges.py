"""Regression tests for what schemathesis found: each was a 500, an undeclared status or a
request the schema forbids being accepted."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import Harness, npz_bytes, toy_dataset


def test_an_undecodable_body_is_422_in_the_error_shape(embedded: Harness) -> None:
    h = embedded
    r = h.client.post(
        "/api-keys",
        content=b"\xc3X",
        headers={**h.headers(h.admin_key), "content-type": "application/json"},
    )
    assert r.status_code == 422, r.text  # was 400 {"detail": ...}, undeclared
    assert r.json()["error"]["code"] == "invalid_input"


def test_405_names_every_method_of_the_path(embedded: Harness) -> None:
    r = embedded.client.request("OPTIONS", "/datasets", headers=embedded.headers("x"))
    assert r.status_code == 405
    assert r.headers["allow"] == "GET, POST"  # was "POST": only the first route's
    assert r.json()["error"]["code"] == "method_not_allowed"
    assert embedded.client.get("/nowhere").json()["error"]["code"] == "not_found"


@pytest.mark.parametrize(
    "request_part",
    [
        {
            "mechanism": "dpmix",
            "noise": {"sigma_x": 5e-324},
            "params": {"mixture_degree": 1, "n_samples": 1},
        },
        {
            "mechanism": "random_projection",
            "epsilon": 1.0,
            "noise_ratio": 5e-324,
            "params": {"projection_dim": 1, "spectral_norm": 5e-324},
        },
        {
            "mechanism": "sgdrm",
            "noise": {"sigma_x": 1e300},
            "params": {"mixture_width": 1, "n_samples": 1},
        },
    ],
)
def test_extreme_numbers_are_refused_not_a_500(
    embedded: Harness, request_part: dict[str, object]
) -> None:
    h = embedded
    owner, _ = h.new_key("owner")
    ds = h.upload(owner, npz_bytes(*toy_dataset())).json()
    body = {"dataset_id": ds["id"], "format": "npz", **request_part}
    r = h.client.post("/releases/preview", json=body, headers=h.headers(owner))
    assert r.status_code == 422, r.text  # was a ZeroDivisionError / OverflowError: 500


def test_schema_rules_are_enforced_as_declared(embedded: Harness) -> None:
    h = embedded
    owner, _ = h.new_key("owner")
    admin = h.headers(h.admin_key)
    cases: list[Any] = [
        {"since": "0.5"},
        {"since": "2026-01-01T00:00:00"},
        {"objectid": "x"},
        [("actor", "a"), ("actor", "b")],  # was: the last one, silently
    ]
    for params in cases:
        assert h.client.get("/audit", params=params, headers=admin).status_code == 422, params
    assert (
        h.client.get("/releases", params={"dataset": "x"}, headers=h.headers(owner)).status_code
        == 422
    )
    body = h.release_body("x", epsilon=None)
    r = h.client.post("/releases", json=body, headers={**h.headers(owner), "Idempotency-Key": ""})
    assert r.status_code == 422


def test_405_on_a_literal_path_beside_a_template(embedded: Harness) -> None:
    r = embedded.client.request("OPTIONS", "/releases/preview", headers=embedded.headers("x"))
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    r = embedded.client.request("DELETE", "/releases/abc", headers=embedded.headers("x"))
    assert r.status_code == 405 and r.headers["allow"] == "GET"
