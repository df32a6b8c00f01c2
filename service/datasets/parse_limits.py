"""The caps on one upload (values, decoded bytes, file size), checked from a file's metadata or
while a CSV is counted in chunks, before the whole file is decoded."""

from __future__ import annotations

import io
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from service.errors import DatasetTooLarge

# CSV rows counted per chunk while checking the caps: a chunk's frame is the most the check
# holds at once.
CSV_CHUNK_ROWS = 65_536


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
    max_features: int | None = None

    def check_features(self, features: int, what: str) -> None:
        """A file's feature count, read from its metadata before anything per feature (its
        names, bounds, the noise guide's figures) is built."""
        if self.max_features is not None and features > self.max_features:
            raise DatasetTooLarge(
                f"{what} {features} features; the limit is {self.max_features} features "
                "(DPRELEASE_MAX_UPLOAD_FEATURES)",
                detail={"features": features, "limit_features": self.max_features},
            )

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


def check_csv_size(
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
        if is_text(field.type):
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


def check_parquet_size(parquet_file: pq.ParquetFile, limits: Limits) -> None:
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


def is_text(kind: pa.DataType) -> bool:
    return bool(
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
    )
