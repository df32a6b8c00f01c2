"""Upload metadata ``feature_shape``: flat rows declared as images get what an NPZ array of
that shape gets (the same stored shape, the same resolved parameters and noise), wrong shapes
are refused with what to fix, and undeclared square rows draw a preview warning."""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from tests.conftest import Harness, npz_bytes, toy_dataset


def _images(n: int = 200) -> tuple[np.ndarray, np.ndarray]:
    X, y = toy_dataset(n=n, d=64)
    return X.reshape(n, 8, 8), y


def _preview(h: Harness, key: str, dataset_id: str) -> dict[str, Any]:
    body = {"dataset_id": dataset_id, "mechanism": "clustmix", "epsilon": 1.0}
    r = h.client.post("/releases/preview", json=body, headers=h.headers(key))
    assert r.status_code == 200, r.text
    return dict(r.json())


def _csv(X: np.ndarray, y: np.ndarray) -> bytes:
    out = io.StringIO()
    out.write(",".join([f"f{j}" for j in range(X.shape[1])] + ["label"]) + "\n")
    for row, label in zip(X, y, strict=True):
        out.write(",".join([f"{v:.6f}" for v in row] + [str(label)]) + "\n")
    return out.getvalue().encode()


def test_flat_rows_with_a_shape_get_what_the_array_gets(embedded: Harness) -> None:
    h = embedded
    owner, _ = h.new_key("owner")
    X, y = _images()
    as_array = h.upload(owner, npz_bytes(X, y)).json()
    flat = h.upload(owner, npz_bytes(X.reshape(len(X), -1), y), feature_shape=[8, 8]).json()
    as_csv = h.upload(
        owner,
        _csv(X.reshape(len(X), -1), y),
        filename="d.csv",
        label_column="label",
        feature_shape=[8, 8],
    ).json()
    undeclared = h.upload(owner, npz_bytes(X.reshape(len(X), -1), y)).json()
    assert as_array["feature_shape"] == flat["feature_shape"] == as_csv["feature_shape"] == [8, 8]
    assert undeclared["feature_shape"] == [64]

    previews = [_preview(h, owner, ds["id"]) for ds in (as_array, flat, as_csv, undeclared)]
    array, declared, csv, plain = previews
    for other in (declared, csv):
        assert other["params"] == array["params"]
        assert other["noise"] == array["noise"]
        assert other["charge"]["epsilon"] == array["charge"]["epsilon"]
        assert "shape_undeclared" not in {w["code"] for w in other["warnings"]}
    # Without the shape the same rows get table defaults, and a hint.
    assert plain["params"] != array["params"]
    assert "shape_undeclared" in {w["code"] for w in plain["warnings"]}


def test_wrong_shapes_are_refused_and_nothing_is_stored(embedded: Harness) -> None:
    h = embedded
    owner, _ = h.new_key("owner")
    X, y = _images()
    flat = npz_bytes(X.reshape(len(X), -1), y)
    cases: dict[str, tuple[bytes, dict[str, Any], str]] = {
        "product differs": (flat, {"feature_shape": [8, 9]}, "holds 72 features"),
        "array disagrees": (npz_bytes(X, y), {"feature_shape": [4, 16]}, "disagrees"),
        "zero axis": (flat, {"feature_shape": [0, 64]}, "feature_shape"),
        "a fraction": (flat, {"feature_shape": [8, 8.5]}, "feature_shape"),
    }
    for case, (content, extra, needle) in cases.items():
        r = h.upload(owner, content, **extra)
        assert r.status_code == 422, (case, r.text)
        assert needle in r.text, (case, r.text)
    categorical = h.upload(
        owner,
        b"a,b,c,d,label\n1,x,2,3,0\n2,y,3,4,1\n",
        filename="t.csv",
        metadata={
            "name": "t",
            "label_column": "label",
            "columns": [
                {"name": "a", "type": "numeric", "bounds": [0, 5]},
                {"name": "b", "type": "categorical", "categories": ["x", "y"]},
                {"name": "c", "type": "numeric", "bounds": [0, 5]},
                {"name": "d", "type": "numeric", "bounds": [0, 5]},
            ],
            "classes": [0, 1],
            "budget": {"epsilon": 1, "delta": 1e-5},
            "feature_shape": [5, 1],
        },
    )
    assert categorical.status_code == 422 and "no image shape" in categorical.text
    assert h.client.get("/datasets", headers=h.headers(owner)).json()["items"] == []
