"""Bounded uploads (issue 14, item 2a): one upload can no longer stall every tenant.

- a Parquet or NPZ file whose values decompress far past the limits is refused from its
  metadata (the Parquet footer, the .npy headers), before anything is decoded;
- a CSV is counted in chunks and refused as soon as it passes the cell cap;
- parsing runs off the event loop: /health answers while an upload is being parsed;
- at most DPRELEASE_MAX_CONCURRENT_UPLOADS uploads are parsed at once per process; one more is
  answered 503 with Retry-After before its body is read.
"""

from __future__ import annotations

import io
import threading
import zipfile
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from service.datasets import parsing
from tests.conftest import Harness, npz_bytes, toy_dataset
from tests.integration.test_uploads import _dataset_rows, _stored_objects

BOMB_ROWS = 40_000_000  # the finding: 364 KB of zstd Parquet, 40 M rows of zeros
META = {"name": "bomb", "feature_range": [0, 1], "classes": [0, 1], "budget": {"epsilon": 1}}
TABLE_META = {**META, "label_column": "y", "budget": {"epsilon": 1, "delta": 1e-5}}
NPZ_META = {**META, "budget": {"epsilon": 1, "delta": 1e-5}}


@pytest.fixture(scope="module")
def parquet_bomb() -> bytes:
    zeros = pa.array(np.zeros(BOMB_ROWS, dtype=np.int64))
    buffer = io.BytesIO()
    pq.write_table(pa.table({"x": zeros, "y": zeros}), buffer, compression="zstd")
    content = buffer.getvalue()
    assert len(content) < 1_000_000  # a few hundred KB on the wire
    return content


@pytest.fixture(scope="module")
def npz_bomb() -> bytes:
    """X: 100 M uint8 zeros (100 MB, within the byte limit, 800 MB as the float64 matrix) in a
    deflated zip of about 100 KB; written in chunks, never held whole."""
    rows, features = 100_000, 1000
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        with archive.open("X.npy", "w", force_zip64=True) as member:
            header = {"descr": "|u1", "fortran_order": False, "shape": (rows, features)}
            np.lib.format.write_array_header_1_0(member, header)
            chunk = bytes(1 << 20)
            left = rows * features
            while left > 0:
                member.write(chunk[: min(left, len(chunk))])
                left -= len(chunk)
        labels = io.BytesIO()
        np.save(labels, np.zeros(rows, dtype=np.int64))
        archive.writestr("y.npy", labels.getvalue())
    content = buffer.getvalue()
    assert len(content) < 1_000_000
    return content


def _refused_too_large(r: httpx.Response, limit_name: str) -> dict[str, Any]:
    assert r.status_code == 413, r.text
    error: dict[str, Any] = r.json()["error"]
    assert error["code"] == "dataset_too_large", error
    assert limit_name in error["message"], error
    return error


@pytest.mark.modes("real")
def test_parquet_bomb_is_refused_from_its_footer(
    harness: Harness, parquet_bomb: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = harness
    owner, _ = h.new_key("owner")
    decoded: list[object] = []
    read_table = pq.read_table
    monkeypatch.setattr(pq, "read_table", lambda *a, **k: decoded.append(a) or read_table(*a, **k))
    objects, rows = _stored_objects(h), _dataset_rows(h)
    r = h.upload(owner, parquet_bomb, filename="bomb.parquet", metadata=dict(TABLE_META))
    error = _refused_too_large(r, "DPRELEASE_MAX_UPLOAD_CELLS")
    limit = h.runtime.settings.max_upload_cells
    assert error["detail"] == {"cells": 2 * BOMB_ROWS, "limit_cells": limit}
    assert f"{BOMB_ROWS} rows x 2 columns" in error["message"]
    assert decoded == []  # refused from the footer: no column was decoded
    assert (_stored_objects(h), _dataset_rows(h)) == (objects, rows)


@pytest.mark.modes("real")
def test_npz_bomb_is_refused_from_its_headers(
    harness: Harness, npz_bomb: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = harness
    owner, _ = h.new_key("owner")
    decoded: list[str] = []
    getitem = np.lib.npyio.NpzFile.__getitem__

    def spy(self: Any, key: str) -> Any:
        decoded.append(key)
        return getitem(self, key)

    monkeypatch.setattr(np.lib.npyio.NpzFile, "__getitem__", spy)
    r = h.upload(owner, npz_bomb, filename="bomb.npz", metadata=dict(NPZ_META))
    error = _refused_too_large(r, "DPRELEASE_MAX_UPLOAD_CELLS")
    assert error["detail"]["cells"] == 100_000 * 1000 + 100_000
    assert decoded == []  # refused from the .npy headers: no array was read


@pytest.mark.modes("real")
def test_decoded_bytes_cap(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    h = harness
    owner, _ = h.new_key("owner")
    X, y = toy_dataset(n=200, d=6)
    monkeypatch.setattr(h.runtime.settings, "max_upload_decoded_bytes", 200 * 6 * 8)
    r = h.upload(owner, npz_bytes(X, y), metadata=dict(NPZ_META, feature_range=[0, 13]))
    error = _refused_too_large(r, "DPRELEASE_MAX_UPLOAD_DECODED_BYTES")
    assert error["detail"] == {"decoded_bytes": 200 * 7 * 8, "limit_decoded_bytes": 200 * 6 * 8}


@pytest.mark.modes("real")
def test_csv_over_the_cell_cap_is_refused_before_the_rest_is_read(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = harness
    owner, _ = h.new_key("owner")
    monkeypatch.setattr(h.runtime.settings, "max_upload_cells", 1000)
    # The last row would make pandas fail: a refusal naming the cap shows that the reader
    # stopped at the first chunk past it.
    content = b"x,y\n" + b"0,1\n" * 100_000 + b"1,2,3,4\n"
    r = h.upload(owner, content, filename="big.csv", metadata=dict(TABLE_META))
    error = _refused_too_large(r, "the limit is 1000 values")
    assert "at least" in error["message"]
    # Under the cap, the same kind of file is accepted.
    small = b"x,y\n" + b"0,1\n1,0\n" * 250
    r = h.upload(owner, small, filename="small.csv", metadata=dict(TABLE_META))
    assert r.status_code == 201, r.text


class Blocker:
    """Holds every upload inside the dataset parser until released: the parse of a large file,
    made as long as a test needs."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered = threading.Semaphore(0)
        self.gate = threading.Event()
        parse: Callable[..., Any] = parsing.parse_dataset

        def held(**kwargs: Any) -> Any:
            self.entered.release()
            self.gate.wait(timeout=60)
            return parse(**kwargs)

        monkeypatch.setattr(parsing, "parse_dataset", held)

    def wait_entered(self, count: int, timeout: float = 20.0) -> bool:
        return all(self.entered.acquire(timeout=timeout) for _ in range(count))


@pytest.fixture
def blocker(monkeypatch: pytest.MonkeyPatch) -> Iterator[Blocker]:
    b = Blocker(monkeypatch)
    try:
        yield b
    finally:
        b.gate.set()  # a failing test never leaves a request parked


def _in_thread(call: Callable[[], httpx.Response]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(call()), daemon=True)
    thread.start()
    return thread, out


@pytest.mark.modes("real")
def test_health_answers_while_an_upload_is_parsed(harness: Harness, blocker: Blocker) -> None:
    h = harness
    owner, _ = h.new_key("owner")
    content = npz_bytes(*toy_dataset())
    upload, uploaded = _in_thread(lambda: h.upload(owner, content))
    assert blocker.wait_entered(1), "the upload never reached the parser"
    health, answered = _in_thread(lambda: h.client.get("/health"))
    health.join(timeout=10)
    # Before the fix the parser ran on the event loop, and /health waited for it.
    assert answered and answered[0].status_code == 200, "/health stalled behind an upload"
    blocker.gate.set()
    upload.join(timeout=60)
    assert uploaded and uploaded[0].status_code == 201, uploaded


@pytest.mark.modes("real")
def test_concurrent_uploads_over_the_cap_answer_503(
    harness: Harness, blocker: Blocker, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = harness
    owner, _ = h.new_key("owner")
    content = npz_bytes(*toy_dataset())
    # Two owners: one owner alone holds one slot (test_upload_slots.py).
    holders = [h.new_key("owner")[0] for _ in range(2)]
    held = [_in_thread(lambda key=key: h.upload(key, content)) for key in holders]
    # Before the fix the first parse blocked the event loop: the second never started.
    assert blocker.wait_entered(2), "two uploads should be parsed at once"
    monkeypatch.setattr(h.runtime.settings, "max_concurrent_uploads", 2)
    monkeypatch.setattr(h.runtime.settings, "upload_retry_after_s", 7)

    r = h.upload(owner, content)
    assert r.status_code == 503, r.text
    assert r.headers["Retry-After"] == "7"
    error = r.json()["error"]
    assert error["code"] == "uploads_busy"
    assert error["detail"] == {"retry_after_seconds": 7, "max_concurrent_uploads": 2}
    assert not blocker.entered.acquire(timeout=0.2)  # refused before the parser
    # A request without a key takes no slot: it is refused for what it is.
    anonymous = h.client.post("/datasets", files={"file": ("d.npz", content)})
    assert anonymous.status_code == 401, anonymous.text

    blocker.gate.set()
    for thread, out in held:
        thread.join(timeout=60)
        assert out and out[0].status_code == 201, out
    # The slots are given back.
    r = h.upload(owner, content)
    assert r.status_code == 201, r.text


def _compressed_npz(rows: int) -> bytes:
    """``np.savez_compressed`` of repetitive features: far smaller than its values."""
    X, y = toy_dataset(rows, k=2)
    X = np.clip(np.round(X / 11), 0, 1).astype(np.float64)  # within the declared [0, 1]
    buffer = io.BytesIO()
    np.savez_compressed(buffer, X=X, y=y)
    content = buffer.getvalue()
    assert len(content) < X.nbytes / 4
    return content


def _dictionary_parquet(rows: int) -> bytes:
    """0/1 columns, dictionary-encoded: more values than bytes, even uncompressed."""
    rng = np.random.default_rng(0)
    columns = {f"x{j}": rng.integers(0, 2, rows) for j in range(8)}
    columns["y"] = rng.integers(0, 2, rows)
    buffer = io.BytesIO()
    pq.write_table(pa.table(columns), buffer, compression="none", use_dictionary=True)
    content = buffer.getvalue()
    assert len(content) < rows * 9
    return content


@pytest.mark.parametrize("kind", ["npz", "parquet"])
def test_an_accepted_compressed_upload_releases(harness: Harness, kind: str) -> None:
    """The job re-reads the stored file under the caps it was accepted under, not under the
    file's own size: a compressed NPZ and a dictionary-encoded Parquet file release."""
    h = harness
    owner, _ = h.new_key("owner")
    if kind == "npz":
        content, meta, filename = _compressed_npz(2000), NPZ_META, "small.npz"
    else:
        content, meta, filename = _dictionary_parquet(20_000), TABLE_META, "small.parquet"
    r = h.upload(
        owner,
        content,
        filename=filename,
        metadata={**meta, "budget": {"epsilon": 5, "delta": 1e-5}},
    )
    assert r.status_code == 201, r.text
    body = h.release_body(r.json()["id"], mechanism="clustmix", params={}, epsilon=1.0)
    created = h.client.post("/releases", json=body, headers=h.headers(owner))
    assert created.status_code == 202, created.text
    done = h.wait(owner, created.json()["id"])
    assert done["status"] == "succeeded", done


@pytest.mark.modes("embedded")
@pytest.mark.parametrize("fmt", ["npz", "csv", "parquet"])
def test_a_file_with_more_features_than_the_cap_is_refused_from_its_metadata(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    """The feature count is read (the .npy header, the CSV header line, the Parquet footer)
    before anything per feature is built; six features against a cap of five."""
    h = harness
    owner, _ = h.new_key("owner")
    small = h.runtime.settings.model_copy(update={"max_upload_features": 5})
    monkeypatch.setattr(h.runtime, "settings", small)
    X, y = toy_dataset(40, k=2)
    X = np.clip(X / 11, 0, 1)
    if fmt == "npz":
        content, meta = npz_bytes(X, y), dict(NPZ_META)
    else:
        frame = {f"x{j}": X[:, j] for j in range(X.shape[1])} | {"y": y}
        buffer = io.BytesIO()
        if fmt == "csv":
            import pandas as pd

            buffer.write(pd.DataFrame(frame).to_csv(index=False).encode())
        else:
            pq.write_table(pa.table(frame), buffer)
        content, meta = buffer.getvalue(), dict(TABLE_META)
    r = h.upload(owner, content, filename=f"wide.{fmt}", metadata=meta)
    error = _refused_too_large(r, "DPRELEASE_MAX_UPLOAD_FEATURES")
    assert error["detail"] == {"features": 6, "limit_features": 5}
    monkeypatch.setattr(h.runtime, "settings", small.model_copy(update={"max_upload_features": 6}))
    assert h.upload(owner, content, filename=f"wide.{fmt}", metadata=meta).status_code == 201
