"""IDX files (the MNIST distribution format) to NPZ, for uploading with ``dprelease upload``."""

from __future__ import annotations

import gzip
import io
import struct
from pathlib import Path

import numpy as np

_UBYTE = 0x08


def read_idx(path: str | Path) -> np.ndarray:
    """One IDX file of unsigned bytes (gzipped or not) as an array of its declared shape.

    IDX header: two zero bytes, a type byte (0x08 = uint8), a byte with the number of
    dimensions, then each dimension as a big-endian uint32.
    """
    raw = Path(path).read_bytes()
    data = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    if len(data) < 4:
        raise ValueError(f"{path}: too short for an IDX file")
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != _UBYTE:
        raise ValueError(f"{path}: not an unsigned-byte IDX file (header {data[:4].hex()})")
    shape = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    offset = 4 + 4 * ndim
    if len(data) - offset != int(np.prod(shape)):
        raise ValueError(f"{path}: header declares {shape} but the file holds other sizes")
    return np.frombuffer(data, dtype=np.uint8, offset=offset).reshape(shape).copy()


def idx_to_npz(images: str | Path, labels: str | Path) -> bytes:
    X, y = read_idx(images), read_idx(labels)
    if X.shape[0] != y.shape[0] or y.ndim != 1:
        raise ValueError(f"images hold {X.shape[0]} records but labels have shape {y.shape}")
    buffer = io.BytesIO()
    np.savez(buffer, X=X, y=y)
    return buffer.getvalue()
