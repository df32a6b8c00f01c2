"""Release tables name their columns as the dataset does (issue 15, item 2): the declared
features, then the label column under its own name — the class for mechanisms with exact
labels, '<label>=<class>' proportions or signed values otherwise — through the API, read back
by evaluation from the file and its metadata; a dataset whose label columns would repeat a
feature's name is refused at upload."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from dpcore.evaluation import evaluate, load_release_file
from tests.conftest import Harness
from tests.integration.test_schema_uploads import FEATURES, META, _csv, _refused, patients

LABELS = {
    "exact": ["outcome"],
    "proportions": ["outcome=0", "outcome=1"],
    "combinations": ["outcome=0", "outcome=1"],
}
CASES = [
    ("dpcda", "exact", "csv"),
    ("dpcda", "exact", "parquet"),
    ("clustmix", "exact", "npz"),
    ("dpmix", "proportions", "csv"),
    ("local_perturbation", "proportions", "parquet"),
    ("sgdrm", "combinations", "parquet"),
]
PARAMS: dict[str, dict[str, Any]] = {
    "dpcda": {"min_class_size": 100, "mixture_degree": 4},
    "clustmix": {"clusters_per_class": 2},
}


def _patients(n: int, seed: int) -> pd.DataFrame:
    """The patients table with an outcome in a quarter of the rows (exactly n/4): dpcda's
    declared smallest class size holds."""
    frame = patients(n, seed)
    outcome = np.zeros(n, dtype=int)
    outcome[: n // 4] = 1
    frame["outcome"] = np.random.default_rng(seed).permutation(outcome)
    return frame


def _release(h: Harness, mechanism: str, fmt: str) -> tuple[str, dict[str, Any]]:
    owner, _ = h.new_key("owner")
    r = h.upload(owner, _csv(_patients(400, 0)), filename="patients.csv", metadata=dict(META))
    assert r.status_code == 201, r.text
    params = PARAMS.get(mechanism, {})
    body = h.release_body(r.json()["id"], mechanism=mechanism, params=params, format=fmt)
    body["epsilon"] = 4.0
    rel = h.client.post("/releases", json=body, headers=h.headers(owner))
    assert rel.status_code == 202, rel.text
    done = h.wait(owner, rel.json()["id"])
    assert done["status"] == "succeeded", done
    return owner, done


def _read(h: Harness, owner: str, done: dict[str, Any], fmt: str, tmp: Path) -> Any:
    """The table, its metadata (the CSV's metadata.json artifact) and the file's path."""
    content = h.download(owner, done["id"])
    path = tmp / f"release.{fmt}"
    path.write_bytes(content)
    if fmt == "npz":
        with np.load(path) as npz:
            return None, json.loads(str(npz["metadata"])), path
    if fmt == "parquet":
        table = pq.read_table(path)
        return table, json.loads(table.schema.metadata[b"dprelease"]), path
    meta = json.loads(h.download(owner, done["id"], "metadata.json"))
    label = meta["layout"]["label_column"]
    options = pacsv.ConvertOptions(column_types={label: pa.string()}, strings_can_be_null=True)
    return pacsv.read_csv(path, convert_options=options), meta, path


def _check(h: Harness, mechanism: str, kind: str, fmt: str, tmp: Path) -> None:
    owner, done = _release(h, mechanism, fmt)
    table, meta, path = _read(h, owner, done, fmt, tmp)
    layout = meta["layout"]
    assert layout["feature_columns"] == FEATURES
    assert layout["label_column"] == "outcome"
    assert (layout["label_kind"], layout["label_columns"]) == (kind, LABELS[kind])
    release = load_release_file(path, meta if fmt == "csv" else None)
    assert release.X.shape[1] == len(FEATURES) and release.Y.shape[1] == 2
    if table is not None:
        # Rows in the declared domain: the uploaded columns; SGDRM's: the encoded features.
        table_columns = [c["name"] for c in META["columns"]]
        if mechanism == "sgdrm":
            assert "table_columns" not in layout
            assert table.column_names == [*FEATURES, *LABELS[kind]]
        else:
            assert [c["name"] for c in layout["table_columns"]] == table_columns
            assert table.column_names == [*table_columns, *LABELS[kind]]
        if kind == "exact":
            values = table.column("outcome").to_pylist()
            assert {str(v) for v in values} <= {"0", "1"}
            if fmt == "parquet":  # integer classes stay integers
                assert table.schema.field("outcome").type == pa.int64()
            # Read back as one-hot rows of the same classes.
            assert [str(v) for v in values] == [str(c) for c in release.Y.argmax(axis=1)]
        elif kind == "proportions":
            P = np.column_stack([table.column(c).to_numpy() for c in LABELS[kind]])
            assert (P >= 0).all() and np.allclose(P.sum(axis=1), 1.0, atol=1e-5)
        else:
            Y = np.column_stack([table.column(c).to_numpy() for c in LABELS[kind]])
            assert (Y < 0).any()  # signed values, as drawn
    else:  # NPZ keeps X and y (one-hot for exact labels)
        assert set(np.unique(release.Y)) <= {0.0, 1.0}
        assert np.allclose(release.Y.sum(axis=1), 1.0)
    # Evaluation runs on it end to end (test rows: a fresh patients table, encoded).
    frame = _patients(300, seed=1)
    X_test = np.column_stack(
        [
            (frame["sex"] == "F"),
            (frame["sex"] == "M"),
            *[(frame["ward"] == w) for w in "ABCD"],
            frame["age"].fillna(0).astype(float),
            frame["age"].isna(),
        ]
    ).astype(float)
    report = evaluate(release, X_test, frame["outcome"].to_numpy(), classifiers=("logistic",))
    assert report["accuracy"]["logistic"] is not None


@pytest.mark.parametrize(("mechanism", "kind", "fmt"), CASES)
def test_release_tables_use_the_datasets_names(
    embedded: Harness, tmp_path: Path, mechanism: str, kind: str, fmt: str
) -> None:
    _check(embedded, mechanism, kind, fmt, tmp_path)


def test_release_tables_use_the_datasets_names_real_mode(real: Harness, tmp_path: Path) -> None:
    _check(real, "dpcda", "exact", "csv", tmp_path)


def test_a_label_column_clashing_with_a_feature_is_refused_at_upload(embedded: Harness) -> None:
    h = embedded
    owner, _ = h.new_key("owner")
    frame = pd.DataFrame(
        {"age": [30, 40, 50, 60], "outcome=1": [1, 2, 3, 4], "outcome": [0, 1, 0, 1]}
    )
    meta = {
        "name": "clash",
        "label_column": "outcome",
        "feature_range": [0, 100],
        "classes": [0, 1],
        "budget": {"epsilon": 1, "delta": 1e-5},
    }
    message = _refused(h, owner, _csv(frame), "clash.csv", meta)
    assert "'outcome=1'" in message and "rename" in message, message
    r = h.upload(owner, _csv(frame), filename="clash.csv", metadata=meta)
    assert r.json()["error"]["code"] == "label_column_clash"
    assert r.json()["error"]["detail"] == {"columns": ["outcome=1"]}
    # Without the clash the same table uploads.
    renamed = frame.rename(columns={"outcome=1": "visits"})
    assert h.upload(owner, _csv(renamed), filename="ok.csv", metadata=meta).status_code == 201


def test_the_catalogue_states_each_mechanisms_label_kind(embedded: Harness) -> None:
    h = embedded
    owner, _ = h.new_key("owner")
    r = h.client.get("/mechanisms", headers=h.headers(owner))
    assert r.status_code == 200, r.text
    kinds = {m["name"]: m["label_kind"] for m in r.json()["items"]}
    assert {name: kinds[name] for name, _, _ in CASES} == {name: k for name, k, _ in CASES}
    assert kinds["dpgm"] == "exact" and kinds["random_projection"] == "proportions"
