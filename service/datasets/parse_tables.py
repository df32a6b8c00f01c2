"""CSV and Parquet uploads: the table read within the caps, its feature columns as numbers
(or, with declared columns, encoded by the declaration) and its label column checked."""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from dpcore.categorical import DeclaredValueError, fill_missing, one_hot_column
from service.datasets.parse_labels import (
    MAX_LABEL_CHARS,
    Where,
    long_label,
    refuse_mismatch,
    row_position,
    short,
    some,
    unreadable,
    whole,
)
from service.datasets.parse_limits import Limits, check_csv_size, check_parquet_size, is_text
from service.datasets.schemas import (
    CategoricalColumn,
    MissingIndicator,
    NumericColumn,
    Range,
    feature_names_of,
)
from service.errors import InvalidInput


def _check_csv_header(content: bytes) -> None:
    """pandas renames a repeated column name (``a``, ``a.1``): refuse it instead, as Parquet
    uploads are. The header row as written, read with the same dialect."""
    header = pd.read_csv(io.BytesIO(content), header=None, nrows=1, dtype=str)
    names = [str(v) for v in header.iloc[0].tolist() if isinstance(v, str)] if len(header) else []
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise InvalidInput(f"column name {name!r} appears more than once")
        seen.add(name)


def _read_frame(
    content: bytes,
    fmt: str,
    label: str | None,
    limits: Limits,
    dtype: dict[str, type[str]] | None,
    csv_options: Mapping[str, Any] | None = None,
) -> tuple[pd.DataFrame, list[str]]:
    """The table and its feature column names (every column but the label, in file order)."""
    if label is None:
        raise InvalidInput(f"{fmt} uploads need `label_column`: the name of the label column")
    options = dict(csv_options or {})
    try:
        if fmt == "csv":
            # Counted from the header line's separators before pandas reads a cell.
            end = content.find(b"\n")
            first = content if end < 0 else content[:end]
            limits.check_features(first.count(b","), "file's header names about")
            _check_csv_header(content)
            rows = check_csv_size(content, dtype, limits, options)
            # Within the caps: read once more in one piece, so that each column's type is
            # inferred from all of it (chunks may infer differently), and no further.
            df = pd.read_csv(io.BytesIO(content), dtype=dtype, nrows=rows, **options)
        else:
            parquet_file = pq.ParquetFile(io.BytesIO(content))
            fields = parquet_file.schema_arrow.names
            if len(set(fields)) != len(fields):
                dup = next(f for f in fields if fields.count(f) > 1)
                raise InvalidInput(f"column name {dup!r} appears more than once")
            limits.check_features(len(fields) - 1, "file has")
            check_parquet_size(parquet_file, limits)
            # Text stays dictionary-encoded (pandas categoricals): a value stored once and
            # referenced by every row must not be copied into every row.
            text = [f.name for f in parquet_file.schema_arrow if is_text(f.type)]
            df = pq.read_table(io.BytesIO(content), read_dictionary=text).to_pandas()
    except (InvalidInput, MemoryError):
        raise
    except Exception as exc:  # whatever a parser raises on bad bytes is the file's fault
        raise unreadable(fmt, exc) from exc

    columns = [str(c) for c in df.columns]
    if label not in columns:
        raise InvalidInput(
            f"label column {label!r} is not in the file; its columns are {some(columns)}"
        )
    if len(df) == 0:
        raise InvalidInput("file has no rows")
    df.columns = pd.Index(columns)
    names = [c for c in columns if c != label]
    if not names:
        raise InvalidInput(f"file has no feature columns besides the label column {label!r}")
    return df, names


def read_table(
    content: bytes, fmt: str, label: str | None, as_text: bool, limits: Limits
) -> tuple[np.ndarray, list[str], np.ndarray, Where]:
    df, names = _read_frame(
        content, fmt, label, limits, {label: str} if as_text and label else None
    )
    assert label is not None  # _read_frame refuses a table without one

    X = np.empty((len(df), len(names)), dtype=np.float64)
    for j, name in enumerate(names):
        column = df[name]
        X[:, j] = column.to_numpy() if column.dtype.kind in "iuf" else _coerce(column, name)
    finite = np.isfinite(X)
    if not finite.all():
        j = int(np.argmax(~finite.all(axis=0)))
        i = int(np.argmax(~finite[:, j]))
        problem = "is missing a value" if np.isnan(X[i, j]) else "holds an infinite value"
        raise InvalidInput(f"column {names[j]!r} {problem} in row {i + 1}")

    return X, names, _table_labels(df[label], label), row_position


# --- declared columns ------------------------------------------------------------------------


def read_declared(
    content: bytes,
    fmt: str,
    label: str | None,
    columns: Sequence[NumericColumn | CategoricalColumn],
    labels_as_text: bool,
    limits: Limits,
) -> tuple[np.ndarray, list[str], np.ndarray, Where, dict[str, Range], tuple[tuple[int, ...], ...]]:
    """Encode a table by its declared schema: numeric columns as numbers, categorical ones
    one-hot over their declared categories, missing entries by each column's policy. Features
    follow the declaration's order, so the layout is a function of the declaration alone.

    CSV: only an empty cell is missing (so a category may be spelt "NA"), and categorical
    columns are read as text; Parquet: a null is missing."""
    text = [c.name for c in columns if isinstance(c, CategoricalColumn)]
    dtype = {name: str for name in text}
    if labels_as_text and label is not None:
        dtype[label] = str
    csv_options = {"keep_default_na": False, "na_values": [""]}
    df, present = _read_frame(content, fmt, label, limits, dtype or None, csv_options)
    assert label is not None  # _read_frame refuses a table without one
    declared = [c.name for c in columns]
    missing_cols = [n for n in declared if n not in present]
    undeclared = [n for n in present if n not in set(declared)]
    refuse_mismatch(
        "columns must declare every feature column of the file and nothing else",
        ("declared but not in the file", missing_cols),
        ("in the file but not declared", undeclared),
    )

    names = feature_names_of(list(columns))
    n = len(df)
    X = np.empty((n, len(names)), dtype=np.float64)
    bounds: dict[str, Range] = {}
    blocks: list[tuple[int, ...]] = []
    j = 0
    for column in columns:
        if isinstance(column, NumericColumn):
            values, gaps = _numeric_column(df[column.name], column.name)
            if column.integer:
                whole_numbers(values, gaps, column.name)
            X[:, j] = values
            bounds[column.name] = column.bounds
            width = 1
        else:
            onehot, gaps = _categorical_column(df[column.name], column)
            width = len(column.categories)
            X[:, j : j + width] = onehot
            for k in range(width):
                bounds[names[j + k]] = (0.0, 1.0)
            blocks.append(tuple(range(j, j + width)))
        _fill_missing(X[:, j : j + width], gaps, column)
        j += width
        if isinstance(column.missing, MissingIndicator):
            X[:, j] = gaps
            bounds[names[j]] = (0.0, 1.0)
            j += 1
    return X, names, _table_labels(df[label], label), row_position, bounds, tuple(blocks)


def _numeric_column(column: pd.Series, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Values as floats (NaN where missing) and the missing mask; an infinity is refused."""
    values = (
        column.to_numpy(dtype=np.float64) if column.dtype.kind in "iuf" else _coerce(column, name)
    )
    gaps = np.isnan(values)
    infinite = np.isinf(values)
    if infinite.any():
        raise InvalidInput(
            f"column {name!r} holds an infinite value in row {int(np.argmax(infinite)) + 1}"
        )
    return values, gaps


def whole_numbers(values: np.ndarray, gaps: np.ndarray, name: str) -> None:
    """A column declared integer holds whole numbers (gaps aside)."""
    fractional = ~gaps & (values != np.round(values))
    if fractional.any():
        raise InvalidInput(
            f"column {name!r} is declared integer but holds a value that is not a whole number "
            f"in row {int(np.argmax(fractional)) + 1}"
        )


def _categorical_column(
    column: pd.Series, spec: CategoricalColumn
) -> tuple[np.ndarray, np.ndarray]:
    """One-hot over the declared categories and the missing mask (dpcore.categorical, shared
    with evaluation's encoding of held-out rows)."""
    try:
        return one_hot_column(column, spec.name, spec.categories)
    except DeclaredValueError as exc:
        raise InvalidInput(str(exc)) from None


def _fill_missing(
    block: np.ndarray, gaps: np.ndarray, column: NumericColumn | CategoricalColumn
) -> None:
    """Write the declared fill into a column's features (a view of X) where entries are
    missing; a missing entry without a policy is refused (dpcore.categorical.fill_missing)."""
    policy = column.missing.model_dump(mode="json") if column.missing is not None else None
    try:
        if isinstance(column, NumericColumn):
            fill_missing(block, gaps, column.name, policy, bounds=column.bounds)
        else:
            fill_missing(block, gaps, column.name, policy, categories=column.categories)
    except DeclaredValueError as exc:
        raise InvalidInput(str(exc)) from None


# --- cells and labels ------------------------------------------------------------------------


def _number(v: Any, name: str, i: int) -> float:
    """One cell as a float (NaN when missing, reported by the caller); ``i`` is its row."""
    if isinstance(v, bool | np.bool_):
        raise InvalidInput(f"column {name!r} holds booleans (row {i + 1}); encode them as 0/1")
    if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
        return math.nan
    try:
        return float(v)
    except (TypeError, ValueError):
        raise InvalidInput(
            f"column {name!r} holds non-numeric values (first bad row {i + 1}: {short(v)})"
        ) from None


def _coerce(column: pd.Series, name: str) -> np.ndarray:
    """Numbers out of a column pandas did not type as numeric (text, objects, bools, dates)."""
    if column.dtype.kind == "b":
        raise InvalidInput(f"column {name!r} holds booleans; encode them as 0/1")
    if isinstance(column.dtype, pd.CategoricalDtype):
        return _coerce_categorical(column, name)
    values = column.to_numpy(dtype=object)
    out = np.empty(len(values), dtype=np.float64)
    # Stops at the first bad value, so a rejected column costs only up to that row.
    for i, v in enumerate(values):
        out[i] = _number(v, name, i)
    return out


def _coerce_categorical(column: pd.Series, name: str) -> np.ndarray:
    """Each distinct value converted once (a long one, referenced by every row, included)."""
    codes = column.cat.codes.to_numpy()
    categories = column.cat.categories.to_numpy(dtype=object)
    per_value = np.empty(len(categories), dtype=np.float64)
    bad = np.zeros(len(categories), dtype=bool)
    for k, v in enumerate(categories):
        try:
            per_value[k] = _number(v, name, 0)
        except InvalidInput:
            bad[k] = True
    held = codes >= 0
    if bad[codes[held]].any():
        i = int(np.flatnonzero(held)[np.argmax(bad[codes[held]])])
        _number(categories[codes[i]], name, i)  # raises, naming the first bad row
    out = np.full(len(codes), np.nan)
    out[held] = per_value[codes[held]]
    return out


def _table_labels(column: pd.Series, name: str) -> np.ndarray:
    missing = column.isna().to_numpy()
    if missing.any():
        raise InvalidInput(
            f"label column {name!r} is missing a value in row {int(np.argmax(missing)) + 1}"
        )
    kind = column.dtype.kind
    if kind == "b":
        raise InvalidInput(f"label column {name!r} holds booleans; use integers or strings")
    if kind in "iu":
        return column.to_numpy(dtype=np.int64)
    if kind == "f":
        return whole(column.to_numpy(), row_position)
    if isinstance(column.dtype, pd.CategoricalDtype):
        # Dictionary-encoded (Parquet): check each distinct label once, then index by codes,
        # never copying a label into every row.
        categories = column.cat.categories.to_numpy(dtype=object)
        codes = column.cat.codes.to_numpy()
        used = np.unique(codes)  # a dictionary may hold values no row refers to
        _check_text_labels(categories[used], name, lambda j: int(np.argmax(codes == used[j])))
        out: np.ndarray = categories[codes]
        return out
    values = column.to_numpy(dtype=object)
    _check_text_labels(values, name, lambda i: i)
    return values


def _check_text_labels(values: np.ndarray, name: str, row_of: Callable[[int], int]) -> None:
    for k, v in enumerate(values):
        if not isinstance(v, str):
            raise InvalidInput(
                f"label column {name!r} holds {type(v).__name__} values (row {row_of(k) + 1}: "
                f"{short(v)}); labels must be integers or strings"
            )
        if len(v) > MAX_LABEL_CHARS:
            raise InvalidInput(long_label(len(v), row_position(row_of(k))))
