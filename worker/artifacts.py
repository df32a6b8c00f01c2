"""Serialising a release: NPZ, CSV or Parquet, each carrying the same columns and metadata."""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def column_names(feature_names: list[str], classes: list[Any]) -> tuple[list[str], list[str]]:
    return [f"x_{name}" for name in feature_names], [f"y_{c}" for c in classes]


def serialise(
    fmt: str,
    *,
    X: np.ndarray,
    Y: np.ndarray,
    feature_names: list[str],
    classes: list[Any],
    metadata: dict[str, Any],
    extra: dict[str, np.ndarray] | None = None,
) -> bytes:
    """``extra`` arrays (data-independent, e.g. a projection matrix) go into NPZ only."""
    meta_json = json.dumps(metadata, sort_keys=True)
    if fmt == "npz":
        buffer = io.BytesIO()
        arrays: dict[str, Any] = {"X": X, "y": Y, "metadata": np.array(meta_json), **(extra or {})}
        np.savez(buffer, **arrays)
        return buffer.getvalue()
    x_cols, y_cols = column_names(feature_names, classes)
    columns = {name: X[:, i] for i, name in enumerate(x_cols)}
    columns.update({name: Y[:, j] for j, name in enumerate(y_cols)})
    table = pa.table(columns)
    if fmt == "parquet":
        table = table.replace_schema_metadata({"dprelease": meta_json})
        buffer = io.BytesIO()
        pq.write_table(table, buffer)
        return buffer.getvalue()
    if fmt == "csv":
        import pyarrow.csv as pacsv

        buffer = io.BytesIO()
        pacsv.write_csv(table, buffer)
        return buffer.getvalue()
    raise ValueError(f"unknown release format {fmt!r}")
