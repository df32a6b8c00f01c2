"""Release tables use the dataset's own column names, and the label column its own name in the
form the mechanism's label kind gives (issue 15, item 2): written by the worker's writer, read
back by evaluation in every format."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from dpcore.artifacts import ArtifactWriter
from dpcore.evaluation import load_release_file, release_from_file
from dpcore.mechanisms import registry
from dpcore.release_layout import Layout, LayoutError, collisions

FEATURES = ["age", "ward=A", "ward=B", "income_missing"]
ROWS = 300


def _rows(kind: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Features, and label vectors as a mechanism of ``kind`` draws them."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((ROWS, len(FEATURES))).astype(np.float32)
    if kind == "exact":
        Y = np.eye(3, dtype=np.float32)[rng.integers(0, 3, ROWS)]
    else:  # noisy class vectors or signed combinations: any sign
        Y = rng.standard_normal((ROWS, 3)).astype(np.float32)
        Y[0] = -1.0  # nothing positive: uniform proportions
    return X, Y


def _write(path: Path, kind: str, classes: list[Any], X: np.ndarray, Y: np.ndarray) -> Layout:
    layout = Layout.of(FEATURES, "outcome", kind, classes)  # type: ignore[arg-type]
    meta = {"mechanism": "dpmix", "params": {}, "classes": classes}
    with ArtifactWriter(path.suffix[1:], path, rows=ROWS, layout=layout, metadata=meta) as w:
        for start in range(0, ROWS, 128):
            w.write(X[start : start + 128], Y[start : start + 128])
    return layout


def _table(path: Path) -> pa.Table:
    return pq.read_table(path) if path.suffix == ".parquet" else pacsv.read_csv(path)


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
@pytest.mark.parametrize(
    "classes", [[0, 1, 2], ["no", "yes", "maybe"]], ids=["int-classes", "text-classes"]
)
def test_exact_labels_are_one_column_holding_the_class(
    tmp_path: Path, fmt: str, classes: list[Any]
) -> None:
    X, Y = _rows("exact")
    path = tmp_path / f"release.{fmt}"
    _write(path, "exact", classes, X, Y)
    table = _table(path)
    assert table.column_names == [*FEATURES, "outcome"]
    # The class is the mechanism's one-hot argmax, named as declared.
    assert table.column("outcome").to_pylist() == [classes[i] for i in Y.argmax(axis=1)]
    # Integers stay integers; any other class set is text.
    expected = pa.int64() if isinstance(classes[0], int) else pa.string()
    assert table.schema.field("outcome").type == expected
    np.testing.assert_allclose(table.column("ward=A").to_numpy(), X[:, 1], rtol=1e-6)


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_proportions_are_class_columns_summing_to_one(tmp_path: Path, fmt: str) -> None:
    X, Y = _rows("proportions")
    path = tmp_path / f"release.{fmt}"
    _write(path, "proportions", [0, 1, 2], X, Y)
    table = _table(path)
    assert table.column_names == [*FEATURES, "outcome=0", "outcome=1", "outcome=2"]
    P = np.column_stack([table.column(f"outcome={c}").to_numpy() for c in range(3)])
    assert (P >= 0).all()
    np.testing.assert_allclose(P.sum(axis=1), 1.0, rtol=1e-6)
    positive = np.clip(Y, 0, None)
    total = positive.sum(axis=1, keepdims=True)
    assert total[0] == 0
    # Negative parts set to 0, scaled to sum to 1; uniform where nothing positive is left.
    expected = np.where(total > 0, positive / np.where(total > 0, total, 1), 1 / 3)
    np.testing.assert_allclose(P, expected, rtol=1e-5)


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_combinations_are_class_columns_as_drawn(tmp_path: Path, fmt: str) -> None:
    X, Y = _rows("combinations")
    path = tmp_path / f"release.{fmt}"
    _write(path, "combinations", ["a", "b", "c"], X, Y)
    table = _table(path)
    assert table.column_names == [*FEATURES, "outcome=a", "outcome=b", "outcome=c"]
    values = np.column_stack([table.column(f"outcome={c}").to_numpy() for c in "abc"])
    np.testing.assert_allclose(values, Y, rtol=1e-6)  # signed, unchanged


def test_the_metadata_states_the_layout(tmp_path: Path) -> None:
    X, Y = _rows("proportions")
    _write(tmp_path / "r.parquet", "proportions", [0, 1, 2], X, Y)
    layout = json.loads(pq.read_schema(tmp_path / "r.parquet").metadata[b"dprelease"])["layout"]
    assert layout["feature_columns"] == FEATURES
    assert layout["label_column"] == "outcome"
    assert layout["label_kind"] == "proportions"
    assert layout["label_columns"] == ["outcome=0", "outcome=1", "outcome=2"]
    assert layout["label_column_classes"] == [0, 1, 2]
    assert "proportions" in layout["label_meaning"]


def test_the_raw_copy_keeps_label_vectors_as_drawn(tmp_path: Path) -> None:
    X, Y = _rows("proportions")
    layout = Layout.of(FEATURES, "outcome", "proportions", [0, 1, 2], as_drawn=True)
    with ArtifactWriter(
        "parquet", tmp_path / "raw.parquet", rows=ROWS, layout=layout, metadata={}
    ) as w:
        w.write(X, Y)
    table = pq.read_table(tmp_path / "raw.parquet")
    assert table.column_names == [*FEATURES, "outcome=0", "outcome=1", "outcome=2"]
    np.testing.assert_allclose(table.column("outcome=2").to_numpy(), Y[:, 2])


def test_exact_labels_that_are_not_one_hot_are_refused(tmp_path: Path) -> None:
    X, Y = _rows("proportions")
    with pytest.raises(LayoutError, match="non-one-hot"):
        _write(tmp_path / "r.csv", "exact", [0, 1, 2], X, Y)


def test_a_label_column_repeating_a_feature_name_is_refused() -> None:
    with pytest.raises(LayoutError, match=r"\['ward=A'\]"):
        Layout.of(FEATURES, "ward", "proportions", ["A", "C"])
    with pytest.raises(LayoutError, match=r"\['age'\]"):
        Layout.of(FEATURES, "age", "exact", [0, 1])
    # Exact labels name one column: 'ward' itself is no feature, so that table is fine.
    assert Layout.of(FEATURES, "ward", "exact", ["A", "C"]).columns == [*FEATURES, "ward"]
    # An upload is checked for every kind a mechanism may have.
    assert collisions(FEATURES, "ward", ["A", "C"]) == ["ward=A"]
    assert collisions(["0", "1"], None, [0, 1]) == []  # NPZ: the default name "label"


def test_every_mechanism_declares_its_label_kind() -> None:
    kinds = {spec.name: spec.label_kind for spec in registry.specs()}
    assert {n: kinds[n] for n in ("dpcda", "clustmix", "dpgm")} == dict.fromkeys(
        ("dpcda", "clustmix", "dpgm"), "exact"
    )
    for name in ("dpmix", "local_perturbation", "random_projection"):
        assert kinds[name] == "proportions"
    assert kinds["sgdrm"] == "combinations"
    # Only signed combinations are regressed; every other kind trains as distributions.
    assert [s.name for s in registry.specs() if not s.soft_labels] == ["sgdrm"]


@pytest.mark.parametrize("kind", ["exact", "proportions", "combinations"])
@pytest.mark.parametrize("fmt", ["npz", "csv", "parquet"])
def test_evaluation_reads_every_format_back(tmp_path: Path, fmt: str, kind: str) -> None:
    X, Y = _rows(kind)
    path = tmp_path / f"release.{fmt}"
    classes = ["001", "1", "x"]  # text that looks like numbers stays text
    layout = _write(path, kind, classes, X, Y)
    metadata = {"mechanism": "dpmix", "params": {}, "classes": classes, "layout": layout.describe()}
    given = metadata if fmt == "csv" else None  # a CSV release carries no metadata
    release = load_release_file(path, given)
    same = release_from_file(path, fmt, metadata, {})
    expected = layout.labels(Y)
    for read in (release, same):
        np.testing.assert_allclose(read.X, X, rtol=1e-6)
        np.testing.assert_allclose(read.Y, expected, rtol=1e-6, atol=1e-7)
        assert read.soft_labels == (kind != "combinations")


def test_a_csv_release_without_metadata_says_to_pass_it(tmp_path: Path) -> None:
    X, Y = _rows("exact")
    _write(tmp_path / "release.csv", "exact", [0, 1, 2], X, Y)
    with pytest.raises(ValueError, match="--metadata"):
        load_release_file(tmp_path / "release.csv")


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_a_release_made_before_layouts_still_reads(tmp_path: Path, fmt: str) -> None:
    X, Y = _rows("proportions")
    columns = {f"x_{n}": X[:, i] for i, n in enumerate(FEATURES)}
    columns |= {f"y_{c}": Y[:, c] for c in range(3)}
    table = pa.table(columns)
    path = tmp_path / f"old.{fmt}"
    if fmt == "csv":
        pacsv.write_csv(table, path)
    else:
        meta = {"mechanism": "dpmix", "params": {}, "classes": [0, 1, 2]}
        pq.write_table(table.replace_schema_metadata({"dprelease": json.dumps(meta)}), path)
    release = load_release_file(path)
    np.testing.assert_allclose(release.X, X, rtol=1e-6)
    np.testing.assert_allclose(release.Y, Y, rtol=1e-6)
    assert [str(c) for c in release.metadata["classes"]] == ["0", "1", "2"]
