"""A release of a declared table is that table: decoding, the files the writer makes in each
format, and both readers (evaluation's and the Python client's) coming back to the same rows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dpcore.artifacts import ArtifactWriter
from dpcore.categorical import encode_declared, encoded_names
from dpcore.domain import integer_features, into_domain, missing_indicators
from dpcore.evaluation.release import load_release_file
from dpcore.release_layout import Layout, LayoutError, read_layout
from dpcore.table import decode, table_columns
from dprelease_client.frames import read_release

DECLARED: list[dict[str, Any]] = [
    {"name": "ward", "type": "categorical", "categories": ["A", "B", "007"]},
    {
        "name": "age",
        "type": "numeric",
        "bounds": [0, 100],
        "integer": True,
        "missing": {"policy": "indicator"},
    },
    {"name": "mass", "type": "numeric", "bounds": [2500, 6500]},
    {
        "name": "stage",
        "type": "categorical",
        "categories": [1, 2, 3],
        "missing": {"policy": "indicator"},
    },
    {
        "name": "dose",
        "type": "numeric",
        "bounds": [0, 1],
        "missing": {"policy": "constant", "value": 0.5},
    },
]
CLASSES = (0, 1)


def _rows(n: int, seed: int) -> np.ndarray:
    """Noisy encoded rows (as a mechanism draws them) mapped into the declared domain."""
    rng = np.random.default_rng(seed)
    names = encoded_names(DECLARED)
    drawn = rng.normal(0.5, 0.6, size=(n, len(names)))
    drawn[:, names.index("age")] = rng.normal(50, 40, n)
    drawn[:, names.index("mass")] = rng.normal(4000, 3000, n)
    lo = np.array([0, 0, 0, 0, 0, 2500, 0, 0, 0, 0, 0], dtype=float)
    hi = np.array([1, 1, 1, 100, 1, 6500, 1, 1, 1, 1, 1], dtype=float)
    blocks = ((0, 1, 2), (6, 7, 8))
    return into_domain(
        drawn, lo, hi, blocks, rng, missing_indicators(DECLARED), integer_features(DECLARED)
    )


def _layout() -> Layout:
    return Layout.of(encoded_names(DECLARED), "outcome", "exact", CLASSES, declared=DECLARED)


def _metadata(layout: Layout) -> dict[str, Any]:
    return {
        "mechanism": "clustmix",
        "params": {},
        "classes": list(CLASSES),
        "declared_columns": DECLARED,
        "layout": layout.describe(),
    }


def test_integer_columns_are_rounded_without_bias_within_their_bounds() -> None:
    rng = np.random.default_rng(3)
    X = np.full((40_000, 1), 2.25)
    out = into_domain(X, np.array([0.0]), np.array([2.6]), (), rng, (), (0,))
    # Bounds [0, 2.6] hold the whole numbers 0…2: a 3 is out of bounds and becomes 2.
    assert set(np.unique(out)) == {2.0}
    X = np.full((40_000, 1), 1.25)
    out = into_domain(X, np.array([0.0]), np.array([5.0]), (), rng, (), (0,))
    assert set(np.unique(out)) == {1.0, 2.0}
    assert abs(out.mean() - 1.25) < 0.01  # up with probability 0.25


def test_decode_gives_each_declared_column_its_type_and_missing_entries() -> None:
    X = _rows(500, 0)
    columns = table_columns(DECLARED)
    assert [c.name for c in columns] == ["ward", "age", "mass", "stage", "dose"]
    decoded = dict(zip([c.name for c in columns], decode(X, columns), strict=True))
    ward, ward_missing = decoded["ward"]
    assert set(ward) <= {"A", "B", "007"} and not ward_missing.any()
    age, age_missing = decoded["age"]
    assert age.dtype == np.int64 and age.min() >= 0 and age.max() <= 100
    assert np.array_equal(age_missing, X[:, 4] == 1) and 0 < age_missing.mean() < 1
    stage, stage_missing = decoded["stage"]
    assert stage.dtype == np.int64 and set(stage[~stage_missing]) <= {1, 2, 3}
    assert np.array_equal(stage_missing, X[:, 9] == 1)
    mass, _ = decoded["mass"]
    assert mass.min() >= 2500 and mass.max() <= 6500


@pytest.mark.parametrize("fmt", ["csv", "parquet", "npz"])
def test_every_format_reads_back_as_the_table_and_as_the_encoded_rows(
    fmt: str, tmp_path: Path
) -> None:
    X = _rows(300, 1)
    Y = np.eye(2)[np.random.default_rng(2).integers(0, 2, 300)]
    layout = _layout()
    meta = _metadata(layout)
    path = tmp_path / f"release.{fmt}"
    with ArtifactWriter(fmt, path, rows=300, layout=layout, metadata=meta) as writer:
        writer.write(X[:100], Y[:100])
        writer.write(X[100:], Y[100:])
    if fmt == "csv":
        header = path.read_text().splitlines()[0]
        assert header == '"ward","age","mass","stage","dose","outcome"'
    # Evaluation re-encodes the table as the upload was: the rows it was decoded from, except
    # that a missing entry holds its declared fill (the middle of age's bounds; stage none).
    given = meta if fmt == "csv" else None
    release = load_release_file(path, given)
    expected = X.astype(np.float32).astype(np.float64)
    expected[X[:, 4] == 1, 3] = 50.0
    expected[X[:, 9] == 1, 6:9] = 0.0
    np.testing.assert_allclose(release.X, expected, rtol=1e-6)
    np.testing.assert_array_equal(release.Y, Y)
    # The client: the table with its types, whatever the format.
    frame = read_release(path, given)
    assert list(frame.columns) == ["ward", "age", "mass", "stage", "dose", "outcome"]
    assert str(frame["age"].dtype) == "Int64"
    assert frame["age"].isna().sum() == int((X[:, 4] == 1).sum())
    assert list(frame["ward"].cat.categories) == ["A", "B", "007"]
    assert list(frame["stage"].cat.categories) == [1, 2, 3]
    assert frame["stage"].isna().sum() == int((X[:, 9] == 1).sum())
    assert frame["mass"].between(2500, 6500).all() and not frame["dose"].isna().any()
    assert frame.attrs["dprelease"]["layout"]["table_columns"][1]["type"] == "integer"
    np.testing.assert_array_equal(frame["outcome"].to_numpy(dtype=int), Y.argmax(axis=1))
    # And back through the encoding evaluation uses for real rows: the same features.
    again = encode_declared(frame, DECLARED)
    np.testing.assert_allclose(again, expected, rtol=1e-6)


def test_read_layout_needs_the_declaration_its_table_names() -> None:
    layout = _layout()
    meta = _metadata(layout)
    assert read_layout(meta) == layout
    with pytest.raises(LayoutError, match="declared_columns"):
        read_layout({**meta, "declared_columns": None})
    renamed = [{**DECLARED[0], "name": "site"}, *DECLARED[1:]]
    with pytest.raises(LayoutError, match="do not match"):
        read_layout({**meta, "declared_columns": renamed})
    with pytest.raises(LayoutError, match="do not encode"):
        Layout.of(["a", "b"], "outcome", "exact", CLASSES, declared=DECLARED)
    assert json.loads(json.dumps(layout.describe()))["table_columns"][0]["values"] == "text"


@pytest.mark.parametrize("source", ["csv", "parquet", "npz"])
def test_conversion_rewrites_the_rows_in_every_format(source: str, tmp_path: Path) -> None:
    """Chunk by chunk (a chunk smaller than the file), to each other format: the same rows
    and labels, the same metadata, what a release made in that format holds."""
    from dpcore import conversion

    X = _rows(700, 4)
    Y = np.eye(2)[np.random.default_rng(5).integers(0, 2, 700)]
    layout = _layout()
    meta = _metadata(layout)
    path = tmp_path / f"release.{source}"
    with ArtifactWriter(source, path, rows=700, layout=layout, metadata=meta) as writer:
        writer.write(X, Y)
    reference = load_release_file(path, meta if source == "csv" else None)
    for target in ("csv", "parquet", "npz"):
        out = tmp_path / f"converted-{source}.{target}"
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(conversion, "CHUNK_ROWS", 256)
            conversion.convert(path, out, target, meta)
        again = load_release_file(out, meta if target == "csv" else None)
        np.testing.assert_allclose(again.X, reference.X, rtol=1e-6)
        np.testing.assert_array_equal(again.Y, reference.Y)
        if target != "csv":
            assert conversion.embedded_metadata(out) == json.loads(json.dumps(meta))


def test_an_npz_declaration_in_any_order_rounds_the_column_it_names() -> None:
    """An NPZ's features are named by their index in the file; a declaration may list them in
    any order, and the column it marks integer is the one rounded."""
    import io

    from service.datasets.parsing import parse_dataset
    from service.datasets.schemas import DatasetMetadata

    X = np.array([[0.25, 3.0, 1.5], [0.5, 4.0, 2.5], [0.0, 7.0, 0.5]])
    buffer = io.BytesIO()
    np.savez(buffer, X=X, y=np.array([0, 1, 0]))
    metadata = DatasetMetadata.model_validate(
        {
            "name": "d",
            "budget": {"epsilon": 1.0, "delta": 1e-5},
            "classes": [0, 1],
            "columns": [
                {"name": "1", "type": "numeric", "bounds": [0, 10], "integer": True},
                {"name": "2", "type": "numeric", "bounds": [0, 3]},
                {"name": "0", "type": "numeric", "bounds": [0, 0.5]},
            ],
        }
    )
    parsed = parse_dataset(
        content=buffer.getvalue(), filename="d.npz", metadata=metadata, max_bytes=1 << 20
    )
    assert parsed.feature_names[parsed.integer_features[0]] == "1"
    assert parsed.integer_features == (1,)
