"""Writing a release to a file, chunk by chunk: NPZ, CSV or Parquet, each carrying the same
columns and metadata. Memory stays bounded by one chunk whatever the number of rows: NPZ
arrays are filled through memory maps and zipped from disk; CSV and Parquet are written in
record batches."""

from __future__ import annotations

import hashlib
import json
import tempfile
import zipfile
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq


def column_names(feature_names: list[str], classes: list[Any]) -> tuple[list[str], list[str]]:
    return [f"x_{name}" for name in feature_names], [f"y_{c}" for c in classes]


class ArtifactWriter:
    """``with ArtifactWriter(...) as w: w.write(X_chunk, Y_chunk)`` then the file is complete."""

    def __init__(
        self,
        fmt: str,
        path: Path,
        *,
        rows: int,
        feature_names: list[str],
        classes: list[Any],
        metadata: dict[str, Any],
        extra: dict[str, np.ndarray] | None = None,
    ) -> None:
        if fmt not in ("npz", "csv", "parquet"):
            raise ValueError(f"unknown release format {fmt!r}")
        self.fmt, self.path, self.rows = fmt, path, rows
        self.meta_json = json.dumps(metadata, sort_keys=True)
        self.extra = extra or {}
        self.x_names, self.y_names = column_names(feature_names, classes)
        self.written = 0
        self._scratch = tempfile.TemporaryDirectory(dir=path.parent, prefix=".npz-")
        if fmt == "npz":
            scratch = Path(self._scratch.name)
            self._x = np.lib.format.open_memmap(
                scratch / "X.npy", mode="w+", dtype=np.float32, shape=(rows, len(self.x_names))
            )
            self._y = np.lib.format.open_memmap(
                scratch / "y.npy", mode="w+", dtype=np.float32, shape=(rows, len(self.y_names))
            )
        else:
            fields = [pa.field(n, pa.float32()) for n in self.x_names + self.y_names]
            schema = pa.schema(fields, metadata={"dprelease": self.meta_json})
            self._schema = schema
            if fmt == "parquet":
                self._table_writer: Any = pq.ParquetWriter(str(path), schema)
            else:
                self._table_writer = pacsv.CSVWriter(str(path), schema.remove_metadata())

    def write(self, X: np.ndarray, Y: np.ndarray) -> None:
        count = X.shape[0]
        if self.written + count > self.rows:
            raise ValueError("more rows than announced")
        if self.fmt == "npz":
            self._x[self.written : self.written + count] = X
            self._y[self.written : self.written + count] = Y
        else:
            columns = [X[:, i] for i in range(X.shape[1])] + [Y[:, j] for j in range(Y.shape[1])]
            batch = pa.record_batch(
                [pa.array(c, type=pa.float32()) for c in columns],
                schema=self._schema.remove_metadata(),
            )
            self._table_writer.write_batch(batch)
        self.written += count

    def close(self) -> None:
        if self.written != self.rows:
            raise ValueError(f"wrote {self.written} rows, announced {self.rows}")
        if self.fmt == "npz":
            self._x.flush()
            self._y.flush()
            scratch = Path(self._scratch.name)
            np.save(scratch / "metadata.npy", np.array(self.meta_json))
            for name, array in self.extra.items():
                np.save(scratch / f"{name}.npy", array)
            # An NPZ is a zip of .npy files: zip them from disk, uncompressed (noise does not
            # compress), so nothing is held in memory.
            with zipfile.ZipFile(self.path, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
                for name in ["X", "y", "metadata", *self.extra]:
                    zf.write(scratch / f"{name}.npy", arcname=f"{name}.npy")
            del self._x, self._y
        else:
            self._table_writer.close()
        self._scratch.cleanup()

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
            self._scratch.cleanup()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
