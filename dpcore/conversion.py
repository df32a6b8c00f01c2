"""One release, every format: a release file (NPZ, CSV or Parquet) rewritten in another
format, chunk by chunk.

The rows are read back as the writer took them (encoded features X, label matrix Y: a
declared table re-encoded as its upload was, ``categorical.encode_declared``) and written
again by ``ArtifactWriter`` with the same layout and metadata, so a converted file holds what
a release made in that format would: the same rows, the same columns, the metadata inside
(NPZ, Parquet) or beside it (CSV: the caller serves ``metadata.json``). It reads the released
file and its public metadata only: post-processing, no privacy cost. Memory is bounded by a
chunk of rows (an NPZ release is stored uncompressed: its arrays are read in place)."""

from __future__ import annotations

import json
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from dpcore import release_layout
from dpcore.artifacts import ArtifactWriter
from dpcore.evaluation.release import detect_format
from dpcore.release_layout import Layout, table_rows, text_columns

FORMATS = ("csv", "parquet", "npz")
#: Rows per chunk read and written.
CHUNK_ROWS = 16_384


class ConversionError(ValueError):
    """A stored release file that does not read as its metadata says."""


def embedded_metadata(path: Path) -> dict[str, Any] | None:
    """The metadata an NPZ or Parquet release file carries (None for a CSV file)."""
    fmt = detect_format(path)
    if fmt == "npz":
        with zipfile.ZipFile(path) as archive, archive.open("metadata.npy") as member:
            return dict(json.loads(str(np.lib.format.read_array(member))))
    if fmt == "parquet":
        import pyarrow.parquet as pq

        stored = pq.read_schema(path).metadata or {}
        return dict(json.loads(stored[b"dprelease"])) if b"dprelease" in stored else None
    return None


def _csv_options(layout: Layout, block_bytes: int | None = None) -> dict[str, Any]:
    import pyarrow as pa
    import pyarrow.csv as pacsv

    types = {name: pa.string() for name in text_columns(layout)}
    read = pacsv.ReadOptions(block_size=block_bytes) if block_bytes else pacsv.ReadOptions()
    return {
        "read_options": read,
        "convert_options": pacsv.ConvertOptions(column_types=types, strings_can_be_null=True),
    }


def count_rows(path: Path, fmt: str, layout: Layout) -> int:
    if fmt == "npz":
        with zipfile.ZipFile(path) as archive, archive.open("X.npy") as member:
            return _header(member)[0][0]
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return int(pq.ParquetFile(path).metadata.num_rows)
    import pyarrow.csv as pacsv

    rows = 0
    for batch in pacsv.open_csv(path, **_csv_options(layout, 1 << 22)):
        rows += batch.num_rows
    return rows


def read_chunks(
    path: Path, fmt: str, metadata: Mapping[str, Any], rows: int | None = None
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The release's (X, Y) chunk by chunk (``rows`` each, ``CHUNK_ROWS`` by default; a CSV
    by blocks of bytes), as ``ArtifactWriter.write`` took them."""
    rows = rows or CHUNK_ROWS
    layout = release_layout.read_layout(metadata)
    if layout is None:
        raise ConversionError("a release made before layouts cannot be converted")
    if fmt == "npz":
        yield from _npz_chunks(path, rows)
        return
    if fmt == "parquet":
        import pyarrow.parquet as pq

        batches: Any = pq.ParquetFile(path).iter_batches(batch_size=rows)
    else:
        import pyarrow.csv as pacsv

        batches = pacsv.open_csv(path, **_csv_options(layout, 1 << 22))
    import pyarrow as pa

    for batch in batches:
        yield table_rows(pa.Table.from_batches([batch]), layout, metadata)


def _npz_chunks(path: Path, rows: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    with zipfile.ZipFile(path) as archive:
        x_member, y_member = archive.open("X.npy"), archive.open("y.npy")
        with x_member, y_member:
            x_shape, x_dtype = _header(x_member)
            y_shape, y_dtype = _header(y_member)
            n = x_shape[0]
            if y_shape[0] != n:
                raise ConversionError("the NPZ's X and y hold different numbers of rows")
            width, classes = int(np.prod(x_shape[1:])), int(np.prod(y_shape[1:]))
            for start in range(0, n, rows):
                count = min(rows, n - start)
                X = _read_rows(x_member, count, width, x_dtype)
                Y = _read_rows(y_member, count, classes, y_dtype)
                yield X, Y


def _header(member: Any) -> tuple[tuple[int, ...], np.dtype[Any]]:
    version = np.lib.format.read_magic(member)
    read = (
        np.lib.format.read_array_header_1_0
        if version == (1, 0)
        else np.lib.format.read_array_header_2_0
    )
    shape, fortran, dtype = read(member)
    if fortran:
        raise ConversionError("the NPZ's arrays are not in row order")
    return tuple(shape), np.dtype(dtype)


def _read_rows(member: Any, count: int, width: int, dtype: np.dtype[Any]) -> np.ndarray:
    size = count * width * dtype.itemsize
    raw = member.read(size)
    if len(raw) != size:
        raise ConversionError("the NPZ's arrays are truncated")
    return np.frombuffer(raw, dtype=dtype).reshape(count, width)


def convert(
    source: Path,
    target: Path,
    fmt: str,
    metadata: Mapping[str, Any],
    *,
    arrays: Mapping[str, np.ndarray] | None = None,
    array_names: Mapping[str, str] | None = None,
) -> None:
    """Write the release at ``source`` (its ``metadata``: embedded or its ``metadata.json``)
    to ``target`` in ``fmt``. ``arrays``: the mechanism's public arrays, which an NPZ holds
    inside (a table format's travel beside it, under ``array_names``)."""
    if fmt not in FORMATS:
        raise ConversionError(f"unknown release format {fmt!r}; known: {list(FORMATS)}")
    source_fmt = detect_format(source)
    layout = release_layout.read_layout(metadata)
    if layout is None:
        raise ConversionError("a release made before layouts cannot be converted")
    rows = count_rows(source, source_fmt, layout)
    meta = {k: v for k, v in metadata.items() if k != "layout"}
    if "arrays" in meta:
        # Where each public array travels in the new format.
        meta["arrays"] = {
            name: f"{name}.npy inside this NPZ"
            if fmt == "npz"
            else (array_names or {}).get(name, f"{name}.npy")
            for name in meta["arrays"]
        }
    extra = dict(arrays or {}) if fmt == "npz" else None
    with ArtifactWriter(fmt, target, rows=rows, layout=layout, metadata=meta, extra=extra) as out:
        for X, Y in read_chunks(source, source_fmt, metadata):
            out.write(X, Y)
