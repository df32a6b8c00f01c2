"""Turn an uploaded CSV, Parquet or NPZ file into a clipped feature matrix and label indices.

Pure functions of the upload and its metadata: no I/O, no framework. Every problem with the
upload raises ``InvalidInput`` with a message that says what to fix.

Positions in messages: CSV/Parquet rows are counted from 1 over data rows (the header is not a
row); NPZ positions are numpy's 0-based indices, written ``X[i]`` and ``y[i]``.
"""

from __future__ import annotations

import io
import math
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from dpcore.categorical import DeclaredValueError, fill_missing, one_hot_column
from service.datasets.schemas import (
    CategoricalColumn,
    DatasetMetadata,
    MissingIndicator,
    NumericColumn,
    Range,
    feature_names_of,
)
from service.errors import DatasetTooLarge, InvalidInput

SUPPORTED_FORMATS = ("csv", "parquet", "npz")
# Class names, not text: also keeps sorting the labels cheap.
MAX_LABEL_CHARS = 200
_EXTENSIONS = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet", ".npz": "npz"}
# CSV rows counted per chunk while checking the caps: a chunk's frame is the most the check
# holds at once.
CSV_CHUNK_ROWS = 65_536

Label = int | str
Where = Callable[[int], str]  # 0-based position -> "in row 4" / "at y[3]"


@dataclass(frozen=True, eq=False)  # eq=False: comparing ndarray fields has no single truth value
class ParsedDataset:
    X: np.ndarray  # float64 (n, d), already clipped into [lo, hi]
    feature_shape: tuple[int, ...]
    feature_names: list[str]
    labels: np.ndarray  # int64 (n,), index into `classes`
    classes: list[Label]
    classes_declared: bool
    lo: np.ndarray  # float64 (d,)
    hi: np.ndarray  # float64 (d,)
    clipped_values: int
    # The feature indices of each declared categorical column's one-hot
    # block, in declaration order (empty without `columns`): a release decodes them.
    categorical_blocks: tuple[tuple[int, ...], ...] = ()

    @property
    def n_rows(self) -> int:
        return int(self.X.shape[0])

    @property
    def n_features(self) -> int:
        return int(self.X.shape[1])


def detect_format(filename: str) -> str:
    fmt = _EXTENSIONS.get(PurePath(filename).suffix.lower())
    if fmt is None:
        raise InvalidInput(
            f"cannot tell the format of {filename!r} from its extension; supported formats: "
            f"{', '.join(SUPPORTED_FORMATS)} (file names ending in {', '.join(_EXTENSIONS)})"
        )
    return fmt


@dataclass(frozen=True)
class Limits:
    """What one upload may take. ``max_cells`` bounds the values (rows x
    columns) and ``max_decoded_bytes`` what decoding them may allocate; both are checked from
    the file's metadata (Parquet footer, .npy headers) or while a CSV is read in chunks, before
    the whole file is decoded. ``None`` (the worker re-reading a stored, admitted file): no
    cap but the file's size."""

    max_bytes: int
    max_cells: int | None = None
    max_decoded_bytes: int | None = None

    def check(self, *, cells: int, decoded_bytes: int, what: str, so_far: bool = False) -> None:
        """``what`` introduces the count ("file holds 3 rows x 2 columns ="); ``so_far``: the
        figures are of the part read so far (CSV)."""
        if self.max_cells is not None and cells > self.max_cells:
            raise DatasetTooLarge(
                f"{what} {cells} values; the limit is {self.max_cells} values "
                "(DPRELEASE_MAX_UPLOAD_CELLS)",
                detail={"cells": cells, "limit_cells": self.max_cells},
            )
        if self.max_decoded_bytes is not None and decoded_bytes > self.max_decoded_bytes:
            least = "at least " if so_far else ""
            raise DatasetTooLarge(
                f"the file's values take {least}{decoded_bytes} bytes once decoded; the limit "
                f"is {self.max_decoded_bytes} bytes (DPRELEASE_MAX_UPLOAD_DECODED_BYTES)",
                detail={
                    "decoded_bytes": decoded_bytes,
                    "limit_decoded_bytes": self.max_decoded_bytes,
                },
            )


def parse_dataset(
    *,
    content: bytes,
    filename: str,
    metadata: DatasetMetadata,
    max_bytes: int,
    max_cells: int | None = None,
    max_decoded_bytes: int | None = None,
) -> ParsedDataset:
    """Validate and parse one upload.

    CSV/Parquet: ``metadata.label_column`` names the label column; every other column is a
    feature, in file order. NPZ: arrays ``X`` (n, ...) and ``y`` (n,); features are ``X``
    flattened per record and named "0", "1", ….

    Matching labels to declared ``classes``: Parquet and NPZ compare by value *and* type, so
    the label 3 matches a declared 3 but not a declared "3". CSV has no types: when any
    declared class is a string the label column is read as text (so "001" stays "001"),
    otherwise integer-looking labels are ints; and whenever CSV labels end up as text they are
    compared with ``str()`` of each declared class. Whole-number float labels (1.0) are ints.
    """
    fmt = detect_format(filename)
    limits = Limits(max_bytes, max_cells, max_decoded_bytes)
    if len(content) > max_bytes:
        raise DatasetTooLarge(
            f"file is {len(content)} bytes; the limit is {max_bytes} bytes",
            detail={"size_bytes": len(content), "limit_bytes": max_bytes},
        )
    if not content:
        raise InvalidInput("file is empty")

    declared = metadata.classes
    blocks: tuple[tuple[int, ...], ...] = ()
    bounds: Range | Mapping[str, Range] | None = metadata.feature_range
    columns = metadata.columns
    if fmt == "npz":
        if columns is not None and any(
            isinstance(c, CategoricalColumn) or c.missing is not None for c in columns
        ):
            raise InvalidInput(
                "npz uploads are all-numeric: categorical columns and missing-value policies "
                "need a CSV or Parquet upload"
            )
        X, feature_shape, raw_labels, where = _read_npz(content, limits)
        names = [str(i) for i in range(X.shape[1])]
        as_text = False
        if columns is not None:
            bounds = {c.name: c.bounds for c in columns if isinstance(c, NumericColumn)}
    else:
        read_text = declared is not None and any(isinstance(c, str) for c in declared)
        if columns is not None:
            X, names, raw_labels, where, bounds, blocks = _read_declared(
                content, fmt, metadata.label_column, columns, fmt == "csv" and read_text, limits
            )
        else:
            X, names, raw_labels, where = _read_table(
                content, fmt, metadata.label_column, fmt == "csv" and read_text, limits
            )
        feature_shape = (X.shape[1],)
        as_text = fmt == "csv" and raw_labels.dtype.kind in "OU"
    assert bounds is not None  # the schema asks for feature_range or columns

    labels, classes = _index_labels(raw_labels, declared, where, as_text)
    lo, hi = _bounds(bounds, names)
    # lo < hi (schema-checked), so the two counts never overlap.
    clipped = int(np.count_nonzero(lo > X)) + int(np.count_nonzero(hi < X))
    np.clip(X, lo, hi, out=X)  # X is always a fresh copy, never a view of the upload
    return ParsedDataset(
        X=X,
        feature_shape=feature_shape,
        feature_names=names,
        labels=labels,
        classes=classes,
        classes_declared=declared is not None,
        lo=lo,
        hi=hi,
        clipped_values=clipped,
        categorical_blocks=blocks,
    )


# --- readers ---------------------------------------------------------------------------------


def _unreadable(fmt: str, exc: BaseException) -> InvalidInput:
    lines = str(exc).strip().splitlines()
    reason = lines[0][:200] if lines else type(exc).__name__
    return InvalidInput(f"file could not be read as {fmt}: {reason}")


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
            _check_csv_header(content)
            rows = _check_csv_size(content, dtype, limits, options)
            # Within the caps: read once more in one piece, so that each column's type is
            # inferred from all of it (chunks may infer differently), and no further.
            df = pd.read_csv(io.BytesIO(content), dtype=dtype, nrows=rows, **options)
        else:
            parquet_file = pq.ParquetFile(io.BytesIO(content))
            fields = parquet_file.schema_arrow.names
            if len(set(fields)) != len(fields):
                dup = next(f for f in fields if fields.count(f) > 1)
                raise InvalidInput(f"column name {dup!r} appears more than once")
            _check_parquet_size(parquet_file, limits)
            # Text stays dictionary-encoded (pandas categoricals): a value stored once and
            # referenced by every row must not be copied into every row.
            text = [f.name for f in parquet_file.schema_arrow if _is_text(f.type)]
            df = pq.read_table(io.BytesIO(content), read_dictionary=text).to_pandas()
    except (InvalidInput, MemoryError):
        raise
    except Exception as exc:  # whatever a parser raises on bad bytes is the file's fault
        raise _unreadable(fmt, exc) from exc

    columns = [str(c) for c in df.columns]
    if label not in columns:
        raise InvalidInput(
            f"label column {label!r} is not in the file; its columns are {_some(columns)}"
        )
    if len(df) == 0:
        raise InvalidInput("file has no rows")
    df.columns = pd.Index(columns)
    names = [c for c in columns if c != label]
    if not names:
        raise InvalidInput(f"file has no feature columns besides the label column {label!r}")
    return df, names


def _read_table(
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

    return X, names, _table_labels(df[label], label), _row_position


# --- declared columns ------------------------------------------------------------------------


def _read_declared(
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
    _refuse_mismatch(
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
    return X, names, _table_labels(df[label], label), _row_position, bounds, tuple(blocks)


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


def _check_csv_size(
    content: bytes,
    dtype: dict[str, type[str]] | None,
    limits: Limits,
    options: Mapping[str, Any] | None = None,
) -> int | None:
    """Count a CSV's rows in chunks, stopping at the first chunk that takes the file past a
    cap: a CSV has no metadata, and a file of short numbers decodes to far more bytes than it
    holds. Returns the rows to read (None: no cap to check, read everything)."""
    if limits.max_cells is None and limits.max_decoded_bytes is None:
        return None
    rows = cells = decoded = 0
    with pd.read_csv(
        io.BytesIO(content), dtype=dtype, chunksize=CSV_CHUNK_ROWS, **(options or {})
    ) as chunks:
        for chunk in chunks:
            rows += len(chunk)
            cells += chunk.size
            decoded += int(chunk.memory_usage(index=False, deep=True).sum())
            limits.check(
                cells=cells,
                decoded_bytes=decoded,
                what=f"file holds at least {rows} rows x {chunk.shape[1]} columns =",
                so_far=True,
            )
    return rows


def _parquet_decoded_bytes(parquet_file: pq.ParquetFile, rows: int) -> int:
    """What decoding the columns takes in Arrow, from the schema and the footer: fixed-width
    values take their width per row; text (kept dictionary-encoded) an index per row plus its
    dictionary, which is at most the column's uncompressed pages; anything else at least 8
    bytes per row plus its uncompressed pages."""
    meta = parquet_file.metadata
    groups = [meta.row_group(i) for i in range(meta.num_row_groups)]
    total = 0
    for j, field in enumerate(parquet_file.schema_arrow):
        pages = sum(g.column(j).total_uncompressed_size for g in groups if j < g.num_columns)
        validity = (rows + 7) // 8
        if _is_text(field.type):
            total += rows * 4 + pages + validity
        elif pa.types.is_boolean(field.type):
            total += validity * 2
        else:
            try:
                width = max(1, field.type.bit_width // 8)
            except ValueError:  # not fixed-width (nested, decimal, …)
                total += rows * 8 + pages + validity
                continue
            total += rows * width + validity
    return total


def _check_parquet_size(parquet_file: pq.ParquetFile, limits: Limits) -> None:
    """Parquet compresses well (40 M rows of zeros fit in a few hundred KB), so bound what
    decoding may allocate from the footer before doing it."""
    meta = parquet_file.metadata
    groups = [meta.row_group(i) for i in range(meta.num_row_groups)]
    rows = max(meta.num_rows, sum(g.num_rows for g in groups))
    columns = max([meta.num_columns, *(g.num_columns for g in groups)])
    cells = rows * columns
    what = f"file holds {rows} rows x {columns} columns ="
    if limits.max_cells is None and cells > limits.max_bytes:
        # The worker's re-read of an admitted file: no more values than bytes allowed.
        raise DatasetTooLarge(
            f"{what} {cells} values; the limit is {limits.max_bytes} values",
            detail={"cells": cells, "limit_cells": limits.max_bytes},
        )
    limits.check(cells=cells, decoded_bytes=_parquet_decoded_bytes(parquet_file, rows), what=what)
    # No more decompressed pages than the file-size limit either.
    pages = sum(g.column(j).total_uncompressed_size for g in groups for j in range(g.num_columns))
    if pages > limits.max_bytes:
        raise DatasetTooLarge(
            f"file takes {pages} bytes uncompressed; the limit is {limits.max_bytes} bytes",
            detail={"uncompressed_bytes": pages, "limit_bytes": limits.max_bytes},
        )


def _is_text(kind: pa.DataType) -> bool:
    return bool(
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
    )


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
            f"column {name!r} holds non-numeric values (first bad row {i + 1}: {_short(v)})"
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
        return _whole(column.to_numpy(), _row_position)
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
                f"{_short(v)}); labels must be integers or strings"
            )
        if len(v) > MAX_LABEL_CHARS:
            raise InvalidInput(_long_label(len(v), _row_position(row_of(k))))


def _long_label(length: int, where: str) -> str:
    return f"label {where} has {length} characters; labels have at most {MAX_LABEL_CHARS}"


def _read_npz(
    content: bytes, limits: Limits
) -> tuple[np.ndarray, tuple[int, ...], np.ndarray, Where]:
    if not zipfile.is_zipfile(io.BytesIO(content)):
        reason = (
            "it is a single .npy array; save X and y together with numpy.savez(f, X=..., y=...)"
            if content.startswith(b"\x93NUMPY")
            else "it is not a zip archive"
        )
        raise InvalidInput(f"file could not be read as npz: {reason}")
    try:
        with np.load(io.BytesIO(content), allow_pickle=False) as npz:
            missing = [k for k in ("X", "y") if k not in npz.files]
            if missing:
                raise InvalidInput(
                    f"npz file has no array named {' or '.join(map(repr, missing))}; it needs "
                    f"'X' (features) and 'y' (labels) and holds {_some(npz.files)}"
                )
            members = set(npz.zip.namelist())
            infos = {
                k: npz.zip.getinfo(f"{k}.npy" if f"{k}.npy" in members else k) for k in ("X", "y")
            }
            size = sum(info.file_size for info in infos.values())
            # Compression must not let an upload expand past what an uncompressed one may hold
            # (the sizes the zip's central directory declares; reading never exceeds them).
            if size > limits.max_bytes:
                raise DatasetTooLarge(
                    f"arrays X and y take {size} bytes uncompressed; the limit is "
                    f"{limits.max_bytes} bytes",
                    detail={"uncompressed_bytes": size, "limit_bytes": limits.max_bytes},
                )
            headers = {key: _check_npy_header(npz.zip, info, key) for key, info in infos.items()}
            # From the headers, before numpy allocates anything: X's values (which become a
            # float64 matrix, 8 bytes each whatever their dtype) and y's labels.
            cells = sum(math.prod(shape) for shape, _ in headers.values())
            declared = sum(math.prod(shape) * dtype.itemsize for shape, dtype in headers.values())
            (x_shape, _), (y_shape, _) = headers["X"], headers["y"]
            limits.check(
                cells=cells,
                decoded_bytes=declared,
                what=f"arrays X {tuple(x_shape)} and y {tuple(y_shape)} hold",
            )
            X, y = npz["X"], npz["y"]
    except (InvalidInput, MemoryError):
        raise
    except Exception as exc:  # whatever numpy/zipfile raise on bad bytes is the file's fault
        raise _unreadable("npz", exc) from exc

    for key, arr in (("X", X), ("y", y)):
        if not isinstance(arr, np.ndarray):
            raise InvalidInput(f"file could not be read as npz: member {key!r} is not a .npy array")
    if X.dtype.kind == "b":
        raise InvalidInput("X holds booleans; store them as 0/1 integers")
    if X.dtype.kind not in "iuf":
        raise InvalidInput(f"X must hold integers or floats, not {X.dtype}")
    if X.ndim < 2:
        raise InvalidInput(
            f"X must have shape (n, features...) with one row per record; got shape {X.shape}"
        )
    if y.ndim != 1:
        raise InvalidInput(f"y must be 1-D with one label per row of X; got shape {y.shape}")
    n = X.shape[0]
    if n != y.shape[0]:
        raise InvalidInput(f"X has {n} rows but y has {y.shape[0]} labels")
    if n == 0:
        raise InvalidInput("file has no rows (X and y are empty)")
    feature_shape = tuple(int(s) for s in X.shape[1:])
    if math.prod(feature_shape) == 0:
        raise InvalidInput(f"X has no features: shape {X.shape}")

    features = X.reshape(n, -1).astype(np.float64)  # a copy: clipping may write to it
    if X.dtype.kind == "f":
        bad = ~np.isfinite(features)
        if bad.any():
            i, j = divmod(int(np.argmax(bad)), features.shape[1])
            raise InvalidInput(f"X[{i}] holds NaN or infinity (flat feature index {j})")

    if y.dtype.kind in "iu":
        labels = y.astype(np.int64)
    elif y.dtype.kind == "f":
        labels = _whole(y, _y_position)
    elif y.dtype.kind == "U":
        lengths = np.char.str_len(y)
        if lengths.size and lengths.max() > MAX_LABEL_CHARS:
            i = int(np.argmax(lengths > MAX_LABEL_CHARS))
            raise InvalidInput(_long_label(int(lengths[i]), _y_position(i)))
        labels = y
    else:
        raise InvalidInput(f"y must hold integers or strings (numpy 'U' dtype), not {y.dtype}")
    return features, feature_shape, labels, _y_position


def _check_npy_header(
    archive: zipfile.ZipFile, info: zipfile.ZipInfo, key: str
) -> tuple[tuple[int, ...], np.dtype[Any]]:
    """numpy allocates what a member's header declares before reading its data: a file of a
    few hundred bytes may declare terabytes. The data must fit in the member's stored size
    (which the zip reader never exceeds, and which is within the limit)."""
    with archive.open(info) as member:
        try:
            version = np.lib.format.read_magic(member)
            if version == (1, 0):
                shape, _, dtype = np.lib.format.read_array_header_1_0(member)
            elif version == (2, 0):
                shape, _, dtype = np.lib.format.read_array_header_2_0(member)
            else:
                raise ValueError(f"npy format version {version} is not supported")
        except ValueError as exc:
            raise InvalidInput(f"file could not be read as npz: array {key!r}: {exc}") from exc
        header_bytes = member.tell()
    if dtype.hasobject:
        raise InvalidInput(
            f"file could not be read as npz: array {key!r} holds Python objects, which would "
            "need unpickling (refused, as with allow_pickle=False)"
        )
    needed = math.prod(shape) * dtype.itemsize
    if header_bytes + needed > info.file_size:
        raise InvalidInput(
            f"file could not be read as npz: array {key!r} declares shape {shape} of {dtype} "
            f"({needed} bytes) but holds {info.file_size - header_bytes} bytes"
        )
    return tuple(shape), dtype


def _y_position(i: int) -> str:
    return f"at y[{i}]"


def _row_position(i: int) -> str:
    return f"in row {i + 1}"


# --- labels and bounds -----------------------------------------------------------------------


def _whole(values: np.ndarray, where: Where) -> np.ndarray:
    """Float labels as int64, provided every one is a whole number."""
    with np.errstate(over="ignore"):  # 2**63 is inf in float16: still a fair comparison
        bad = ~np.isfinite(values) | (np.abs(values) >= 2.0**63)
    bad[~bad] = values[~bad] != np.round(values[~bad])
    if bad.any():
        i = int(np.argmax(bad))
        raise InvalidInput(
            f"label {values[i].item()!r} {where(i)} is not a whole number; "
            "labels must be integers or strings"
        )
    return values.astype(np.int64)


def _index_labels(
    raw: np.ndarray, declared: Sequence[Label] | None, where: Where, as_text: bool
) -> tuple[np.ndarray, list[Label]]:
    uniques, inverse = np.unique(raw, return_inverse=True)
    present: list[Label] = uniques.tolist()  # numpy scalars -> Python int / str
    if declared is None:
        if len(present) < 2:
            raise InvalidInput(
                f"found only one class ({present[0]!r}) among the labels; declare `classes` "
                "to list every class, including those absent from this file"
            )
        return inverse.reshape(-1).astype(np.int64), present

    position = {str(c) if as_text else c: k for k, c in enumerate(declared)}
    lookup = np.array([position.get(u, -1) for u in present], dtype=np.int64)
    labels = lookup[inverse.reshape(-1)]
    unknown = labels < 0
    if unknown.any():
        i = int(np.argmax(unknown))
        label = raw[i].item() if isinstance(raw[i], np.generic) else raw[i]
        hint = ""
        if not as_text and not any(type(c) is type(label) for c in declared):
            kinds = "strings" if isinstance(label, str) else "integers"
            hint = f" (labels in this file are {kinds}; 3 and '3' are different classes)"
        raise InvalidInput(
            f"label {label!r} {where(i)} is not among the declared classes "
            f"{_some(list(declared))}{hint}"
        )
    return labels, list(declared)


def _bounds(
    feature_range: Range | Mapping[str, Range], names: list[str]
) -> tuple[np.ndarray, np.ndarray]:
    if not isinstance(feature_range, Mapping):
        lo, hi = feature_range
        return np.full(len(names), lo, dtype=np.float64), np.full(len(names), hi, dtype=np.float64)
    known = set(names)
    missing = [n for n in names if n not in feature_range]
    unknown = [k for k in feature_range if k not in known]
    _refuse_mismatch(
        "feature_range must give [lo, hi] for every feature and nothing else",
        (f"no range for {len(missing)} feature(s)", missing),
        (f"{len(unknown)} name(s) that are not features", unknown),
    )
    pairs = np.array([feature_range[n] for n in names], dtype=np.float64)
    return pairs[:, 0].copy(), pairs[:, 1].copy()


def _refuse_mismatch(rule: str, *parts: tuple[str, Sequence[Any]]) -> None:
    """422 stating ``rule`` and each non-empty list of names that breaks it."""
    problems = [f"{what}: {_some(names)}" for what, names in parts if names]
    if problems:
        raise InvalidInput(f"{rule}; " + "; ".join(problems))


def _some(items: Sequence[Any], limit: int = 10) -> str:
    shown = ", ".join(repr(x) for x in items[:limit])
    more = f", … ({len(items)} in all)" if len(items) > limit else ""
    return f"[{shown}{more}]"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
