"""The streaming release path: rows drawn ahead of the writer, the feature transform in
blocks, an NPZ written straight into its zip entry, a scratch file linked into the store."""

from __future__ import annotations

import contextvars
import errno
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from dpcore import preprocessing
from dpcore.artifacts import ArtifactWriter
from dpcore.preprocessing import RowTransform
from dpcore.release_layout import Layout
from service.storage import LocalObjectStore, ObjectExists
from worker.ahead import ahead

pytestmark = pytest.mark.unit


def test_ahead_keeps_order_and_runs_elsewhere() -> None:
    threads: list[str] = []

    def items() -> Iterator[int]:
        for i in range(50):
            threads.append(threading.current_thread().name)
            yield i

    assert list(ahead(items())) == list(range(50))
    assert set(threads) == {"release-rows"}


def test_ahead_raises_where_the_generator_failed() -> None:
    def items() -> Iterator[int]:
        yield 1
        yield 2
        raise RuntimeError("drawn badly")

    seen = []
    with pytest.raises(RuntimeError, match="drawn badly"):
        for item in ahead(items()):
            seen.append(item)
    assert seen == [1, 2]


def test_ahead_closes_the_generator_when_the_writer_stops() -> None:
    closed = threading.Event()

    def items() -> Iterator[int]:
        try:
            i = 0
            while True:
                yield i
                i += 1
        finally:
            closed.set()

    before = threading.active_count()
    with pytest.raises(ValueError):
        for item in ahead(items()):
            if item == 3:
                raise ValueError("disk full")
    # Closed and joined before ``ahead`` gave control back: nothing keeps drawing.
    assert closed.is_set()
    assert threading.active_count() == before


UNIT: contextvars.ContextVar[str] = contextvars.ContextVar("unit", default="none")


def test_ahead_runs_in_the_callers_context() -> None:
    def items() -> Iterator[str]:
        yield UNIT.get()

    token = UNIT.set("owner-only")
    try:
        assert list(ahead(items())) == ["owner-only"]
    finally:
        UNIT.reset(token)


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.float64])
def test_rows_in_blocks_equal_the_whole_array(
    monkeypatch: pytest.MonkeyPatch, dtype: type[np.generic]
) -> None:
    rng = np.random.default_rng(3)
    X = (rng.normal(size=(301, 17)) * 200).astype(dtype)
    transform = RowTransform.unit_range(np.zeros(17), np.full(17, 255.0), 9.0)
    # The computation as one array: clip, shift, scale, then one division by max(‖z‖, C).
    Z = (np.clip(X.astype(np.float64), 0.0, 255.0) - 0.0) / 255.0
    whole = Z / np.maximum(np.linalg.norm(Z, axis=1, keepdims=True), 9.0)
    monkeypatch.setattr(preprocessing, "_BLOCK_VALUES", 17 * 7)  # 7 rows a block
    assert np.array_equal(transform.rows(X), whole)
    assert np.array_equal(transform.rows(X, np.float32), whole.astype(np.float32))
    released = whole.astype(np.float32)
    back = (released.astype(np.float64) * (255.0 * 9.0) + 0.0).astype(np.float32)
    assert np.array_equal(transform.to_raw(released), back)
    assert transform.to_raw(released).dtype == np.float32
    # A narrower declared range clips bytes too (no integer shortcut there).
    narrow = RowTransform.unit_range(np.full(17, 10.0), np.full(17, 200.0), None)
    expected = (np.clip(X.astype(np.float64), 10.0, 200.0) - 10.0) / 190.0
    assert np.array_equal(narrow.rows(X), expected)


def _layout() -> Layout:
    return Layout.of(["a", "b", "c"], "label", "proportions", (0, 1))


def test_npz_streamed_into_its_entry(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    chunks = [rng.normal(size=(n, 3)) for n in (5, 1, 7)]  # float64: stored as float32
    path = tmp_path / "r.npz"
    with ArtifactWriter("npz", path, rows=13, layout=_layout(), metadata={"m": 1}) as writer:
        for X in chunks:
            writer.write(X, np.tile([0.25, 0.75], (len(X), 1)))
    with np.load(path) as release:
        assert release["X"].dtype == np.float32
        assert np.array_equal(release["X"], np.vstack(chunks).astype(np.float32))
        assert release["y"].shape == (13, 2)
    with zipfile.ZipFile(path) as zf:
        assert [i.compress_type for i in zf.infolist()] == [zipfile.ZIP_STORED] * 3
        assert zf.testzip() is None  # every entry's CRC matches its bytes


def test_npz_cut_short_leaves_no_file(tmp_path: Path) -> None:
    path = tmp_path / "r.npz"
    with (
        pytest.raises(RuntimeError, match="generator failed"),
        ArtifactWriter("npz", path, rows=10, layout=_layout(), metadata={}) as writer,
    ):
        writer.write(np.zeros((4, 3)), np.zeros((4, 2)))
        raise RuntimeError("generator failed")
    assert not path.exists()
    assert list(tmp_path.iterdir()) == []  # the label array's scratch too


def test_local_store_links_a_file_in_create_only(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "store")
    source = tmp_path / "release.npz"
    source.write_bytes(b"rows" * 1000)
    store.put_file("releases/r1/release.npz", source)
    stored = store.local_path("releases/r1/release.npz")
    assert stored is not None and stored.read_bytes() == b"rows" * 1000
    assert stored.stat().st_ino == source.stat().st_ino  # linked, not copied
    assert stored.stat().st_mode & 0o777 == 0o600
    source.unlink()  # the job's scratch removed: the object stays
    assert stored.read_bytes() == b"rows" * 1000
    other = tmp_path / "other.npz"
    other.write_bytes(b"other")
    with pytest.raises(ObjectExists):
        store.put_file("releases/r1/release.npz", other)
    assert stored.read_bytes() == b"rows" * 1000


def test_local_store_copies_across_filesystems(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    source = tmp_path / "scratch" / "release.npz"
    source.parent.mkdir()
    source.write_bytes(b"rows")
    link = os.link

    def cross_device(src: str | Path, dst: str | Path) -> None:
        if Path(src) == source:  # the scratch file lies on another filesystem
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        link(src, dst)

    monkeypatch.setattr("service.storage.os.link", cross_device)
    store = LocalObjectStore(tmp_path / "store")
    store.put_file("releases/r1/release.npz", source)
    stored = store.local_path("releases/r1/release.npz")
    assert stored is not None and stored.read_bytes() == b"rows"
    assert stored.stat().st_ino != source.stat().st_ino  # a copy
    with pytest.raises(ObjectExists):
        store.put_file("releases/r1/release.npz", source)
    assert sorted(p.name for p in stored.parent.iterdir()) == ["release.npz"]  # no temporaries
