"""Schema-aware uploads (issue 15, item 1): declared categorical and numeric columns and
missing-value policies, through the API in one mode (parsing and validation do not depend on it).

- a patients-style CSV (sex and ward categorical, age numeric with gaps, a 5 % outcome) uploads
  and a dpmix release of it carries one column per one-hot feature, in [0, 1], and the
  declared columns in its metadata;
- a value outside a column's declared categories is refused naming the column, not the value;
- a missing value in a column without a policy is refused; an indicator policy adds a feature;
- NPZ uploads with categorical columns are refused; invalid declarations answer 422.
"""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
import pandas as pd
import pytest

from tests.conftest import Harness, npz_bytes, toy_dataset
from tests.integration.test_uploads import _dataset_rows, _stored_objects

BUDGET = {"epsilon": 5, "delta": 1e-5}
COLUMNS: list[dict[str, Any]] = [
    {"name": "sex", "type": "categorical", "categories": ["F", "M"]},
    {"name": "ward", "type": "categorical", "categories": ["A", "B", "C", "D"]},
    {"name": "age", "type": "numeric", "bounds": [0, 100], "missing": {"policy": "indicator"}},
]
META: dict[str, Any] = {
    "name": "patients",
    "label_column": "outcome",
    "columns": COLUMNS,
    "classes": [0, 1],
    "budget": BUDGET,
}
FEATURES = ["sex=F", "sex=M", "ward=A", "ward=B", "ward=C", "ward=D", "age", "age_missing"]


def patients(n: int = 200, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    age = rng.integers(18, 95, size=n).astype(object)
    age[rng.random(n) < 0.1] = None  # gaps: empty cells in the CSV
    outcome = np.zeros(n, dtype=int)
    outcome[: n // 20] = 1  # 5 %
    return pd.DataFrame(
        {
            "sex": rng.choice(["F", "M"], size=n),
            "ward": rng.choice(["A", "B", "C"], size=n),  # D declared, absent
            "age": age,
            "outcome": rng.permutation(outcome),
        }
    )


def _csv(frame: pd.DataFrame) -> bytes:
    return frame.to_csv(index=False).encode()


def _refused(h: Harness, owner: str, content: bytes, filename: str, meta: dict[str, Any]) -> str:
    objects, rows = _stored_objects(h), _dataset_rows(h)
    r = h.upload(owner, content, filename=filename, metadata=meta)
    assert r.status_code == 422, r.text
    assert (_stored_objects(h), _dataset_rows(h)) == (objects, rows)  # nothing stored
    message: str = r.json()["error"]["message"]
    return message


@pytest.mark.modes("real")
def test_patients_csv_uploads_and_releases_one_category_per_row(harness: Harness) -> None:
    h = harness
    owner, _ = h.new_key("owner")
    r = h.upload(owner, _csv(patients()), filename="patients.csv", metadata=dict(META))
    assert r.status_code == 201, r.text
    body = r.json()
    assert (body["n_rows"], body["n_features"]) == (200, len(FEATURES))
    assert [c["name"] for c in body["columns"]] == ["sex", "ward", "age"]
    rel = h.client.post(
        "/releases",
        json=h.release_body(body["id"], params={"mixture_degree": 4, "n_samples": 50}),
        headers=h.headers(owner),
    )
    assert rel.status_code == 202, rel.text
    done = h.wait(owner, rel.json()["id"])
    assert done["status"] == "succeeded", done
    with np.load(io.BytesIO(h.download(owner, done["id"]))) as npz:
        X, meta = npz["X"], json.loads(str(npz["metadata"]))
    assert meta["feature_names"] == FEATURES
    assert [c["name"] for c in meta["declared_columns"]] == ["sex", "ward", "age"]
    assert meta["declared_columns"][1]["categories"] == ["A", "B", "C", "D"]
    assert "one category per row" in meta["categorical_decoding"]
    assert meta["preprocessing"]["domain"].startswith("rows in the declared domain")
    for block in ([0, 1], [2, 3, 4, 5]):
        part = X[:, block]
        assert set(np.unique(part)) <= {0.0, 1.0}
        assert (part.sum(axis=1) == 1).all()
    # The owner's raw copy keeps the noisy mixtures as drawn.
    with np.load(io.BytesIO(h.download(owner, done["id"], "raw"))) as npz:
        drawn = npz["X"]
    assert drawn.shape == X.shape and not set(np.unique(drawn[:, [2, 3, 4, 5]])) <= {0.0, 1.0}


def test_a_projection_of_declared_columns_is_not_decoded(embedded: Harness) -> None:
    """Random projection's features are projections, not the declared columns: the
    categorical blocks are decoded only in the dataset's own feature space."""
    h = embedded
    owner, _ = h.new_key("owner")
    r = h.upload(owner, _csv(patients()), filename="patients.csv", metadata=dict(META))
    assert r.status_code == 201, r.text
    body = h.release_body(
        r.json()["id"], mechanism="random_projection", params={"projection_dim": 3}
    )
    rel = h.client.post("/releases", json=body, headers=h.headers(owner))
    assert rel.status_code == 202, rel.text
    done = h.wait(owner, rel.json()["id"])
    assert done["status"] == "succeeded", done
    with np.load(io.BytesIO(h.download(owner, done["id"]))) as npz:
        assert npz["X"].shape == (200, 3)
        assert npz["projection"].shape == (3, len(FEATURES))


@pytest.mark.modes("real")
def test_preview_noise_guide_names_the_declared_features(harness: Harness) -> None:
    """The noise guide reads the declaration: one entry per encoded feature, in its order,
    numeric columns in their own units and one-hot or indicator features on [0, 1]."""
    h = harness
    owner, _ = h.new_key("owner")
    r = h.upload(owner, _csv(patients()), filename="patients.csv", metadata=dict(META))
    assert r.status_code == 201, r.text
    body = h.release_body(r.json()["id"], params={"mixture_degree": 4, "n_samples": 50})
    preview = h.client.post("/releases/preview", json=body, headers=h.headers(owner))
    assert preview.status_code == 200, preview.text
    guide = preview.json()["noise_guide"]
    assert guide["applies"], guide
    columns = {c["column"]: c for c in guide["columns"]}
    assert list(columns) == FEATURES
    age, sex = columns["age"], columns["sex=F"]
    assert sex["range"] == [0.0, 1.0]
    lo, hi = age["range"]
    assert age["noise_std_raw"] == pytest.approx(sex["noise_std_raw"] * (hi - lo), rel=1e-6)


@pytest.mark.modes("real")
def test_parquet_with_nulls_and_a_constant_policy(harness: Harness) -> None:
    h = harness
    owner, _ = h.new_key("owner")
    frame = pd.DataFrame(
        {
            "ward": pd.array([1, 2, None, 3], dtype="Int64"),  # integer categories with a null
            "age": [30.0, None, 50.0, 70.0],
            "outcome": ["y", "n", "n", "y"],
        }
    )
    buffer = io.BytesIO()
    frame.to_parquet(buffer)
    meta = {
        "name": "p",
        "label_column": "outcome",
        "columns": [
            {
                "name": "ward",
                "type": "categorical",
                "categories": [1, 2, 3],
                "missing": {"policy": "constant", "value": "2"},
            },
            {
                "name": "age",
                "type": "numeric",
                "bounds": [0, 100],
                "missing": {"policy": "indicator", "fill": 40},
            },
        ],
        "classes": ["n", "y"],
        "budget": BUDGET,
    }
    r = h.upload(owner, buffer.getvalue(), filename="p.parquet", metadata=meta)
    assert r.status_code == 201, r.text
    assert r.json()["n_features"] == 5  # ward=1..3, age, age_missing


@pytest.mark.modes("real")
def test_undeclared_category_names_the_column_not_the_value(harness: Harness) -> None:
    h = harness
    owner, _ = h.new_key("owner")
    frame = patients(n=20)
    frame.loc[7, "ward"] = "Zebra-ward-secret"
    message = _refused(h, owner, _csv(frame), "p.csv", dict(META))
    assert "'ward'" in message and "declared categories" in message, message
    assert "Zebra" not in message and "row 8" not in message, message


@pytest.mark.modes("real")
def test_missing_value_without_a_policy_is_refused(harness: Harness) -> None:
    h = harness
    owner, _ = h.new_key("owner")
    frame = patients(n=20)
    frame.loc[4, "sex"] = None
    message = _refused(h, owner, _csv(frame), "p.csv", dict(META))
    assert "'sex'" in message and "missing" in message and "policy" in message, message


@pytest.mark.modes("real")
def test_missing_numeric_without_a_policy_is_refused(harness: Harness) -> None:
    h = harness
    owner, _ = h.new_key("owner")
    columns = [*COLUMNS[:2], {"name": "age", "type": "numeric", "bounds": [0, 100]}]
    message = _refused(h, owner, _csv(patients(n=20)), "p.csv", {**META, "columns": columns})
    assert "'age'" in message and "missing-value policy" in message, message


@pytest.mark.modes("real")
def test_npz_with_categorical_columns_is_refused(harness: Harness) -> None:
    h = harness
    owner, _ = h.new_key("owner")
    X, y = toy_dataset(n=20, d=2)
    meta = {
        "name": "n",
        "columns": [
            {"name": "0", "type": "categorical", "categories": [0, 1]},
            {"name": "1", "type": "numeric", "bounds": [0, 13]},
        ],
        "classes": [0, 1, 2],
        "budget": BUDGET,
    }
    message = _refused(h, owner, npz_bytes(X, y), "d.npz", meta)
    assert "npz" in message and "categorical" in message, message
    numeric = {**meta, "columns": [{"name": n, "type": "numeric", "bounds": [0, 13]} for n in "01"]}
    r = h.upload(owner, npz_bytes(X, y), filename="d.npz", metadata=numeric)
    assert r.status_code == 201, r.text  # all-numeric columns are per-feature bounds


BAD_DECLARATIONS: list[tuple[dict[str, Any], str]] = [
    ({**META, "feature_range": [0, 1]}, "not both"),
    ({k: v for k, v in META.items() if k != "columns"}, "feature_range"),
    ({**META, "columns": []}, "at least one column"),
    ({**META, "columns": [COLUMNS[0], COLUMNS[0]]}, "more than once"),
    ({**META, "columns": [{**COLUMNS[0], "categories": []}]}, "at least one category"),
    ({**META, "columns": [{**COLUMNS[0], "categories": ["F", "F"]}]}, "distinct"),
    ({**META, "columns": [{**COLUMNS[2], "bounds": [5, 5]}]}, "lo < hi"),
    ({**META, "columns": [{**COLUMNS[0], "name": "outcome"}]}, "label column"),
    ({**META, "columns": [{**COLUMNS[0], "type": "text"}]}, "type"),
    (
        {**META, "columns": [{**COLUMNS[2], "missing": {"policy": "constant", "value": 200}}]},
        "within its bounds",
    ),
    (
        {**META, "columns": [{**COLUMNS[0], "missing": {"policy": "constant", "value": "X"}}]},
        "declared categories",
    ),
    (
        {**META, "columns": [{**COLUMNS[2], "missing": {"policy": "constant", "value": True}}]},
        "missing",
    ),
    (
        {**META, "columns": [COLUMNS[0], {"name": "sex=F", "type": "numeric", "bounds": [0, 1]}]},
        "arises twice",
    ),
]


@pytest.mark.modes("real")
@pytest.mark.parametrize("case", range(len(BAD_DECLARATIONS)))
def test_invalid_declarations_are_refused(harness: Harness, case: int) -> None:
    h = harness
    owner, _ = h.new_key("owner")
    meta, phrase = BAD_DECLARATIONS[case]
    message = _refused(h, owner, _csv(patients(n=20)), "p.csv", dict(meta))
    assert "invalid metadata" in message and phrase in message, message


@pytest.mark.modes("real")
def test_file_columns_must_match_the_declaration(harness: Harness) -> None:
    h = harness
    owner, _ = h.new_key("owner")
    frame = patients(n=20).assign(extra=1.0)
    message = _refused(h, owner, _csv(frame), "p.csv", dict(META))
    assert "not declared" in message and "'extra'" in message, message
