"""GET /releases/{id}/summary (the console's release page): the release file as the download
serves it, summarised — rows spread over it and per-column histograms — for exactly the download's
readers, once the release succeeded."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pandas as pd
import pytest

from tests.conftest import Harness, npz_bytes, toy_dataset
from tests.integration.test_access_matrix import _queued_release

CLASSES = [0, 1, 2]


def _images(n: int = 120, side: int = 8, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, len(CLASSES), size=n)
    X = np.clip(rng.normal(0.2 + 0.3 * y[:, None, None], 0.1, size=(n, side, side)), 0, 1)
    return X, y


def _dataset(h: Harness, owner: str, content: bytes, feature_range: Any) -> str:
    r = h.upload(owner, content, feature_range=feature_range)
    assert r.status_code == 201, r.text
    dataset_id: str = r.json()["id"]
    return dataset_id


def _succeeded(h: Harness, owner: str, dataset_id: str, **overrides: Any) -> dict[str, Any]:
    body = h.release_body(dataset_id, params={"mixture_degree": 4, "n_samples": 100}, **overrides)
    r = h.client.post("/releases", json=body, headers=h.headers(owner))
    assert r.status_code == 202, r.text
    done = h.wait(owner, r.json()["id"])
    assert done["status"] == "succeeded", done
    return done


def _summary(h: Harness, key: str, release_id: str) -> Any:
    return h.client.get(f"/releases/{release_id}/summary", headers=h.headers(key))


def test_image_release_summary_and_its_readers(embedded: Harness) -> None:
    h = embedded
    owner, _ = h.new_key("owner")
    granted, granted_id = h.new_key("analyst")
    ungranted, _ = h.new_key("analyst")
    ds = _dataset(h, owner, npz_bytes(*_images()), [0, 1])
    grant = h.client.post(
        f"/datasets/{ds}/grants", json={"principal_id": granted_id}, headers=h.headers(owner)
    )
    assert grant.status_code == 201, grant.text
    release = _succeeded(h, owner, ds)

    answers = {k: _summary(h, k, release["id"]) for k in (owner, granted, h.admin_key)}
    assert {r.status_code for r in answers.values()} == {200}
    body = answers[owner].json()
    assert all(r.json() == body for r in answers.values())  # the same for every reader
    refused = _summary(h, ungranted, release["id"])
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "not_found"

    assert body["rows"] == 100 and body["feature_shape"] == [8, 8]
    # DPMix's labels are mixed one-hot vectors: one proportion column per class.
    assert body["label_kind"] == "proportions" and body["classes"] == ["0", "1", "2"]
    assert body["label_columns"] == ["label=0", "label=1", "label=2"]
    assert len(body["samples"]) == 64 and all(len(s["features"]) == 64 for s in body["samples"])
    # Image rows: no per-pixel histograms, the labels' only (over [0, 1]).
    hists = body["histograms"]
    assert [hist["column"] for hist in hists] == body["label_columns"]
    for hist in hists:
        assert hist["kind"] == "numeric" and hist["range_source"] == "declared"
        assert hist["edges"][0] == 0 and hist["edges"][-1] == 1
        assert sum(hist["counts"]) + hist["below"] + hist["above"] == 100
    # Rows of the very file the download serves, spread evenly over it.
    with np.load(io.BytesIO(h.download(owner, release["id"]))) as npz:
        X, y = npz["X"], npz["y"]
    rows = [s["row"] for s in body["samples"]]
    assert len(rows) == 64 and rows == sorted(set(rows)) and rows[0] == 0
    assert rows == [i * len(X) // 64 for i in range(64)]
    got = np.array([s["features"] for s in body["samples"]])
    np.testing.assert_allclose(got, X[rows], rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose([s["label"] for s in body["samples"]], y[rows], rtol=1e-5)
    # The service bins in float64 (binning float32 values in float32 moves edge cases).
    reference = np.histogram(y[:, 0].astype(np.float64), bins=20, range=(0, 1))[0]
    assert hists[0]["counts"] == reference.tolist()
    if body["value_range"] is not None:  # the declared bounds, released in the data's units
        assert body["display_range"] == [0.0, 1.0]


def test_tabular_csv_release_has_a_histogram_per_column(embedded: Harness) -> None:
    h = embedded
    owner, _ = h.new_key("owner")
    ds = _dataset(h, owner, npz_bytes(*toy_dataset()), [0, 13])
    release = _succeeded(h, owner, ds, format="csv")
    r = _summary(h, owner, release["id"])
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["feature_shape"] is None and body["rows"] == 100
    assert body["columns"] == body["feature_columns"] + body["label_columns"]
    assert len(body["feature_columns"]) == 6
    hists = {hist["column"]: hist for hist in body["histograms"]}
    assert list(hists) == body["columns"]
    for name in body["feature_columns"]:
        hist = hists[name]
        assert hist["kind"] == "numeric" and len(hist["edges"]) == 21 and len(hist["counts"]) == 20
        assert sum(hist["counts"]) + hist["below"] + hist["above"] == 100
    assert len(body["samples"]) == 64


def test_a_declared_tables_summary_has_a_histogram_per_declared_column(
    embedded: Harness,
) -> None:
    """Categories counted as categories, numbers over their declared bounds, and each
    column's missing entries counted apart (they are in no bar)."""
    import json

    from tests.integration.test_formats import _release

    h = embedded
    owner, _ = h.new_key("owner")
    done = _release(h, owner, "parquet")
    summary = _summary(h, owner, done["id"]).json()
    hists = {hist["column"]: hist for hist in summary["histograms"]}
    assert list(hists) == ["site", "visits", "weight", "outcome"]
    assert hists["site"]["kind"] == "categorical" and hists["site"]["categories"] == ["A", "B", "C"]
    assert sum(hists["site"]["counts"]) == 300 and hists["site"]["missing"] == 0
    visits = hists["visits"]
    assert visits["kind"] == "numeric" and visits["edges"][0] == 0 and visits["edges"][-1] == 20
    frame = pd.read_parquet(io.BytesIO(h.download(owner, done["id"])))
    assert visits["missing"] == int(frame["visits"].isna().sum()) > 0
    assert sum(visits["counts"]) + visits["missing"] == 300
    assert hists["weight"]["missing"] == 0 and hists["weight"]["below"] == 0
    assert json.dumps(summary)  # plain JSON


def test_summary_needs_a_succeeded_release_of_bounded_size(
    embedded: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = embedded
    owner, _ = h.new_key("owner")
    ds = _dataset(h, owner, npz_bytes(*toy_dataset()), [0, 13])
    queued = _queued_release(h, owner, ds)
    r = _summary(h, owner, queued)
    assert r.status_code == 409 and r.json()["error"]["code"] == "not_ready", r.text

    release = _succeeded(h, owner, ds)
    small = h.runtime.settings.model_copy(update={"summary_max_bytes": 100})
    monkeypatch.setattr(h.runtime, "settings", small)
    r = _summary(h, owner, release["id"])
    assert r.status_code == 409, r.text
    error = r.json()["error"]
    assert error["code"] == "summary_too_large"
    assert error["detail"] == {
        "artifact_bytes": release["artifact"]["bytes"],
        "limit_bytes": 100,
    }
