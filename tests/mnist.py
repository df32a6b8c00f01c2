"""Read the MNIST test split (IDX files) shipped under /work/shared for tests on real data."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np

MNIST_DIR = Path("/work/shared/datasets/mnist-t10k")
IMAGES = MNIST_DIR / "t10k-images-idx3-ubyte.gz"
LABELS = MNIST_DIR / "t10k-labels-idx1-ubyte.gz"

_UBYTE = 0x08


def read_idx(path: str | Path) -> np.ndarray:
    """One gzipped IDX file of unsigned bytes as an array of the shape its header declares.

    IDX header: two zero bytes, a type byte (0x08 = uint8), a byte with the number of
    dimensions, then each dimension as a big-endian uint32 (images: 2051 = n, rows, cols;
    labels: 2049 = n).
    """
    with gzip.open(path, "rb") as fh:
        data = fh.read()
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != _UBYTE:
        raise ValueError(f"{path}: not an unsigned-byte IDX file (header {data[:4].hex()})")
    shape = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape).copy()


def load_mnist_t10k() -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 (10000, 28, 28), labels uint8 (10000,))."""
    return read_idx(IMAGES), read_idx(LABELS)


def available() -> bool:
    return IMAGES.is_file() and LABELS.is_file()
