"""A disk copy of a release's drawn rows, for post-processing that reads them twice (fit,
then transform)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np


class RowsCopy:
    """A disk copy of the drawn rows (float32 memory maps), read back in chunks."""

    CHUNK = 8192

    def __init__(self, where: Path, rows: int, *, enabled: bool) -> None:
        self.enabled, self.rows, self.written = enabled, rows, 0
        self._dir = tempfile.TemporaryDirectory(dir=where, prefix=".post-") if enabled else None
        self._x: np.ndarray | None = None
        self._y: np.ndarray | None = None

    def write(self, X: np.ndarray, Y: np.ndarray) -> None:
        assert self._dir is not None
        if self._x is None or self._y is None:
            base = Path(self._dir.name)
            self._x = np.lib.format.open_memmap(
                base / "X.npy", mode="w+", dtype=np.float32, shape=(self.rows, X.shape[1])
            )
            self._y = np.lib.format.open_memmap(
                base / "y.npy", mode="w+", dtype=np.float32, shape=(self.rows, Y.shape[1])
            )
        self._x[self.written : self.written + len(X)] = X
        self._y[self.written : self.written + len(Y)] = Y
        self.written += len(X)

    def chunks(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        assert self._x is not None and self._y is not None
        for start in range(0, self.written, self.CHUNK):
            stop = start + self.CHUNK
            yield np.asarray(self._x[start:stop]), np.asarray(self._y[start:stop])

    def __enter__(self) -> RowsCopy:
        return self

    def __exit__(self, *exc: object) -> None:
        self._x = self._y = None
        if self._dir is not None:
            self._dir.cleanup()
