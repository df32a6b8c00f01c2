"""Fuzzing the upload parsers: whatever the bytes, the outcome is a dataset that keeps every
promise (finite, clipped, labelled) or an InvalidInput (422); never another exception, and
never memory out of proportion to the upload limit (bombs are run under an address-space
limit in a subprocess, so an over-allocation fails the test instead of the machine)."""

from __future__ import annotations

import io
import json
import struct
import subprocess
import sys
import textwrap
import tracemalloc
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from service.datasets.parsing import ParsedDataset, parse_dataset
from service.datasets.schemas import DatasetMetadata
from service.errors import InvalidInput

LIMIT = 1_000_000
FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # fuzzing (hypothesis) and memory bombs in subprocesses


def meta(**fields: Any) -> DatasetMetadata:
    return DatasetMetadata.model_validate(
        {"name": "d", "feature_range": [-5, 5], "budget": {"epsilon": 1, "delta": 1e-5}, **fields}
    )


@pytest.fixture(autouse=True, scope="module")
def _trace_memory() -> Iterator[None]:
    # Started once: stopping tracemalloc while pyarrow's threads free numpy buffers crashes
    # CPython 3.11 (a segfault in the interpreter, not in the code under test).
    tracemalloc.start()
    yield
    tracemalloc.stop()


def outcome(content: bytes, filename: str, **fields: Any) -> ParsedDataset | InvalidInput:
    """Parse, or the InvalidInput; any other exception fails the test. Python-side memory
    (numpy and pandas included) must stay within a fixed multiple of the upload."""
    tracemalloc.reset_peak()
    before = tracemalloc.get_traced_memory()[0]
    try:
        result: ParsedDataset | InvalidInput = parse_dataset(
            content=content, filename=filename, metadata=meta(**fields), max_bytes=LIMIT
        )
    except InvalidInput as exc:
        result = exc
    peak = tracemalloc.get_traced_memory()[1] - before
    assert peak <= 64 * len(content) + 16 * 2**20, f"{peak} bytes for a {len(content)}-byte file"
    if isinstance(result, ParsedDataset):
        assert np.isfinite(result.X).all()
        assert (result.lo <= result.X).all() and (result.hi >= result.X).all()
        assert result.labels.shape == (result.n_rows,) and result.n_rows > 0
        assert result.labels.min() >= 0 and result.labels.max() < len(result.classes)
    return result


def npz_bytes(**arrays: Any) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def parquet_bytes(table: pa.Table) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


_rng = np.random.default_rng(0)
_X, _y = _rng.uniform(-3, 3, size=(12, 3)), np.arange(12) % 3
_FRAME = pd.DataFrame(_X, columns=["a", "b", "c"]).assign(y=_y)
VALID = {
    "d.npz": npz_bytes(X=_X, y=_y),
    "d.csv": _FRAME.to_csv(index=False).encode(),
    "d.parquet": parquet_bytes(pa.Table.from_pandas(_FRAME, preserve_index=False)),
}
TABLE_META = {"label_column": "y"}


def _fields(filename: str) -> dict[str, Any]:
    return {} if filename.endswith(".npz") else dict(TABLE_META)


@FUZZ
@given(content=st.binary(max_size=3000), filename=st.sampled_from(sorted(VALID)))
def test_random_bytes(content: bytes, filename: str) -> None:
    outcome(content, filename, **_fields(filename))


@st.composite
def mutated(draw: st.DrawFn) -> tuple[str, bytes]:
    filename = draw(st.sampled_from(sorted(VALID)))
    data = bytearray(VALID[filename])
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["truncate", "flip", "insert", "delete"]))
        at = draw(st.integers(0, max(0, len(data) - 1)))
        if kind == "truncate":
            del data[at:]
        elif kind == "flip" and data:
            data[at] ^= draw(st.integers(1, 255))
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        else:
            del data[at : at + draw(st.integers(1, 16))]
    return filename, bytes(data)


@FUZZ
@given(case=mutated())
def test_truncated_and_mutated_valid_files(case: tuple[str, bytes]) -> None:
    filename, content = case
    outcome(content, filename, **_fields(filename))


_any_dtype = st.one_of(
    hnp.boolean_dtypes(),
    hnp.integer_dtypes(),
    hnp.unsigned_integer_dtypes(),
    hnp.floating_dtypes(),
    hnp.complex_number_dtypes(),
    hnp.datetime64_dtypes(),
    hnp.unicode_string_dtypes(max_len=4),
    hnp.byte_string_dtypes(max_len=4),
)


@FUZZ
@given(
    X=hnp.arrays(_any_dtype, hnp.array_shapes(min_dims=0, max_dims=3, max_side=6)),
    y=hnp.arrays(_any_dtype, hnp.array_shapes(min_dims=0, max_dims=2, max_side=6)),
)
def test_npz_of_any_dtype_and_shape(X: np.ndarray, y: np.ndarray) -> None:
    """Wrong dtypes, NaN and infinities, mismatched or empty shapes."""
    outcome(npz_bytes(X=X, y=y), "d.npz")


def _npy(shape: tuple[int, ...], dtype: str, payload: bytes) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buffer, {"descr": dtype, "fortran_order": False, "shape": shape}
    )
    return buffer.getvalue() + payload


def _zip(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


@FUZZ
@given(
    shape=st.lists(st.integers(0, 2**31), min_size=1, max_size=3).map(tuple),
    dtype=st.sampled_from(["<f8", "<i8", "|u1", "<U64", "|V4096", "<c16"]),
    payload=st.binary(max_size=256),
)
def test_npz_headers_declaring_any_shape(
    shape: tuple[int, ...], dtype: str, payload: bytes
) -> None:
    """A header may declare terabytes in a file of a few hundred bytes: refused before numpy
    allocates what it declares (the memory bound in ``outcome`` checks it)."""
    content = _zip({"X.npy": _npy(shape, dtype, payload), "y.npy": _npy((2,), "<i8", b"\0" * 16)})
    outcome(content, "d.npz")


_cell = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(-(2**70), 2**70).map(str),
    st.sampled_from(
        ["", "nan", "NaN", "inf", "-inf", "True", "false", "1e999", "0x10", '"', "2024-01-01"]
    ),
    st.text(max_size=6),
)


@FUZZ
@given(
    rows=st.lists(st.lists(_cell, min_size=3, max_size=3), min_size=1, max_size=8),
    labels=st.lists(
        st.one_of(st.integers(0, 3).map(str), st.text(max_size=3)), min_size=8, max_size=8
    ),
)
def test_csv_cells_of_any_kind(rows: list[list[str]], labels: list[str]) -> None:
    lines = ["a,b,c,y"] + [",".join([*row, labels[i]]) for i, row in enumerate(rows)]
    outcome("\n".join(lines).encode(), "d.csv", **TABLE_META)


_arrow_columns = st.sampled_from(
    [
        pa.array([1.5, float("nan"), 2.0, -1.0]),
        pa.array([1.0, float("inf"), 0.0, 2.0]),
        pa.array([1, 2, None, 4]),
        pa.array([True, False, True, False]),
        pa.array(["1", "2.5", "x", "3"]),
        pa.array(["1", "2", "3", "4"]).dictionary_encode(),
        pa.array([b"1", b"2", b"3", b"4"]),
        pa.array([[1.0], [2.0], [], [3.0]]),
        pa.array(pd.to_datetime(["2024-01-01"] * 4)),
        pa.array([{"a": 1}] * 4),
        pa.array([None] * 4, pa.null()),
    ]
)


@FUZZ
@given(features=st.lists(_arrow_columns, min_size=1, max_size=3), label=_arrow_columns)
def test_parquet_columns_of_any_type(features: list[pa.Array], label: pa.Array) -> None:
    names = [f"f{i}" for i in range(len(features))]
    table = pa.table(dict(zip([*names, "y"], [*features, label], strict=True)))
    outcome(parquet_bytes(table), "d.parquet", **TABLE_META)


# --- bombs, under an address-space limit --------------------------------------------------------

_BOMBS = r"""
import io, json, resource, struct, sys, zipfile
resource.setrlimit(resource.RLIMIT_AS, (1024 * 2**20,) * 2)
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
from service.datasets.parsing import parse_dataset
from service.datasets.schemas import DatasetMetadata
from service.errors import InvalidInput

LIMIT = 100 * 2**20

def meta(**fields):
    return DatasetMetadata.model_validate(
        {"name": "d", "feature_range": [0, 1], "budget": {"epsilon": 1, "delta": 1e-5}, **fields})

def npy(shape, dtype, payload=b""):
    buf = io.BytesIO()
    header = {"descr": dtype, "fortran_order": False, "shape": shape}
    np.lib.format.write_array_header_1_0(buf, header)
    return buf.getvalue() + payload

def zipped(members, method=zipfile.ZIP_DEFLATED):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", method) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buf.getvalue()

def lying_sizes(content, real, fake):
    # Rewrite every declared uncompressed size of `real` bytes (local and central headers).
    return content.replace(struct.pack("<I", real), struct.pack("<I", fake))

y = npy((4,), "<i8", b"\0" * 32)
deflated_zeros = np.zeros((16_000, 1_000))  # 128 MB that deflates to ~125 kB
buf = io.BytesIO(); np.savez_compressed(buf, X=deflated_zeros, y=np.arange(16_000) % 2)
x_big = npy((4, 4), "<f8", b"\0" * 128)
# One 1 MiB string, referenced by 20000 rows: 20 GiB once copied into every row.
text = pa.DictionaryArray.from_arrays(pa.array([0] * 20_000, pa.int32()), pa.array(["1" * 2**20]))

def parquet(**columns):
    buf = io.BytesIO()
    pq.write_table(pa.table(columns), buf, compression="zstd")
    return buf.getvalue()

huge_x = npy((10**6, 10**4), "<f8")
giant_x = npy((10**12, 10**6), "<f8")

cases = {
    "npz header declaring 75 GiB": ("d.npz", zipped({"X.npy": huge_x, "y.npy": y}), {}),
    "npz header declaring 8 EiB": ("d.npz", zipped({"X.npy": giant_x, "y.npy": y}), {}),
    "npz deflate bomb (128 MB of zeros)": ("d.npz", buf.getvalue(), {}),
    "npz whose zip under-declares its size": (
        "d.npz", lying_sizes(zipped({"X.npy": x_big, "y.npy": y}), len(x_big), 64), {}),
    "parquet: a 1 MiB feature value in 20000 rows": (
        "d.parquet", parquet(f=text, y=pa.array([0, 1] * 10_000)), {"label_column": "y"}),
    "parquet: a 1 MiB label in 20000 rows": (
        "d.parquet", parquet(f=pa.array([0.5] * 20_000), y=text), {"label_column": "y"}),
}
out = {}
for name, (filename, content, fields) in cases.items():
    try:
        parse_dataset(content=content, filename=filename, metadata=meta(**fields), max_bytes=LIMIT)
        out[name] = ["parsed", len(content)]
    except InvalidInput as exc:
        out[name] = ["InvalidInput", len(content), exc.message[:120]]
    except BaseException as exc:
        out[name] = [type(exc).__name__, len(content), str(exc)[:120]]
print(json.dumps(out))
"""


def test_bombs_are_refused_within_one_gib_of_address_space() -> None:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_BOMBS)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    outcomes = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(outcomes) == 6
    for name, (kind, size, *message) in outcomes.items():
        assert kind == "InvalidInput", (name, kind, message)
        assert size < 200_000, name  # each is a small file
    assert "declares shape" in outcomes["npz header declaring 75 GiB"][2]


def test_lying_zip_sizes_helper_really_lies() -> None:
    """The bomb above relies on this rewrite; check it changes what zipfile believes."""
    x = _npy((4, 4), "<f8", b"\0" * 128)
    content = _zip({"X.npy": x, "y.npy": _npy((4,), "<i8", b"\0" * 32)})
    lying = content.replace(struct.pack("<I", len(x)), struct.pack("<I", 64))
    assert zipfile.ZipFile(io.BytesIO(lying)).getinfo("X.npy").file_size == 64
