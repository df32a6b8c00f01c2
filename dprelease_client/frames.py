"""A release artifact (NPZ, CSV or Parquet) as a pandas DataFrame; pandas and numpy are
imported only when it is called."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def read_release(path: Path, metadata: Mapping[str, Any] | None = None) -> Any:
    """A release artifact file as a DataFrame, its format told by its first bytes (NPZ is a
    zip, Parquet starts ``PAR1``, else CSV), so a file named anything reads.

    A release of a table uploaded with declared columns comes back as that table: the
    declared columns in order, integer columns as pandas ``Int64``, categorical ones as
    pandas categoricals over the declared categories, missing entries as missing; an NPZ
    (which holds the encoded features) is decoded to the same table. Other releases have the
    dataset's feature names as columns. Then the label column (the class, for mechanisms with
    exact labels) or ``<label>=<class>`` columns (class proportions, or signed values).

    ``df.attrs["dprelease"]`` holds the release's metadata: NPZ and Parquet files carry it; for
    a CSV pass ``metadata`` (the release's ``metadata.json`` artifact; ``Client.to_pandas``
    fetches it), which also overrides what a file carries."""
    import pandas as pd

    with Path(path).open("rb") as fh:
        magic = fh.read(4)
    if magic == b"PAR1":
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        stored = (table.schema.metadata or {}).get(b"dprelease")
        meta = dict(metadata) if metadata is not None else json.loads(stored) if stored else {}
        return _typed(table.to_pandas(), meta)
    if magic[:2] != b"PK":
        meta = dict(metadata or {})
        frame = pd.read_csv(
            path,
            dtype=dict.fromkeys(_text_columns(meta), str),
            keep_default_na=False,
            na_values=[""],
        )
        return _typed(frame, meta)
    return _npz_frame(path, metadata)


def _layout(meta: Mapping[str, Any]) -> Mapping[str, Any]:
    layout = meta.get("layout")
    return layout if isinstance(layout, Mapping) else {}


def _table_columns(meta: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    columns = _layout(meta).get("table_columns")
    return list(columns) if isinstance(columns, list) else []


def _text_columns(meta: Mapping[str, Any]) -> list[str]:
    """Columns whose values are names, read from CSV as text (a category "001" stays so)."""
    names = [c["name"] for c in _table_columns(meta) if c.get("type") == "categorical"]
    layout = _layout(meta)
    if layout.get("label_kind") == "exact" and isinstance(layout.get("label_column"), str):
        names.append(layout["label_column"])
    return names


def _typed(frame: Any, meta: Mapping[str, Any]) -> Any:
    """The table's declared types on a frame read from a file, alike for every format:
    numbers as float64, integers as ``Int64``, categories as categoricals over the declared
    set (matched by their text)."""
    import pandas as pd

    for column in _table_columns(meta):
        name = column["name"]
        if name not in frame.columns:
            continue
        if column.get("type") == "integer":
            frame[name] = pd.to_numeric(frame[name]).astype("Int64")
        elif column.get("type") == "numeric":
            frame[name] = pd.to_numeric(frame[name]).astype("float64")
        elif column.get("type") == "categorical":
            declared = list(column.get("categories") or ())
            by_text: dict[str | None, Any] = {str(c): c for c in declared}
            values = [by_text.get(_text(v)) for v in frame[name].tolist()]
            frame[name] = pd.Categorical(values, categories=declared)
    layout = _layout(meta)
    label, classes = layout.get("label_column"), list(meta.get("classes") or ())
    if layout.get("label_kind") == "exact" and label in frame.columns and classes:
        # The class as declared (read from CSV as text, so "001" stays a name).
        by_class: dict[str | None, Any] = {str(c): c for c in classes}
        frame[label] = [by_class.get(_text(v), v) for v in frame[label].tolist()]
    frame.attrs["dprelease"] = dict(meta)
    return frame


def _text(value: Any) -> str | None:
    """A cell's text as categories are matched (a whole float, what a reader makes of an
    integer column with gaps, as the integer); None for a missing cell."""
    if value is None or (isinstance(value, float) and value != value):
        return None
    if isinstance(value, float) and value == int(value):
        return str(int(value))
    return str(value)


def _npz_frame(path: Path, metadata: Mapping[str, Any] | None) -> Any:
    import numpy as np
    import pandas as pd

    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    stored = json.loads(str(arrays["metadata"])) if "metadata" in arrays else {}
    meta = dict(metadata) if metadata is not None else stored
    X = np.asarray(arrays["X"]).reshape(len(arrays["X"]), -1)
    Y = np.asarray(arrays["y"]).reshape(len(arrays["y"]), -1)
    classes = meta.get("classes") or []
    layout = _layout(meta)
    if len(layout.get("feature_columns", ())) == X.shape[1]:
        declared = meta.get("declared_columns")
        if _table_columns(meta) and isinstance(declared, list):
            frame = _decoded(X, declared)
        else:
            frame = pd.DataFrame(X, columns=list(layout["feature_columns"]))
        if layout.get("label_kind") == "exact" and len(classes) == Y.shape[1]:
            # The NPZ holds one-hot rows: the class at each row's 1.
            frame[layout["label_column"]] = pd.Series(
                [classes[i] for i in Y.argmax(axis=1)], index=frame.index
            )
        else:
            for j, name in enumerate(layout["label_columns"]):
                frame[name] = Y[:, j]
        return _typed(frame, meta)
    # A release made before layouts: x_<feature>, y_<class> as its tables had them.
    names = meta.get("feature_names") or []
    x_cols = [f"x_{n}" for n in names] if len(names) == X.shape[1] else None
    y_cols = [f"y_{c}" for c in classes] if len(classes) == Y.shape[1] else None
    x_cols = x_cols or [f"x_{i}" for i in range(X.shape[1])]
    y_cols = y_cols or [f"y_{j}" for j in range(Y.shape[1])]
    frame = pd.DataFrame(np.hstack([X, Y]), columns=[*x_cols, *y_cols])
    frame.attrs["dprelease"] = meta
    return frame


def _decoded(X: Any, declared: list[Mapping[str, Any]]) -> Any:
    """An NPZ's encoded features as the declared table, by the rules its metadata's
    ``table_meaning`` states (the server's ``dpcore.table``; this package imports nothing of
    the server): a block's 1 is its category, an indicator of 1 a missing entry."""
    import numpy as np
    import pandas as pd

    frame = pd.DataFrame(index=range(len(X)))
    j = 0
    for column in declared:
        categorical = column["type"] != "numeric"
        width = len(column["categories"]) if categorical else 1
        block = X[:, j : j + width]
        j += width
        missing = np.zeros(len(X), dtype=bool)
        if (column.get("missing") or {}).get("policy") == "indicator":
            missing = X[:, j] >= 0.5
            j += 1
        if categorical:
            missing = missing | ~(block > 0).any(axis=1)
            cats = np.asarray(column["categories"], dtype=object)
            values: Any = cats[block.argmax(axis=1)]
        else:
            values = block[:, 0].astype(np.float64)
            if column.get("integer"):
                values = np.rint(values)
        series = pd.Series(values, dtype=object if categorical else np.float64)
        frame[column["name"]] = series.where(~missing, None if categorical else np.nan)
    return frame
