"""NPZ uploads: arrays ``X`` (n, ...) and ``y`` (n,), their sizes checked from the zip's
directory and the .npy headers before numpy allocates them.

The content is any buffer (``bytes``, or a worker's memory map of the stored file) and is
never copied whole: the zip is read through ``ViewReader``, and an uncompressed ``X`` entry
(``numpy.savez``'s) is converted to float64 straight from the buffer, its CRC checked there
(``_stored_array``; measured in docs/results/implementation.md)."""

from __future__ import annotations

import contextlib
import io
import math
import struct
import zipfile
import zlib
from typing import Any, NamedTuple

import numpy as np

from dpcore.preprocessing import float64_rows
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


class ViewReader(io.RawIOBase):
    """A read-only, seekable binary file over a buffer that never copies more than a read
    asks for (``io.BytesIO`` copies any buffer but ``bytes`` whole)."""

    def __init__(self, content: bytes | memoryview) -> None:
        super().__init__()
        self._view = memoryview(content).cast("B")
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        # As io.BytesIO: a negative position is an error only when asked for as such.
        if whence == io.SEEK_SET:
            if offset < 0:
                raise ValueError(f"negative seek value {offset}")
            self._pos = offset
        else:
            base = self._pos if whence == io.SEEK_CUR else len(self._view)
            self._pos = max(0, base + offset)
        return self._pos

    def read(self, size: int | None = -1) -> bytes:
        end = len(self._view) if size is None or size < 0 else self._pos + size
        data = bytes(self._view[self._pos : end])
        self._pos += len(data)
        return data

    def readall(self) -> bytes:
        return self.read()

    def readinto(self, buffer: Any) -> int:
        target = memoryview(buffer).cast("B")
        data = self._view[self._pos : self._pos + len(target)]
        target[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def close(self) -> None:
        with contextlib.suppress(BufferError):  # this reader's own view; the buffer is the caller's
            self._view.release()
        super().close()


def read_npz(
    content: bytes | memoryview, limits: Limits
) -> tuple[np.ndarray, tuple[int, ...], np.ndarray, Where, np.dtype[Any]]:
    """The features (a float64 copy, rows × flat features), the record shape, the labels, a
    label locator, and the type X was stored in (``dpcore.preprocessing.type_within``: an
    integer type the bounds contain needs no clipping)."""
    view = memoryview(content).cast("B")
    if not zipfile.is_zipfile(ViewReader(view)):
        reason = (
            "it is a single .npy array; save X and y together with numpy.savez(f, X=..., y=...)"
            if view[:6] == b"\x93NUMPY"
            else "it is not a zip archive"
        )
        raise InvalidInput(f"file could not be read as npz: {reason}")
    try:
        with ViewReader(view) as reader, np.load(reader, allow_pickle=False) as npz:
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
            cells = sum(math.prod(h.shape) for h in headers.values())
            declared = sum(math.prod(h.shape) * h.dtype.itemsize for h in headers.values())
            x_shape, y_shape = headers["X"].shape, headers["y"].shape
            limits.check_features(math.prod(x_shape[1:]), f"array X {tuple(x_shape)} holds")
            limits.check(
                cells=cells,
                decoded_bytes=declared,
                what=f"arrays X {tuple(x_shape)} and y {tuple(y_shape)} hold",
            )
            X = _stored_array(view, infos["X"], headers["X"])
            if X is None:
                X = npz["X"]
            y = npz["y"]
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

    features = float64_rows(X)  # a copy: clipping may write to it
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
    return features, feature_shape, labels, y_position, X.dtype


# A zip member's local header (APPNOTE.TXT 4.3.7), as zipfile reads it: the signature, then
# fixed fields, the name's and the extra field's lengths last; the member's data follows them.
_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")
_LOCAL_MAGIC = b"PK\x03\x04"
_NAME_LENGTH, _EXTRA_LENGTH = 10, 11


class _Header(NamedTuple):
    shape: tuple[int, ...]
    fortran: bool
    dtype: np.dtype[Any]
    size: int  # bytes of the .npy header, before the data


def _stored_array(view: memoryview, info: zipfile.ZipInfo, header: _Header) -> np.ndarray | None:
    """The array of an uncompressed, unencrypted member, as a read-only view of ``view`` (no
    copy: the caller converts it), once the member's CRC-32 matches as zipfile would check
    it; None for any other member (read through numpy instead)."""
    if (
        info.compress_type != zipfile.ZIP_STORED
        or info.flag_bits & 0x1  # encrypted
        or info.compress_size != info.file_size
        or header.dtype.kind not in "iuf"
    ):
        return None
    local = info.header_offset
    fields = _LOCAL_HEADER.unpack(view[local : local + _LOCAL_HEADER.size])
    if fields[0] != _LOCAL_MAGIC:
        raise zipfile.BadZipFile("Bad magic number for file header")
    start = local + _LOCAL_HEADER.size + fields[_NAME_LENGTH] + fields[_EXTRA_LENGTH]
    if start + info.file_size > len(view):
        raise zipfile.BadZipFile(f"member {info.filename!r} runs past the end of the file")
    if zlib.crc32(view[start : start + info.file_size]) != info.CRC:
        raise zipfile.BadZipFile(f"Bad CRC-32 for file {info.filename!r}")
    count = math.prod(header.shape)
    if count == 0:
        return np.empty(header.shape, dtype=header.dtype)
    flat = np.frombuffer(view, dtype=header.dtype, count=count, offset=start + header.size)
    if header.fortran:
        return flat.reshape(header.shape[::-1]).transpose()
    return flat.reshape(header.shape)


def _check_npy_header(archive: zipfile.ZipFile, info: zipfile.ZipInfo, key: str) -> _Header:
    """numpy allocates what a member's header declares before reading its data: a file of a
    few hundred bytes may declare terabytes. The data must fit in the member's stored size
    (which the zip reader never exceeds, and which is within the limit)."""
    with archive.open(info) as member:
        try:
            version = np.lib.format.read_magic(member)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(member)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(member)
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
    return _Header(tuple(shape), bool(fortran), dtype, header_bytes)
