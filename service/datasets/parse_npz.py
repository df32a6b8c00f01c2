"""NPZ uploads: arrays ``X`` (n, ...) and ``y`` (n,), their sizes checked from the zip's
directory and the .npy headers before numpy allocates them."""

from __future__ import annotations

import io
import math
import zipfile
from typing import Any

import numpy as np

from service.datasets.parse_labels import (
    MAX_LABEL_CHARS,
    Where,
    long_label,
    some,
    unreadable,
    whole,
    y_position,
)
from service.datasets.parse_limits import Limits
from service.errors import DatasetTooLarge, InvalidInput


def read_npz(
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
                    f"'X' (features) and 'y' (labels) and holds {some(npz.files)}"
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
            limits.check_features(math.prod(x_shape[1:]), f"array X {tuple(x_shape)} holds")
            limits.check(
                cells=cells,
                decoded_bytes=declared,
                what=f"arrays X {tuple(x_shape)} and y {tuple(y_shape)} hold",
            )
            X, y = npz["X"], npz["y"]
    except (InvalidInput, MemoryError):
        raise
    except Exception as exc:  # whatever numpy/zipfile raise on bad bytes is the file's fault
        raise unreadable("npz", exc) from exc

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
        labels = whole(y, y_position)
    elif y.dtype.kind == "U":
        lengths = np.char.str_len(y)
        if lengths.size and lengths.max() > MAX_LABEL_CHARS:
            i = int(np.argmax(lengths > MAX_LABEL_CHARS))
            raise InvalidInput(long_label(int(lengths[i]), y_position(i)))
        labels = y
    else:
        raise InvalidInput(f"y must hold integers or strings (numpy 'U' dtype), not {y.dtype}")
    return features, feature_shape, labels, y_position


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
            # numpy's text quotes the header's bytes: the service's own words instead.
            raise InvalidInput(
                f"file could not be read as npz: array {key!r} has a damaged .npy header or "
                "one of a version this server does not read"
            ) from exc
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
