"""A job's uploads that start while its files are written (``worker.uploads``): what the
writers settle reaches the store's upload, a file that may be dropped starts only when kept,
each is completed only where it is stored, and whatever is left is aborted."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from service.file_upload import Uploaded
from service.storage import LocalObjectStore
from worker.uploads import EarlyUploads


class Upload:
    def __init__(self, key: str) -> None:
        self.key = key
        self.calls: list[Any] = []

    def advance(self, end: int, held: tuple[int, int] = (0, 0), final: bool = False) -> None:
        self.calls.append((end, held, final))

    def complete(self) -> Uploaded:
        self.calls.append("complete")
        return Uploaded(1, "ab")

    def abort(self) -> None:
        self.calls.append("abort")


class Store:
    def __init__(self) -> None:
        self.uploads: dict[str, Upload] = {}

    def upload_file(self, key: str, path: Path, *, size_hint: int = 0) -> Upload:
        self.uploads[key] = Upload(key)
        return self.uploads[key]


def test_settled_bytes_reach_the_upload_and_it_completes_when_stored() -> None:
    store = Store()
    with EarlyUploads(store) as uploads:  # type: ignore[arg-type]
        settle = uploads.follow("r/release.npz", Path("release.npz"))
        assert settle is not None
        settle(10, (0, 5), False)
        settle(20, (0, 0), True)
        assert store.uploads["r/release.npz"].calls == [(10, (0, 5), False), (20, (0, 0), True)]
        stored = uploads.store_file(store, "r/release.npz", Path("release.npz"))  # type: ignore[arg-type]
        assert stored == Uploaded(1, "ab")
    assert store.uploads["r/release.npz"].calls[-1] == "complete"  # not aborted after


def test_a_file_that_may_be_dropped_starts_when_kept() -> None:
    store = Store()
    with EarlyUploads(store) as uploads:  # type: ignore[arg-type]
        settle = uploads.follow("r/raw.npz", Path("raw.npz"), start=False)
        assert settle is not None
        settle(10, (0, 5), False)
        assert store.uploads == {}
        uploads.start(Path("raw.npz"))  # replays what was settled so far
        assert store.uploads["r/raw.npz"].calls == [(10, (0, 5), False)]
        uploads.drop(Path("raw.npz"))
        assert store.uploads["r/raw.npz"].calls[-1] == "abort"


def test_what_is_not_stored_is_aborted_however_the_job_ends() -> None:
    store = Store()
    with pytest.raises(RuntimeError), EarlyUploads(store) as uploads:  # type: ignore[arg-type]
        uploads.follow("r/release.npz", Path("release.npz"))
        uploads.follow("r/raw.npz", Path("raw.npz"), start=False)  # never started
        raise RuntimeError("the writer failed")
    assert store.uploads["r/release.npz"].calls == ["abort"]
    assert "r/raw.npz" not in store.uploads


def test_a_file_stored_under_another_key_is_refused() -> None:
    store = Store()
    with EarlyUploads(store) as uploads:  # type: ignore[arg-type]
        uploads.follow("r/release.npz", Path("release.npz"))
        with pytest.raises(ValueError, match=r"not r/other\.npz"):
            uploads.store_file(store, "r/other.npz", Path("release.npz"))  # type: ignore[arg-type]
    assert store.uploads["r/release.npz"].calls == ["abort"]


def test_without_a_store_nothing_is_followed() -> None:
    store = Store()
    uploads = EarlyUploads(None)
    assert uploads.follow("r/release.npz", Path("release.npz")) is None
    uploads.store_file(store, "r/release.npz", Path("release.npz"))  # type: ignore[arg-type]
    assert store.uploads["r/release.npz"].calls == ["complete"]


def test_the_local_store_hashes_a_finished_file_as_stored(tmp_path: Path) -> None:
    """The local store's upload hashes the file once its writer finishes it (in a thread):
    the digest completed is the stored file's, whether or not the writer said so first."""
    store = LocalObjectStore(tmp_path / "store")
    for key, final in (("r/a.npz", True), ("r/b.npz", False)):
        path = tmp_path / key.replace("/", "-")
        path.write_bytes(b"x" * 3_000_000)
        upload = store.upload_file(key, path)
        upload.advance(1_000_000)
        if final:
            upload.advance(3_000_000, final=True)
        stored = upload.complete()
        kept = (tmp_path / "store" / key).read_bytes()
        assert stored == Uploaded(len(kept), hashlib.sha256(kept).hexdigest())


def test_an_aborted_local_upload_waits_for_its_hash(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "store")
    path = tmp_path / "release.npz"
    path.write_bytes(b"y" * 1_000_000)
    upload = store.upload_file("r/release.npz", path)
    upload.advance(1_000_000, final=True)
    upload.abort()
    hashing = upload._hashing  # type: ignore[attr-defined]
    assert hashing is not None and hashing.done()
    assert not (tmp_path / "store" / "r" / "release.npz").exists()
