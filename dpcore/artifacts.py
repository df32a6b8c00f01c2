"""Writing a release to a file, chunk by chunk: NPZ, CSV or Parquet, each carrying the same
columns and metadata. Memory stays bounded by one chunk whatever the number of rows: an NPZ's
feature array is streamed into its zip entry as the rows come (no second copy on disk), the
smaller label array filled through a memory map and zipped from disk at the end; CSV and
Parquet are written in record batches. The columns are the release's ``Layout``
(``dpcore.release_layout``): the declared table's columns (CSV, Parquet) or the dataset's own
feature names, then its label column in the form the mechanism's label kind gives.

While a file is written, its writer says after each chunk which of its bytes are final
(``on_settled(end, held, False)``: bytes [0, end) are on disk and never change again, except
the range ``held``), and once it is closed that the whole file is (``on_settled(size, (0, 0),
True)``), so that it can be stored as it grows (``service.file_upload``). Per
format: CSV and Parquet are written by Arrow through an output stream, which can only append
(no seek: a Parquet footer comes last, after the row groups), so every byte on disk is final;
an NPZ is a zip whose entries' local headers are patched when an entry ends (zipfile seeks
back to write its size and CRC), so the header of ``X.npy``, at the very start, is held
until the file is closed; the entries after it are written at the end, by ``close``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from dpcore.release_layout import Layout
from dpcore.table import decode

# How a table column's values are typed (``TableColumn.value_type``): numbers as the float32
# the rows are drawn in (a CSV then writes 3.1, not 3.0999999046325684).
_ARROW = {"float": pa.float32(), "int": pa.int64(), "text": pa.string()}
# An NPZ's arrays: little-endian float32 whatever the machine.
_NPZ_DTYPE = "<f4"


class ArtifactWriter:
    """``with ArtifactWriter(...) as w: w.write(X_chunk, Y_chunk)`` then the file is complete."""

    def __init__(
        self,
        fmt: str,
        path: Path,
        *,
        rows: int,
        layout: Layout,
        metadata: dict[str, Any],
        extra: dict[str, np.ndarray] | None = None,
        on_settled: Callable[[int, tuple[int, int], bool], None] | None = None,
    ) -> None:
        if fmt not in ("npz", "csv", "parquet"):
            raise ValueError(f"unknown release format {fmt!r}")
        self.fmt, self.path, self.rows = fmt, path, rows
        # The layout travels in every format's metadata (CSV: the metadata.json beside it).
        self.meta_json = json.dumps({**metadata, "layout": layout.describe()}, sort_keys=True)
        self.extra = extra or {}
        self.layout = layout
        width, classes = len(layout.features), len(layout.classes)
        self.written = 0
        self._on_settled = on_settled
        self.held = (0, 0)  # the bytes the writer may still rewrite (module docstring)
        self._scratch = tempfile.TemporaryDirectory(dir=path.parent, prefix=".npz-")
        if fmt == "npz":
            scratch = Path(self._scratch.name)
            # Uncompressed (noise does not compress), so an entry's bytes are the array's.
            self._zip = zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True)
            self._x = self._zip.open("X.npy", "w", force_zip64=True)
            # Its local header, just written, is rewritten with the sizes and CRC when the
            # entry closes (the same length: zip64 is forced).
            assert self._zip.fp is not None
            self.held = (0, self._zip.fp.tell())
            header: dict[str, Any] = {
                "descr": np.lib.format.dtype_to_descr(np.dtype(_NPZ_DTYPE)),
                "fortran_order": False,
                "shape": (rows, width),
            }
            np.lib.format.write_array_header_1_0(self._x, header)
            self._y = np.lib.format.open_memmap(
                scratch / "y.npy", mode="w+", dtype=np.float32, shape=(rows, classes)
            )
        else:
            if layout.table:
                fields = [pa.field(c.name, _ARROW[c.value_type]) for c in layout.table]
            else:
                fields = [pa.field(n, pa.float32()) for n in layout.features]
            if layout.kind == "exact":
                # The class itself: integers stay integers, any other class set is text.
                kind = pa.int64() if layout.integer_classes else pa.string()
                fields.append(pa.field(layout.label, kind))
            else:
                fields.extend(pa.field(n, pa.float32()) for n in layout.label_columns)
            schema = pa.schema(fields, metadata={"dprelease": self.meta_json})
            self._schema = schema
            if fmt == "parquet":
                self._table_writer: Any = pq.ParquetWriter(str(path), schema)
            else:
                self._table_writer = pacsv.CSVWriter(str(path), schema.remove_metadata())

    def write(self, X: np.ndarray, Y: np.ndarray) -> None:
        """``X`` rows × features, ``Y`` the label vectors as the mechanism drew them (rows ×
        classes): the layout turns them into the file's label values."""
        count = X.shape[0]
        if self.written + count > self.rows:
            raise ValueError("more rows than announced")
        if X.shape[1] != len(self.layout.features) or Y.shape[1] != len(self.layout.classes):
            raise ValueError(
                f"rows of {X.shape[1]} features and {Y.shape[1]} label values; the layout has "
                f"{len(self.layout.features)} and {len(self.layout.classes)}"
            )
        labels = self.layout.labels(Y)
        if self.fmt == "npz":
            self._x.write(np.ascontiguousarray(X, dtype=_NPZ_DTYPE).data)
            self._y[self.written : self.written + count] = labels
        else:
            schema = self._schema.remove_metadata()
            if self.layout.table:
                columns = [
                    pa.array(values, type=schema.field(i).type, mask=missing)
                    for i, (values, missing) in enumerate(decode(X, self.layout.table))
                ]
            else:
                columns = [pa.array(X[:, i], type=pa.float32()) for i in range(X.shape[1])]
            if self.layout.kind == "exact":
                values = self.layout.class_values(labels)
                columns.append(pa.array(values, type=schema.field(len(columns)).type))
            else:
                columns.extend(
                    pa.array(labels[:, j], type=pa.float32()) for j in range(labels.shape[1])
                )
            batch = pa.record_batch(columns, schema=schema)
            self._table_writer.write_batch(batch)
        self.written += count
        if self._on_settled is not None:
            self._on_settled(os.stat(self.path).st_size, self.held, False)

    def close(self) -> None:
        try:
            self._finish()
        except BaseException:
            self._abandon()
            raise

    def _finish(self) -> None:
        if self.written != self.rows:
            raise ValueError(f"wrote {self.written} rows, announced {self.rows}")
        if self.fmt == "npz":
            self._x.close()
            self._y.flush()
            scratch = Path(self._scratch.name)
            np.save(scratch / "metadata.npy", np.array(self.meta_json))
            for name, array in self.extra.items():
                np.save(scratch / f"{name}.npy", array)
            for name in ["y", "metadata", *self.extra]:
                self._zip.write(scratch / f"{name}.npy", arcname=f"{name}.npy")
            self._zip.close()
            del self._y
        else:
            self._table_writer.close()
        self._scratch.cleanup()
        if self._on_settled is not None:
            self._on_settled(os.stat(self.path).st_size, (0, 0), True)

    def __enter__(self) -> ArtifactWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self._abandon()

    def _abandon(self) -> None:
        if self.fmt == "npz":
            # A file cut short is not left where a complete one is expected.
            with contextlib.suppress(Exception):
                self._x.close()
            with contextlib.suppress(Exception):
                self._zip.close()
            self.path.unlink(missing_ok=True)
        self._scratch.cleanup()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
