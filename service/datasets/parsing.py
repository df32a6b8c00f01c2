"""Turn an uploaded CSV, Parquet or NPZ file into a clipped feature matrix and label indices.

Pure functions of the upload and its metadata: no I/O, no framework. Every problem with the
upload raises ``InvalidInput`` with a message that says what to fix.

Positions in messages: CSV/Parquet rows are counted from 1 over data rows (the header is not a
row); NPZ positions are numpy's 0-based indices, written ``X[i]`` and ``y[i]``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import PurePath
from typing import Any

import numpy as np

from dpcore.domain import MissingIndicator, integer_features, missing_indicators
from dpcore.preprocessing import type_within
from service.datasets.parse_labels import Label, feature_bounds, index_labels
from service.datasets.parse_limits import Limits
from service.datasets.parse_npz import read_npz
from service.datasets.parse_tables import read_declared, read_table, whole_numbers
from service.datasets.schemas import (
    CategoricalColumn,
    DatasetMetadata,
    NumericColumn,
    Range,
)
from service.errors import DatasetTooLarge, InvalidInput

__all__ = [
    "SUPPORTED_FORMATS",
    "Label",
    "ParsedDataset",
    "UploadLimits",
    "detect_format",
    "parse_dataset",
]

SUPPORTED_FORMATS = ("csv", "parquet", "npz")
# Values clipped (and compared with the bounds) at a time.
CLIP_CELLS = 1 << 22
_EXTENSIONS = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet", ".npz": "npz"}


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
    # Each declared missing-value indicator feature, with its column's features and fill: a
    # release maps indicators to 0/1 and fills (``dpcore.domain``).
    missing_indicators: tuple[MissingIndicator, ...] = ()
    # The features of the columns declared integer: a release rounds them.
    integer_features: tuple[int, ...] = ()

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
class UploadLimits(Limits):
    """The caps an upload is parsed under (``parse_dataset``'s ``max_*``), stored with the
    dataset so that a job re-reads the file under the caps it was accepted under."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def stored(cls, value: Mapping[str, Any] | None, fallback: UploadLimits) -> UploadLimits:
        """The stored caps, or ``fallback`` (the server's current ones) for an upload older
        than the stored caps."""
        if not value:
            return fallback
        return cls(
            int(value["max_bytes"]),
            value.get("max_cells"),
            value.get("max_decoded_bytes"),
            value.get("max_features"),
        )

    def parse(
        self, *, content: bytes | memoryview, filename: str, metadata: DatasetMetadata
    ) -> ParsedDataset:
        return parse_dataset(
            content=content,
            filename=filename,
            metadata=metadata,
            # A stored file was within the byte cap when admitted; never refuse it for its size.
            max_bytes=max(self.max_bytes, len(content)),
            max_cells=self.max_cells,
            max_decoded_bytes=self.max_decoded_bytes,
            max_features=self.max_features,
        )


def parse_dataset(
    *,
    content: bytes | memoryview,
    filename: str,
    metadata: DatasetMetadata,
    max_bytes: int,
    max_cells: int | None = None,
    max_decoded_bytes: int | None = None,
    max_features: int | None = None,
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

    ``content`` is any buffer of bytes (a worker passes a memory map of the stored file): an
    NPZ is read from it in place; CSV and Parquet from one ``bytes`` copy of it.
    """
    fmt = detect_format(filename)
    limits = Limits(max_bytes, max_cells, max_decoded_bytes, max_features)
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
    # Categorical or missing-value columns: encoded features (one-hot blocks, indicators).
    encoded = columns is not None and any(
        isinstance(c, CategoricalColumn) or c.missing is not None for c in columns
    )
    stored = None  # the type the values were stored in, where the file has one
    if fmt == "npz":
        if encoded:
            raise InvalidInput(
                "npz uploads are all-numeric: categorical columns and missing-value policies "
                "need a CSV or Parquet upload"
            )
        X, feature_shape, raw_labels, where, stored = read_npz(content, limits)
        names = [str(i) for i in range(X.shape[1])]
        as_text = False
        if columns is not None:
            bounds = {c.name: c.bounds for c in columns if isinstance(c, NumericColumn)}
            for column in columns:
                if isinstance(column, NumericColumn) and column.integer and column.name in names:
                    j = names.index(column.name)
                    whole_numbers(X[:, j], np.zeros(len(X), dtype=bool), column.name)
    else:
        read_text = declared is not None and any(isinstance(c, str) for c in declared)
        data = content if isinstance(content, bytes) else bytes(content)
        if columns is not None:
            X, names, raw_labels, where, bounds, blocks = read_declared(
                data, fmt, metadata.label_column, columns, fmt == "csv" and read_text, limits
            )
        else:
            X, names, raw_labels, where = read_table(
                data, fmt, metadata.label_column, fmt == "csv" and read_text, limits
            )
        feature_shape = (X.shape[1],)
        as_text = fmt == "csv" and raw_labels.dtype.kind in "OU"
    assert bounds is not None  # the schema asks for feature_range or columns
    if metadata.feature_shape is not None:
        feature_shape = declared_shape(tuple(metadata.feature_shape), feature_shape, encoded)

    labels, classes = index_labels(raw_labels, declared, where, as_text)
    lo, hi = feature_bounds(bounds, names)
    # Values of an integer type the bounds contain cannot lie outside them (bytes in [0, 255]).
    within = stored is not None and type_within(stored, lo, hi)
    clipped = 0 if within else _clip(X, lo, hi)  # X is a fresh copy, never a view of the upload
    declared_dicts = None if columns is None else [c.model_dump(mode="json") for c in columns]
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
        missing_indicators=() if declared_dicts is None else missing_indicators(declared_dicts),
        integer_features=() if declared_dicts is None else integer_features(declared_dicts, names),
    )


def _clip(X: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> int:
    """Clip ``X`` into [lo, hi] in place and count the values that moved, a block of rows at
    a time: comparisons of the whole matrix would allocate n x d booleans twice, as much as
    an uploaded uint8 image set itself."""
    rows = max(1, CLIP_CELLS // max(1, X.shape[1]))
    clipped = 0
    for start in range(0, X.shape[0], rows):
        block = X[start : start + rows]
        # lo < hi (schema-checked), so the two counts never overlap.
        clipped += int(np.count_nonzero(lo > block)) + int(np.count_nonzero(hi < block))
        np.clip(block, lo, hi, out=block)
    return clipped


def declared_shape(
    declared: tuple[int, ...], found: tuple[int, ...], encoded: bool
) -> tuple[int, ...]:
    """The owner's ``feature_shape`` for records read as ``found``: it must hold the same
    features (``math.prod``), an NPZ array's own record shape must agree with it, and encoded
    categorical or missing-value columns have no image shape."""
    if math.prod(declared) != math.prod(found):
        raise InvalidInput(
            f"feature_shape {list(declared)} holds {math.prod(declared)} features; the file has "
            f"{math.prod(found)}"
        )
    if len(found) > 1 and declared != found:
        raise InvalidInput(
            f"feature_shape {list(declared)} disagrees with the NPZ array's record shape "
            f"{list(found)}: leave it out or upload flat rows"
        )
    if encoded and len(declared) > 1:
        raise InvalidInput(
            "feature_shape: a table with categorical or missing-value columns has no image "
            "shape (its encoded features are not pixels)"
        )
    return declared
