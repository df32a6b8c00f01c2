"""The worker's read of a stored upload: mapped, never one ``bytes`` of it (the local store's
own file; an S3 object streamed into a private scratch file that is gone however the read
ends), hashed and parsed from the map (an NPZ's uncompressed ``X`` converted straight from
it), with the hash checked before the read is marked."""

from __future__ import annotations

import contextlib
import io
import os
import tracemalloc
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from pydantic import SecretStr

from service import storage
from service.config import Settings
from service.datasets.parsing import parse_dataset
from service.datasets.schemas import DatasetMetadata
from service.errors import InvalidInput
from service.storage import LocalObjectStore, S3ObjectStore, sha256_hex
from tests.conftest import free_port
from tests.sigv4_s3 import SigV4S3Server
from worker import production
from worker import scratch as scratch_dirs

pytestmark = pytest.mark.unit

ACCESS, SECRET = "AKMAPTEST", "secret-of-the-mapped-tests"
KEY = "datasets/d1/raw.npz"
LIMIT = 1 << 30


def _npz(X: np.ndarray, y: np.ndarray, *, compressed: bool = False) -> bytes:
    buffer = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buffer, X=X, y=y)
    return buffer.getvalue()


def _meta(**fields: Any) -> DatasetMetadata:
    fields.setdefault("feature_range", [0, 255])
    fields.setdefault("classes", list(range(10)))
    return DatasetMetadata.model_validate(
        {"name": "d", "budget": {"epsilon": 1.0, "delta": 1e-5}, **fields}
    )


def _parse(content: bytes | memoryview, **fields: Any) -> Any:
    return parse_dataset(
        content=content, filename="d.npz", metadata=_meta(**fields), max_bytes=LIMIT
    )


def _mapped_inodes() -> set[int]:
    """Inodes of the files this process maps now (/proc/self/maps)."""
    inodes = set()
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 5 and fields[4] != "0":
            inodes.add(int(fields[4]))
    return inodes


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


@pytest.fixture
def s3_store() -> Iterator[S3ObjectStore]:
    with SigV4S3Server(free_port(), access_key=ACCESS, secret_key=SECRET) as server:
        settings = Settings(  # type: ignore[call-arg]
            s3_endpoint_url=server.endpoint_url,
            s3_bucket=f"mapped-tests-{uuid.uuid4().hex[:8]}",  # moto's buckets outlive a server
            s3_access_key_id=ACCESS,
            s3_secret_access_key=SecretStr(SECRET),
        )
        store = S3ObjectStore(settings)
        store.ensure_bucket()
        yield store


# --- the stores -----------------------------------------------------------------------------


def test_the_local_store_maps_its_own_file(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "store")
    content = os.urandom(100_000)
    store.put(KEY, content)
    stored = store.local_path(KEY)
    assert stored is not None
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    before = _files(tmp_path)
    with store.open_mapped(KEY, scratch=scratch) as view:
        assert view.readonly and view == content
        assert stored.stat().st_ino in _mapped_inodes()  # the stored file itself, mapped
        assert _files(tmp_path) == before  # no copy anywhere
    assert stored.stat().st_ino not in _mapped_inodes()  # unmapped on exit
    store.put("datasets/d2/raw.npz", b"")
    with store.open_mapped("datasets/d2/raw.npz") as view:  # mmap maps no empty file
        assert len(view) == 0
    with pytest.raises(FileNotFoundError), store.open_mapped("datasets/missing/raw.npz"):
        pass


def test_the_s3_store_maps_a_private_copy_it_removes(
    s3_store: S3ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Streamed in bounded reads into a 0600 file in the scratch directory, which is unlinked
    as soon as it is mapped: nothing of it is left to find by name, during or after."""
    monkeypatch.setattr(storage, "MAP_COPY_BYTES", 4096)  # many reads
    content = os.urandom(50_000)
    s3_store.put(KEY, content)
    seen: list[tuple[Path, int]] = []
    map_file = storage.map_file

    def recording(path: Path) -> Any:
        seen.append((path, path.stat().st_mode & 0o777))
        return map_file(path)

    monkeypatch.setattr(storage, "map_file", recording)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    with s3_store.open_mapped(KEY, scratch=scratch) as view:
        assert view.readonly and view == content
        assert list(scratch.iterdir()) == []
    [(path, mode)] = seen
    assert path.parent == scratch and mode == 0o600
    assert list(scratch.iterdir()) == []


class _Cut:
    """An S3 body that breaks after its first chunk."""

    closed = False

    def iter_chunks(self, chunk_size: int) -> Iterator[bytes]:
        yield b"x" * chunk_size
        raise ConnectionError("the connection was reset")

    def close(self) -> None:
        self.closed = True


def test_the_s3_copy_is_gone_however_the_read_ends(
    s3_store: S3ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    X = np.zeros((20, 4))
    X[7, 2] = np.nan  # refused once X is read: the parse fails holding views of the map
    s3_store.put(KEY, _npz(X, np.zeros(20, dtype=np.int64)))
    with (
        pytest.raises(InvalidInput, match="NaN"),
        s3_store.open_mapped(KEY, scratch=scratch) as view,
    ):
        _parse(view)
    assert list(scratch.iterdir()) == []

    body = _Cut()
    monkeypatch.setattr(s3_store.client, "get_object", lambda **_: {"Body": body})
    with (
        pytest.raises(ConnectionError),
        s3_store.open_mapped(KEY, scratch=scratch),
    ):
        pass
    assert body.closed and list(scratch.iterdir()) == []


# --- parsing from the map -------------------------------------------------------------------


CASES: dict[str, np.ndarray] = {
    "uint8 images": (np.arange(6 * 28 * 28).reshape(6, 28, 28) % 256).astype(np.uint8),
    "float32 fortran": np.asfortranarray(np.linspace(0, 9, 35, dtype=np.float32).reshape(7, 5)),
    "big-endian int16": np.arange(24, dtype=">i2").reshape(8, 3),
    "float64": np.linspace(-1, 12, 40).reshape(10, 4),
}


@pytest.mark.parametrize("compressed", [False, True], ids=["stored", "deflated"])
@pytest.mark.parametrize("name", list(CASES))
def test_an_npz_parses_from_its_map_as_from_its_bytes(
    tmp_path: Path, name: str, compressed: bool
) -> None:
    X = CASES[name]
    y = np.arange(len(X)) % 3
    content = _npz(X, y, compressed=compressed)
    path = tmp_path / "d.npz"
    path.write_bytes(content)
    from_bytes = _parse(content, feature_range=[0, 10])
    with storage.map_file(path) as view:
        from_map = _parse(view, feature_range=[0, 10])
    for parsed in (from_bytes, from_map):
        np.testing.assert_array_equal(parsed.X, np.clip(X.reshape(len(X), -1), 0, 10))
        assert parsed.X.dtype == np.float64 and parsed.X.flags.writeable
        assert parsed.X.base is None  # its own memory, never a view of the upload
        np.testing.assert_array_equal(parsed.labels, y)
        assert parsed.feature_shape == X.shape[1:]
    assert from_map.clipped_values == from_bytes.clipped_values


def test_a_stored_x_with_a_bad_crc_is_refused(tmp_path: Path) -> None:
    content = bytearray(_npz(np.ones((10, 3), dtype=np.uint8), np.zeros(10, dtype=np.int64)))
    with zipfile.ZipFile(io.BytesIO(bytes(content))) as archive:
        info = archive.getinfo("X.npy")
    content[info.header_offset + info.compress_size] ^= 0xFF  # a byte of X's values
    path = tmp_path / "d.npz"
    path.write_bytes(content)
    refused = "file could not be read as npz: it is not a zip archive"
    with pytest.raises(InvalidInput, match=refused):
        _parse(bytes(content))
    with pytest.raises(InvalidInput, match=refused), storage.map_file(path) as view:
        _parse(view)


# --- read_private ---------------------------------------------------------------------------


def _reader(
    store: Any, content: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, sha: str
) -> tuple[Any, Any, list[str]]:
    """A runtime and a job for ``production.read_private`` with the dataset stored, and the
    marks it records (the database's part replaced: it is not what these tests are about)."""
    store.delete(KEY)
    store.put(KEY, content)
    marks: list[str] = []

    def mark(session: Any, release_id: str, *, attempt: int) -> bool:
        marks.append(release_id)
        return True

    monkeypatch.setattr(production, "transaction", lambda _f: contextlib.nullcontext(None))
    monkeypatch.setattr(production.lifecycle, "mark_private_read", mark)
    runtime = SimpleNamespace(
        store=store,
        settings=Settings(scratch_dir=tmp_path / "scratch"),  # type: ignore[call-arg]
        session_factory=None,
    )
    job = SimpleNamespace(
        release_id="r1",
        attempt=1,
        dataset_key=KEY,
        dataset_sha256=sha,
        dataset_filename="data.npz",
        dataset_limits=None,
        metadata=_meta(),
    )
    return runtime, job, marks


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_a_hash_mismatch_is_refused_before_the_read_is_marked(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    store = (
        LocalObjectStore(tmp_path / "store")
        if kind == "local"
        else request.getfixturevalue("s3_store")
    )
    content = _npz(np.ones((10, 3), dtype=np.uint8), np.zeros(10, dtype=np.int64))
    runtime, job, marks = _reader(store, content, tmp_path, monkeypatch, sha="0" * 64)
    with pytest.raises(RuntimeError, match="does not match its recorded sha256"):
        production.read_private(runtime, job)
    assert marks == []
    assert list((tmp_path / "scratch").iterdir()) == []  # its scratch directory went too

    runtime, job, marks = _reader(store, content, tmp_path, monkeypatch, sha=sha256_hex(content))
    parsed = production.read_private(runtime, job)
    assert marks == ["r1"] and parsed.n_rows == 10
    assert list((tmp_path / "scratch").iterdir()) == []
    assert scratch_dirs.clean_stale(tmp_path / "scratch") == []


def test_read_private_holds_no_copy_of_the_upload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MNIST's training size (60 000 x 784 uint8, NPZ): the parse's traced peak is its float64
    matrix and one pass of the clip's n x d temporaries, never the upload itself (a bytes
    object of it and numpy's uint8 copy of X put two more uploads on top)."""
    rng = np.random.default_rng(0)
    X = rng.integers(0, 256, (60_000, 784), dtype=np.uint8)
    content = _npz(X, rng.integers(0, 10, 60_000))
    upload = len(content)
    del X
    runtime, job, _ = _reader(
        LocalObjectStore(tmp_path / "store"),
        content,
        tmp_path,
        monkeypatch,
        sha=sha256_hex(content),
    )
    del content
    matrix = 60_000 * 784 * 8
    tracemalloc.start()
    try:
        parsed = production.read_private(runtime, job)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert parsed.X.shape == (60_000, 784)
    assert peak < matrix + upload // 2, (peak, matrix, upload)
