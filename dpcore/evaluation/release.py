"""A release read back from its artifact (NPZ, CSV or Parquet) with its metadata: features X,
the label matrix Y, and what its mechanism says about evaluating it."""

from __future__ import annotations

import io
import json
import math
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dpcore import release_layout
from dpcore.mechanisms.spec import EvaluationHints, soft_labels


@dataclass
class Release:
    X: np.ndarray
    Y: np.ndarray
    metadata: dict[str, Any]
    extra: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def hints(self) -> EvaluationHints:
        return hints_for(self.metadata["mechanism"])

    @property
    def soft_labels(self) -> bool:
        """Train on the labels as class distributions (else regress them): from the label
        kind the release's layout states, else its mechanism's (a release made before
        layouts), else soft (a mechanism this installation does not know)."""
        layout = release_layout.read_layout(self.metadata)
        if layout is not None:
            return soft_labels(layout.kind)
        from dpcore.mechanisms import registry

        try:
            return registry.get(self.metadata["mechanism"]).soft_labels
        except ValueError:
            return True

    @property
    def image_shape(self) -> tuple[int, ...] | None:
        """(h, w) when the release's rows are images: its metadata's 2-D feature shape, or,
        for a file without that metadata (a CSV release), d a perfect square ≥ 64 (28 × 28)."""
        if not self.hints.image_features:
            return None
        if "feature_shape" in self.metadata:
            shape = tuple(self.metadata["feature_shape"])
            return shape if len(shape) == 2 else None
        side = math.isqrt(self.X.shape[1])
        return (side, side) if side * side == self.X.shape[1] and side >= 8 else None


def hints_for(mechanism: str) -> EvaluationHints:
    """The mechanism's evaluation hints (defaults for one this installation does not know:
    unit-scale features, soft labels)."""
    from dpcore.mechanisms import registry

    try:
        return registry.get(mechanism).evaluation
    except ValueError:
        return EvaluationHints()


def load_release(content: bytes) -> Release:
    with np.load(io.BytesIO(content), allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    metadata = json.loads(str(arrays.pop("metadata")))
    X, Y = arrays.pop("X"), arrays.pop("y")
    return Release(X.astype(np.float64), Y.astype(np.float64), metadata, arrays)


def detect_format(path: Any) -> str:
    """npz, parquet or csv, from the file's first bytes (an NPZ is a zip, a Parquet file starts
    with PAR1), so a misnamed file is still read as what it is."""
    with open(path, "rb") as handle:
        head = handle.read(4)
    if head[:2] == b"PK":
        return "npz"
    if head == b"PAR1":
        return "parquet"
    return "csv"


def read_table(path: Any, fmt: str, text_columns: Sequence[str] = ()) -> Any:
    """The table in ``path``; ``text_columns`` (CSV) are read as text, not typed by their
    look, an empty cell as missing."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    try:
        if fmt == "parquet":
            return pq.read_table(path)
        types = {name: pa.string() for name in text_columns}
        options = pacsv.ConvertOptions(column_types=types, strings_can_be_null=True)
        return pacsv.read_csv(path, convert_options=options)
    except Exception as exc:  # pyarrow's errors have no common base worth naming
        raise ValueError(f"cannot read {path} as {fmt}: {exc}") from None


def load_release_file(path: Any, metadata: dict[str, Any] | None = None) -> Release:
    """A release file as the service writes it (dpcore/artifacts.py), whatever its format.

    NPZ and Parquet carry their metadata (the NPZ's ``metadata`` array, the Parquet schema's
    ``dprelease`` key); a CSV release carries none: pass ``metadata`` (the release's
    ``metadata.json`` artifact), which also overrides what a file carries. The metadata's
    ``layout`` names the columns (``dpcore.release_layout``). A release made before layouts
    (columns ``x_<feature>``, ``y_<class>``) still reads, without metadata too: classes from
    the ``y_<class>`` columns, no feature range (test rows are then used as given)."""
    fmt = detect_format(path)
    if fmt == "npz":
        try:
            with open(path, "rb") as handle:
                release = load_release(handle.read())
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
            raise ValueError(
                f"cannot read {path} as an NPZ release (X, y, metadata): {exc}"
            ) from None
        if metadata is not None:
            release.metadata = metadata
        return release
    if metadata is None and fmt == "parquet":
        stored = _read_schema(path).metadata or {}
        if b"dprelease" in stored:
            metadata = json.loads(stored[b"dprelease"])
    table = read_table(path, fmt, _text_columns(metadata) if fmt == "csv" else ())
    return _table_release(table, path, metadata, {})


def _read_schema(path: Any) -> Any:
    import pyarrow.parquet as pq

    try:
        return pq.read_schema(path)
    except Exception as exc:  # pyarrow's errors have no common base worth naming
        raise ValueError(f"cannot read {path} as parquet: {exc}") from None


def _text_columns(metadata: Mapping[str, Any] | None) -> list[str]:
    layout = release_layout.read_layout(metadata) if metadata is not None else None
    return release_layout.text_columns(layout)


def _table_release(
    table: Any, path: Any, metadata: dict[str, Any] | None, extra: dict[str, np.ndarray]
) -> Release:
    """X and the label matrix Y of a CSV or Parquet release table, by its layout (an exact
    label column becomes one-hot rows), or by the ``x_``/``y_`` names of an older release."""
    layout = release_layout.read_layout(metadata) if metadata is not None else None
    if layout is None:
        return _legacy_table_release(table, path, metadata, extra)
    try:
        X, Y = release_layout.table_rows(table, layout, metadata or {})
    except release_layout.LayoutError as exc:
        raise ValueError(f"{path} does not match its metadata's layout: {exc}") from None
    assert metadata is not None
    return Release(X, Y, metadata, extra)


def _legacy_table_release(
    table: Any, path: Any, metadata: dict[str, Any] | None, extra: dict[str, np.ndarray]
) -> Release:
    """A release made before layouts: ``x_<feature>`` then ``y_<class>`` columns."""
    x_cols = [c for c in table.column_names if c.startswith("x_")]
    y_cols = [c for c in table.column_names if c.startswith("y_")]
    if not x_cols or not y_cols:
        raise ValueError(
            f"{path} is a release table whose columns are named in its metadata's layout; "
            "give the release's metadata (dprelease evaluate --metadata metadata.json: the "
            "release's metadata.json artifact, or a Parquet release's own) — found columns "
            f"{table.column_names[:10]} and no layout"
        )
    if metadata is None:
        metadata = {
            "mechanism": "unknown",
            "params": {},
            "classes": [c[2:] for c in y_cols],
            "feature_names": [c[2:] for c in x_cols],
        }
    X, Y = release_layout.stack_columns(table, x_cols), release_layout.stack_columns(table, y_cols)
    if len(metadata.get("classes", y_cols)) != len(y_cols):
        raise ValueError(
            f"{path} has {len(y_cols)} label columns, "
            f"its metadata {len(metadata['classes'])} classes"
        )
    return Release(X, Y, metadata, extra)


def release_from_file(
    path: Any, fmt: str, metadata: dict[str, Any], extra: dict[str, np.ndarray]
) -> Release:
    """A release read back from its artifact file (NPZ, CSV or Parquet) with its metadata."""
    if fmt == "npz":
        with open(path, "rb") as handle:
            return load_release(handle.read())
    table = read_table(path, fmt, _text_columns(metadata) if fmt == "csv" else ())
    return _table_release(table, path, metadata, extra)
