"""One set of checks (issue 14, item 7): preview runs every check create runs, and request
input is read strictly (JSON types, duplicate JSON keys, duplicate CSV column names)."""

from __future__ import annotations

import json
from typing import Any, get_args

import numpy as np
import pytest
from fastapi import params
from pydantic import BaseModel

from service.budgets import service as ledger
from service.datasets.schemas import DatasetMetadata
from service.strict_json import StrictBody
from tests.conftest import Harness, npz_bytes, toy_dataset


def _error(r: Any) -> tuple[int, str]:
    return r.status_code, r.json()["error"]["code"]


def _both(h: Harness, key: str, body: dict[str, Any]) -> tuple[Any, Any]:
    preview = h.client.post("/releases/preview", json=body, headers=h.headers(key))
    create = h.client.post("/releases", json=body, headers=h.headers(key))
    return preview, create


def test_preview_refuses_whatever_create_refuses(embedded: Harness) -> None:
    """Each refusal case, asked of preview and of create: the same status and code. On main,
    preview ignored report_test_dataset_id (200 for another owner's, a deleted or a missing
    dataset) and read true and "1" as ε = 1."""
    h = embedded
    owner, _ = h.new_key("owner")
    other, _ = h.new_key("owner")
    ds = h.upload(owner, npz_bytes(*toy_dataset())).json()["id"]
    theirs = h.upload(other, npz_bytes(*toy_dataset(seed=1))).json()["id"]
    deleted = h.upload(owner, npz_bytes(*toy_dataset(seed=2))).json()["id"]
    narrow = h.upload(owner, npz_bytes(*toy_dataset(d=4, seed=3))).json()["id"]
    assert h.client.delete(f"/datasets/{deleted}", headers=h.headers(owner)).status_code == 200
    cases: dict[str, tuple[dict[str, Any], tuple[int, str]]] = {
        "report of another owner's dataset": (
            {"report_test_dataset_id": theirs},
            (404, "not_found"),
        ),
        "report of a deleted dataset": (
            {"report_test_dataset_id": deleted},
            (409, "dataset_deleted"),
        ),
        "report of a missing dataset": ({"report_test_dataset_id": "nope"}, (404, "not_found")),
        "report of the released dataset": ({"report_test_dataset_id": ds}, (422, "invalid_input")),
        "report with other features": ({"report_test_dataset_id": narrow}, (422, "invalid_input")),
        "epsilon true": ({"epsilon": True}, (422, "invalid_input")),
        "epsilon a string": ({"epsilon": "1"}, (422, "invalid_input")),
        "epsilon past the largest target": ({"epsilon": 1e300}, (422, "invalid_input")),
        "delta a string": ({"delta": "1e-6"}, (422, "invalid_input")),
        "research a string": ({"research": "false"}, (422, "invalid_input")),
        "noise sigma true": (
            {"epsilon": None, "noise": {"sigma_x": True}},
            (422, "invalid_input"),
        ),
        "delta over the budget's": ({"delta": 1e-3}, (422, "invalid_input")),
        "a parameter true": (
            {"params": {"mixture_degree": True, "n_samples": 300}},
            (422, "invalid_input"),
        ),
        "a parameter a string": (
            {"params": {"mixture_degree": 8, "n_samples": "300"}},
            (422, "invalid_input"),
        ),
        "a flag a string": (
            {"mechanism": "dpgm", "params": {"weights": "true", "epochs": 1}},
            (422, "invalid_input"),
        ),
        "a list of numbers holding a string": (
            {
                "mechanism": "dpcda",
                "params": {
                    "mixture_degree": 4,
                    "n_samples": 30,
                    "min_class_size": 10,
                    "standardization": "declared",
                    "feature_mean": [0, 0, 0, 0, 0, "0"],
                    "feature_std": [1, 1, 1, 1, 1, 1],
                },
            },
            (422, "invalid_input"),
        ),
    }
    for name, (overrides, expected) in cases.items():
        body = {k: v for k, v in h.release_body(ds, **overrides).items() if v is not None}
        preview, create = _both(h, owner, body)
        assert _error(preview) == expected, (name, preview.text)
        assert _error(create) == expected, (name, create.text)
    # The ledger is untouched: nothing was admitted.
    assert h.client.get("/releases", headers=h.headers(owner)).json()["items"] == []


def test_integers_still_count_as_numbers(embedded: Harness) -> None:
    h = embedded
    owner, _ = h.new_key("owner")
    ds = h.upload(owner, npz_bytes(*toy_dataset())).json()["id"]
    preview, create = _both(h, owner, h.release_body(ds, epsilon=1))
    assert preview.status_code == 200, preview.text
    assert create.status_code == 202, create.text
    # A parameter that takes a float takes an integer; a flag takes true.
    flags = h.release_body(ds, mechanism="dpgm", params={"weights": True, "epochs": 1})
    r = h.client.post("/releases/preview", json=flags, headers=h.headers(owner))
    assert r.status_code == 200, r.text


def test_a_charge_the_ledger_refuses_is_refused_by_preview_too(
    embedded: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A charge rounded to ε = 0 (what main previewed as admissible for ε ≤ 0.01, and create
    then refused): the ledger's own guard runs in the shared plan, so preview refuses it."""
    h = embedded
    owner, _ = h.new_key("owner")
    ds = h.upload(owner, npz_bytes(*toy_dataset())).json()["id"]
    real_round_up = ledger.round_up
    monkeypatch.setattr(ledger, "round_up", lambda v: 0.0 if v <= 0.01 else real_round_up(v))
    preview, create = _both(h, owner, h.release_body(ds, epsilon=0.01))
    assert _error(preview) == (422, "invalid_input"), preview.text
    assert _error(create) == (422, "invalid_input"), create.text
    assert "finite ε > 0" in preview.json()["error"]["message"]


def test_duplicate_json_keys_are_refused(embedded: Harness) -> None:
    h = embedded
    owner, _ = h.new_key("owner")
    ds = h.upload(owner, npz_bytes(*toy_dataset())).json()["id"]
    body = json.dumps(h.release_body(ds))
    twice = body[:-1] + ', "epsilon": 4.0}'  # on main: the last one won
    nested = body.replace('"n_samples": 300', '"n_samples": 300, "n_samples": 10')
    headers = {**h.headers(owner), "content-type": "application/json"}
    for content in (twice, nested):
        for path in ("/releases/preview", "/releases"):
            r = h.client.post(path, content=content, headers=headers)
            assert _error(r) == (422, "invalid_input"), (path, r.text)
            assert "more than once" in r.json()["error"]["message"]
    key = '{"name": "a", "role": "owner", "role": "admin"}'
    r = h.client.post(
        "/api-keys",
        content=key,
        headers={**h.headers(h.admin_key), "content-type": "application/json"},
    )
    assert _error(r) == (422, "invalid_input"), r.text
    ok = h.client.post("/releases/preview", content=body, headers=headers)
    assert ok.status_code == 200, ok.text


def test_duplicate_keys_in_upload_metadata_are_refused(embedded: Harness) -> None:
    h = embedded
    owner, _ = h.new_key("owner")
    meta = json.dumps({"name": "toy", "feature_range": [0, 13], "classes": [0, 1, 2]})
    meta = meta[:-1] + ', "budget": {"epsilon": 5.0, "delta": 1e-5, "epsilon": 50.0}}'
    r = h.client.post(
        "/datasets",
        files={"file": ("data.npz", npz_bytes(*toy_dataset()))},
        data={"metadata": meta},
        headers=h.headers(owner),
    )
    assert _error(r) == (422, "invalid_input"), r.text
    assert "more than once" in r.json()["error"]["message"]


@pytest.mark.modes("real")
def test_upload_metadata_numbers_are_strict(harness: Harness) -> None:
    """Upload metadata is read like any JSON body: a bool or a string for a number is refused
    (422 naming the field), where it was read as 1 or 1.0 and the upload stored; nothing is
    stored. Integers still count as numbers."""
    h = harness
    owner, _ = h.new_key("owner")
    valid: dict[str, Any] = {
        "name": "toy",
        "feature_range": [0, 13],
        "classes": [0, 1, 2],
        "budget": {"epsilon": 5, "delta": 1e-5},
    }
    cases: dict[str, tuple[dict[str, Any], str]] = {
        "epsilon true": ({"budget": {"epsilon": True, "delta": 1e-5}}, "budget.epsilon"),
        "epsilon a string": ({"budget": {"epsilon": "1", "delta": 1e-5}}, "budget.epsilon"),
        "delta a string": ({"budget": {"epsilon": 5, "delta": "1e-5"}}, "budget.delta"),
        "delta true": ({"budget": {"epsilon": 5, "delta": True}}, "budget.delta"),
        "a bound a string": ({"feature_range": [0, "13"]}, "feature_range"),
        "a bound true": ({"feature_range": [False, 13]}, "feature_range"),
        "a column's bound a string": (
            {"feature_range": {str(j): [0, "13"] for j in range(8)}},
            "feature_range",
        ),
        "a class true": ({"classes": [0, 1, True]}, "classes"),
        "a class a fraction": ({"classes": [0, 1, 2.5]}, "classes"),
    }
    before = len(h.client.get("/datasets", headers=h.headers(owner)).json()["items"])
    for case, (change, field) in cases.items():
        r = h.upload(owner, npz_bytes(*toy_dataset()), metadata={**valid, **change})
        assert _error(r) == (422, "invalid_input"), (case, r.text)
        assert field in r.json()["error"]["message"], (case, r.text)
    after = h.client.get("/datasets", headers=h.headers(owner)).json()["items"]
    assert len(after) == before
    ok = h.upload(owner, npz_bytes(*toy_dataset()), metadata=dict(valid))
    assert ok.status_code == 201, ok.text
    assert ok.json()["budget"]["epsilon"] == 5.0


@pytest.mark.modes("real")
def test_every_json_body_is_strict(harness: Harness) -> None:
    """Every JSON request body model derives from StrictBody (a body added later cannot be
    lax by default), and the API-key and grant bodies refuse a bool or a string for a
    number, a number for a string, as release requests do; valid bodies still pass."""
    h = harness
    models = _body_models(h.client.app)  # type: ignore[arg-type]
    assert {"NewPrincipalKey", "PrincipalKey", "GrantIn", "DPMixRequest"} <= {
        m.__name__ for m in models
    }, models
    lax = [m.__name__ for m in models if not issubclass(m, StrictBody)]
    assert lax == [], f"JSON bodies not derived from StrictBody: {lax}"
    assert issubclass(DatasetMetadata, StrictBody)  # a form field's JSON, read the same way

    admin = h.headers(h.admin_key)
    owner, _ = h.new_key("owner")
    _, analyst_id = h.new_key("analyst")
    ds = h.upload(owner, npz_bytes(*toy_dataset())).json()["id"]
    refused: list[tuple[str, dict[str, Any], dict[str, str]]] = [
        ("/api-keys", {"name": "a", "role": "owner", "expires_in": True}, admin),
        ("/api-keys", {"name": "a", "role": "owner", "expires_in": "60"}, admin),
        ("/api-keys", {"name": "a", "role": "owner", "expires_in": 60.5}, admin),
        ("/api-keys", {"name": "a", "role": "owner", "expires_in": [60]}, admin),
        ("/api-keys", {"name": 1, "role": "owner"}, admin),
        ("/api-keys", {"name": "a", "role": True}, admin),
        ("/api-keys", {"principal_id": analyst_id, "expires_in": "60"}, admin),
        ("/api-keys", {"principal_id": 5}, admin),
        (f"/datasets/{ds}/grants", {"principal_id": True}, h.headers(owner)),
        (f"/datasets/{ds}/grants", {"principal_id": 12}, h.headers(owner)),
    ]
    for path, body, headers in refused:
        r = h.client.post(path, json=body, headers=headers)
        assert _error(r) == (422, "invalid_input"), (path, body, r.text)
    for expires_in in (60, 60.0):  # JSON Schema's integer: a number without a fraction
        ok = h.client.post(
            "/api-keys",
            json={"name": "a", "role": "analyst", "expires_in": expires_in},
            headers=admin,
        )
        assert ok.status_code == 201, ok.text
    grant = h.client.post(
        f"/datasets/{ds}/grants", json={"principal_id": analyst_id}, headers=h.headers(owner)
    )
    assert grant.status_code == 201, grant.text


def _body_models(app: Any) -> list[type[BaseModel]]:
    """The pydantic models of every route's JSON body (unions and Annotated unwrapped)."""
    found: list[type[BaseModel]] = []

    def collect(annotation: Any) -> None:
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            found.append(annotation)
        for arg in get_args(annotation):
            collect(arg)

    def walk(routes: Any) -> None:
        for route in routes:
            included = getattr(route, "original_router", None)  # an included router
            if included is not None:
                walk(included.routes)
            field = getattr(route, "body_field", None)
            # Multipart forms (the upload) are not JSON: their metadata is checked apart.
            if field is not None and not isinstance(field.field_info, params.Form):
                collect(field.field_info.annotation)

    walk(app.routes)
    return found


def test_duplicate_csv_column_names_are_refused(embedded: Harness) -> None:
    """On main, pandas renamed the second ``a`` to ``a.1`` and the upload passed."""
    h = embedded
    owner, _ = h.new_key("owner")
    rows = "\n".join(f"{i % 5},{(i * 3) % 7},{i % 3}" for i in range(50))
    r = h.upload(
        owner,
        f"a,a,label\n{rows}\n".encode(),
        filename="data.csv",
        label_column="label",
        feature_range=[0, 10],
    )
    assert _error(r) == (422, "invalid_input"), r.text
    assert "'a' appears more than once" in r.json()["error"]["message"]
    fine = h.upload(
        owner,
        f"a,b,label\n{rows}\n".encode(),
        filename="data.csv",
        label_column="label",
        feature_range=[0, 10],
    )
    assert fine.status_code == 201, fine.text


def test_release_size_is_capped_in_bytes_alike(embedded: Harness) -> None:
    """Issue 14, item 2b: the row cap ignored the row width, so MNIST at T = 10⁷ (784 pixels
    + 10 classes: ~32 GB of float32, written twice) was admitted for ~5.5 h of work. The cap
    in bytes (DPRELEASE_MAX_RELEASE_BYTES, 2 GiB) refuses it in preview and create alike,
    naming the limit and the estimate, from public figures only (rows asked, declared width,
    the format's bytes per value)."""
    h = embedded
    owner, _ = h.new_key("owner")
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(200, 28, 28)).astype(np.uint8)
    labels = rng.integers(0, 10, size=200)
    r = h.upload(
        owner,
        npz_bytes(images, labels),
        feature_range=[0, 255],
        classes=list(range(10)),
        name="mnist-shaped",
    )
    assert r.status_code == 201, r.text
    ds = r.json()["id"]
    body = h.release_body(ds, params={"mixture_degree": 8, "n_samples": 10**7})
    preview, create = _both(h, owner, body)
    for answer in (preview, create):
        assert _error(answer) == (422, "release_too_large"), answer.text
        error = answer.json()["error"]
        estimate = 10**7 * (784 + 10) * 4
        assert error["detail"] == {"estimated_bytes": estimate, "limit_bytes": 2 * 1024**3}
        assert (
            str(estimate) in error["message"] and "DPRELEASE_MAX_RELEASE_BYTES" in error["message"]
        )
    # CSV takes more bytes per value: a size NPZ admits can be refused as CSV.
    fits = h.release_body(ds, params={"mixture_degree": 8, "n_samples": 300_000})
    preview, create = _both(h, owner, {**fits, "format": "csv"})
    assert _error(preview) == _error(create) == (422, "release_too_large")
    ok = h.client.post("/releases/preview", json=fits, headers=h.headers(owner))
    assert ok.status_code == 200, ok.text
    assert h.client.get("/releases", headers=h.headers(owner)).json()["items"] == []


@pytest.mark.modes("real")
def test_nul_characters_are_refused_everywhere_with_422(harness: Harness) -> None:
    """U+0000 in a path id, a query id, a JSON id or name, upload metadata or a file name:
    Postgres cannot store it, so each answers 422 naming where it was (never a 500)."""
    h = harness
    owner, _ = h.new_key("owner")
    admin = {"Authorization": f"Bearer {h.admin_key}"}
    X, y = toy_dataset()
    meta = {"name": "toy", "feature_range": [0, 13], "classes": [0, 1, 2]}
    meta["budget"] = {"epsilon": 5, "delta": 1e-5}
    r = h.upload(owner, npz_bytes(X, y), metadata=meta)
    assert r.status_code == 201, r.text
    ds = r.json()["id"]
    calls: list[tuple[str, str, dict[str, Any]]] = [
        ("GET", "/datasets/%00abc", {}),
        ("GET", "/releases/a%00b", {}),
        ("GET", "/releases/a%00b/download", {}),
        ("GET", "/budgets/%00", {}),
        ("GET", "/releases?dataset_id=%00", {}),
        ("POST", "/releases", {"json": {**h.release_body(ds), "dataset_id": "a\u0000b"}}),
        ("POST", "/releases/preview", {"json": {**h.release_body(ds), "mechanism": "dp\u0000"}}),
        ("POST", f"/datasets/{ds}/grants", {"json": {"principal_id": "\u0000"}}),
    ]
    for method, path, kwargs in calls:
        r = h.client.request(method, path, headers=h.headers(owner), **kwargs)
        assert r.status_code == 422, (method, path, r.text)
        assert "NUL character" in r.json()["error"]["message"], (method, path, r.text)
    r = h.client.post("/api-keys", json={"name": "a\u0000", "role": "owner"}, headers=admin)
    assert r.status_code == 422 and "NUL character" in r.text, r.text
    r = h.upload(owner, npz_bytes(X, y), metadata={**meta, "name": "to\u0000y"})
    assert r.status_code == 422 and "NUL character" in r.text, r.text
    # A multipart file name: the client may escape the NUL itself; either way, never a 500.
    r = h.upload(owner, npz_bytes(X, y), filename="a\u0000.npz", metadata=meta)
    assert r.status_code in (201, 422), r.text


def test_deep_json_and_repeated_upload_parts_are_refused(embedded: Harness) -> None:
    """Metadata nested thousands deep answers 422 (it was a 500: the parser's recursion), as
    does a JSON body; an upload with two 'file' or two 'metadata' parts is refused."""
    h = embedded
    owner, _ = h.new_key("owner")
    deep = "[" * 5000 + "]" * 5000
    X, y = toy_dataset()
    meta = {"name": "toy", "feature_range": [0, 13], "classes": [0, 1, 2]}
    meta["budget"] = {"epsilon": 5, "delta": 1e-5}
    headers = h.headers(owner)
    r = h.client.post(
        "/datasets",
        files={"file": ("toy.npz", npz_bytes(X, y))},
        data={"metadata": json.dumps(meta)[:-1] + ', "extra": ' + deep + "}"},
        headers=headers,
    )
    assert r.status_code == 422 and "more than 64 deep" in r.text, r.text
    r = h.client.post(
        "/releases/preview",
        content=deep,
        headers={**headers, "content-type": "application/json"},
    )
    assert r.status_code == 422, r.text
    two_files = [("file", ("a.npz", npz_bytes(X, y))), ("file", ("b.npz", npz_bytes(X, y)))]
    r = h.client.post(
        "/datasets", files=two_files, data={"metadata": json.dumps(meta)}, headers=headers
    )
    assert r.status_code == 422 and r.json()["error"]["detail"] == {"repeated": ["file"]}, r.text
    r = h.client.post(
        "/datasets",
        files=[("file", ("a.npz", npz_bytes(X, y)))],
        data={"metadata": [json.dumps(meta), json.dumps(meta)]},
        headers=headers,
    )
    assert r.status_code == 422 and r.json()["error"]["detail"] == {"repeated": ["metadata"]}
    # One of each still uploads.
    r = h.client.post(
        "/datasets",
        files={"file": ("toy.npz", npz_bytes(X, y))},
        data={"metadata": json.dumps(meta)},
        headers=headers,
    )
    assert r.status_code == 201, r.text
