"""422 texts never quote a library's exception (issue 35, item 5): a malformed upload is
refused in the service's own words, never with pyarrow's, pandas', numpy's, zipfile's or
json's text (which names internals and may quote the file's bytes)."""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import Harness, npz_bytes, toy_dataset

# Words of Python's and the libraries' exception texts, never of the service's own.
LIBRARY_WORDS = ("Error", "Exception", "Traceback", "codec", "magic bytes", "tokenizing")


def _library_text(call: Callable[[], Any]) -> str:
    try:
        call()
    except Exception as exc:
        return str(exc)
    raise AssertionError("the library accepted it")


def _parquet() -> bytes:
    out = io.BytesIO()
    pq.write_table(pa.table({"a": [1.0, 2.0, 3.0], "y": [0, 1, 2]}), out)
    return out.getvalue()


def _bad_npy_header() -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("X.npy", b"\x93NUMPY\x01\x00\x10\x00{'descr': 1, }     \n")
        archive.writestr("y.npy", b"\x93NUMPY\x01\x00\x10\x00{'descr': 1, }     \n")
    return out.getvalue()


RAGGED = b"a,y\n1,0\n1,2,3,4\n"
LATIN1 = "a,y\n\xe9t\xe9,0\n".encode("latin-1")
CASES = {
    "garbage parquet": (
        "data.parquet",
        b"a,y\n1,0\n",
        lambda: pq.ParquetFile(io.BytesIO(b"a,y\n1,0\n")),
    ),
    "truncated parquet": (
        "data.parquet",
        _parquet()[:-30],
        lambda: pq.ParquetFile(io.BytesIO(_parquet()[:-30])),
    ),
    "ragged csv": ("data.csv", RAGGED, lambda: pd.read_csv(io.BytesIO(RAGGED))),
    "latin-1 csv": ("data.csv", LATIN1, lambda: LATIN1.decode("utf-8")),
    "damaged npy header": (
        "data.npz",
        _bad_npy_header(),
        lambda: np.load(io.BytesIO(_bad_npy_header()))["X"],
    ),
    "truncated npz": (
        "data.npz",
        npz_bytes(*toy_dataset())[:-40],
        lambda: np.load(io.BytesIO(npz_bytes(*toy_dataset())[:-40]))["X"],
    ),
}


@pytest.mark.modes("embedded")
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_malformed_upload_is_refused_in_the_services_words(harness: Harness, case: str) -> None:
    filename, content, library = CASES[case]
    owner, _ = harness.new_key("owner")
    meta = {"label_column": "y"} if not filename.endswith(".npz") else {}
    r = harness.upload(owner, content, filename=filename, **meta)
    assert r.status_code == 422, r.text
    message = r.json()["error"]["message"]
    assert message.startswith("file could not be read as"), message
    assert _library_text(library) not in message
    assert not [w for w in LIBRARY_WORDS if w in message], message


@pytest.mark.modes("embedded")
def test_metadata_that_is_not_json_is_refused_in_the_services_words(harness: Harness) -> None:
    owner, _ = harness.new_key("owner")
    raw = '{"name": "toy",, }'
    r = harness.client.post(
        "/datasets",
        files={"file": ("data.npz", npz_bytes(*toy_dataset()))},
        data={"metadata": raw},
        headers=harness.headers(owner),
    )
    assert r.status_code == 422, r.text
    message = r.json()["error"]["message"]
    assert message == "metadata is not valid JSON (line 1, column 16)"
    assert _library_text(lambda: json.loads(raw)) not in message


def test_only_the_services_own_exceptions_are_quoted_by_planning() -> None:
    """Planning quotes a ValueError's text only when the service raised it (its accountants'
    refusals); one raised inside a library gets the service's own words."""
    from dpcore.mechanisms.noise import lattice_plan
    from service.releases.service import raised_by_us

    def caught(call: Callable[[], Any]) -> BaseException:
        try:
            call()
        except ValueError as exc:
            return exc
        raise AssertionError("no ValueError")

    assert raised_by_us(caught(lambda: lattice_plan(sigma=-1.0, sensitivity=1.0, dim=1)))
    assert not raised_by_us(caught(lambda: np.zeros(3).reshape(2)))
