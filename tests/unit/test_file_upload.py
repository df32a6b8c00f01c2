"""A file stored in S3 while it is written (``service.file_upload``), against moto's server
behind the tests' SigV4 check: parts go up before the file is finished, only the bytes a
writer settled, with their SHA-256; completion is create-only; and whatever fails, nothing of
the upload stays (no part, no object)."""

from __future__ import annotations

import base64
import hashlib
import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import EndpointConnectionError
from pydantic import SecretStr

from service.config import Settings
from service.file_upload import MIB, PartChanged, S3FileUpload, part_bytes_for
from service.storage import ObjectExists, S3ObjectStore
from tests.conftest import free_port
from tests.sigv4_s3 import SigV4S3Server

ACCESS, SECRET = "AKUPLOADTEST", "secret-of-the-upload-tests"
PART = 5 * MIB  # S3's least
WAIT_S = 60  # a safety net for a broken upload thread, never a pace the test relies on


@pytest.fixture(scope="module")
def server() -> Iterator[SigV4S3Server]:
    with SigV4S3Server(free_port(), access_key=ACCESS, secret_key=SECRET) as s3:
        yield s3


@pytest.fixture
def store(server: SigV4S3Server) -> Iterator[S3ObjectStore]:
    settings = Settings(  # type: ignore[call-arg]
        s3_endpoint_url=server.endpoint_url,
        s3_bucket=f"upload-{uuid.uuid4().hex[:8]}",
        s3_access_key_id=ACCESS,
        s3_secret_access_key=SecretStr(SECRET),
    )
    s3 = S3ObjectStore(settings)
    s3.ensure_bucket()
    s3.part_bytes = PART
    yield s3
    assert server.verifier.refusals == []  # every request signed as S3 checks it


class Parts:
    """The store's ``upload_part`` and ``create_multipart_upload`` calls, seen as they
    happen (moto keeps no part's checksum: the one each part was sent with is read from the
    answer, which echoes the header); ``gate`` (set by default) holds every part until it is
    set; ``fail`` names a part number whose upload raises."""

    def __init__(self, store: S3ObjectStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sent: dict[int, threading.Event] = {}
        self.checksums: dict[int, str] = {}  # as S3 echoed the part's x-amz-checksum-sha256
        self.started = threading.Event()
        self.gate = threading.Event()
        self.gate.set()
        self.fail: int | None = None
        self.creates = 0
        client = store.client
        upload_part, create = client.upload_part, client.create_multipart_upload

        def part(**kw: Any) -> Any:
            self.started.set()
            assert self.gate.wait(WAIT_S)
            if kw["PartNumber"] == self.fail:
                raise EndpointConnectionError(endpoint_url="http://s3.invalid")
            answer = upload_part(**kw)
            self.checksums[kw["PartNumber"]] = answer["ChecksumSHA256"]
            self.event(kw["PartNumber"]).set()
            return answer

        def created(**kw: Any) -> Any:
            self.creates += 1
            return create(**kw)

        monkeypatch.setattr(client, "upload_part", part)
        monkeypatch.setattr(client, "create_multipart_upload", created)

    def event(self, number: int) -> threading.Event:
        return self.sent.setdefault(number, threading.Event())

    def wait(self, *numbers: int) -> None:
        for number in numbers:
            assert self.event(number).wait(WAIT_S), f"part {number} was never sent"


@pytest.fixture
def parts(store: S3ObjectStore, monkeypatch: pytest.MonkeyPatch) -> Parts:
    return Parts(store, monkeypatch)


def _grow(path: Path, size: int) -> bytes:
    """Append random bytes to ``path`` up to ``size``; the file's bytes."""
    with path.open("ab") as handle:
        handle.write(os.urandom(size - handle.tell()))
    return path.read_bytes()


def _pending(store: S3ObjectStore) -> list[Any]:
    return store.client.list_multipart_uploads(Bucket=store.bucket).get("Uploads", [])


def _stored(store: S3ObjectStore, key: str) -> bytes | None:
    return store.get(key) if store.exists(key) else None


def _b64(data: bytes) -> str:
    return base64.b64encode(hashlib.sha256(data).digest()).decode()


def test_parts_go_up_while_the_file_is_written(
    store: S3ObjectStore, parts: Parts, tmp_path: Path
) -> None:
    path = tmp_path / "release.npz"
    upload = store.upload_file("r/release.npz", path, size_hint=20 * MIB)
    _grow(path, 2 * PART + 123)
    upload.advance(path.stat().st_size)
    parts.wait(1, 2)  # both complete parts went up before the file was finished
    (pending,) = _pending(store)
    listed = store.client.list_parts(
        Bucket=store.bucket, Key="r/release.npz", UploadId=pending["UploadId"]
    )["Parts"]
    early = path.read_bytes()
    assert [(p["PartNumber"], p["Size"]) for p in listed] == [(1, PART), (2, PART)]
    assert parts.checksums == {1: _b64(early[:PART]), 2: _b64(early[PART : 2 * PART])}
    assert not store.exists("r/release.npz")  # nothing is an object before ``complete``

    data = _grow(path, 3 * PART + 7)
    uploaded = upload.complete()
    assert (uploaded.size, uploaded.sha256) == (len(data), hashlib.sha256(data).hexdigest())
    assert store.get("r/release.npz") == data
    assert sorted(parts.sent) == [1, 2, 3, 4] and parts.creates == 1
    # Each part stored with its SHA-256: the object's checksum, as a streamed download reads
    # it, is S3's composite of theirs ("-4": four parts), which botocore does not check.
    stream = store.open_stream("r/release.npz", chunk_bytes=MIB)
    assert b"".join(stream.chunks) == data
    stream.close()
    digests = b"".join(
        hashlib.sha256(data[i : i + PART]).digest() for i in range(0, len(data), PART)
    )
    assert stream.checksum_sha256 == f"{_b64(digests)}-4"
    assert parts.checksums == {n + 1: _b64(data[n * PART : (n + 1) * PART]) for n in range(4)}
    assert _pending(store) == []


def test_held_bytes_go_up_once_the_file_is_done(
    store: S3ObjectStore, parts: Parts, tmp_path: Path
) -> None:
    """An NPZ's writer holds its first entry's header back: the part holding it waits for
    the file to be finished, and the object has the header as finally written."""
    path = tmp_path / "release.npz"
    upload = store.upload_file("r/held.npz", path)
    _grow(path, 2 * PART + 5)
    upload.advance(path.stat().st_size, (0, 100))
    parts.wait(2)
    assert 1 not in parts.sent
    with path.open("r+b") as handle:
        handle.write(b"patched header")
    data = _grow(path, 2 * PART + 5)
    upload.advance(len(data), final=True)  # the writer closed it: the rest goes up now
    parts.wait(1, 3)
    assert not store.exists("r/held.npz")
    assert upload.complete().sha256 == hashlib.sha256(data).hexdigest()
    assert store.get("r/held.npz") == data
    assert _pending(store) == []


def test_a_part_rewritten_after_it_went_up_stores_nothing(
    store: S3ObjectStore, parts: Parts, tmp_path: Path
) -> None:
    path = tmp_path / "release.csv"
    upload = store.upload_file("r/changed.csv", path)
    _grow(path, 2 * PART)
    upload.advance(2 * PART)
    parts.wait(1, 2)
    with path.open("r+b") as handle:
        handle.seek(PART + 10)
        handle.write(b"rewritten")
    with pytest.raises(PartChanged, match="part 2"):
        upload.complete()
    assert _stored(store, "r/changed.csv") is None
    assert _pending(store) == []


@pytest.mark.parametrize("size", [3 * PART + 1, MIB])
def test_an_existing_object_is_not_replaced(
    store: S3ObjectStore, parts: Parts, tmp_path: Path, size: int
) -> None:
    """Create-only whether the file goes up in parts (If-None-Match on the completion) or in
    one PUT: the caller's ``ObjectExists``, and the stored object untouched."""
    store.put("r/taken.npz", b"the first attempt's release")
    path = tmp_path / "release.npz"
    upload = store.upload_file("r/taken.npz", path)
    _grow(path, size)
    upload.advance(size)
    with pytest.raises(ObjectExists):
        upload.complete()
    assert store.get("r/taken.npz") == b"the first attempt's release"
    assert _pending(store) == []
    assert parts.creates == (1 if size > PART else 0)
    with pytest.raises(ObjectExists):
        store.put_file("r/taken.npz", path)  # the same, file already written


def test_a_failed_part_aborts_the_upload(
    store: S3ObjectStore, parts: Parts, tmp_path: Path
) -> None:
    parts.fail = 2
    path = tmp_path / "release.parquet"
    upload = store.upload_file("r/failed.parquet", path)
    _grow(path, 3 * PART)
    upload.advance(3 * PART)
    with pytest.raises(EndpointConnectionError):
        upload.complete()  # the thread's error, raised in the caller
    assert _stored(store, "r/failed.parquet") is None
    assert _pending(store) == []


def test_abort_waits_for_the_parts_in_flight(
    store: S3ObjectStore, parts: Parts, tmp_path: Path
) -> None:
    """A writer that fails (or a cancelled job) aborts while parts are being sent: they end
    first, then the upload is aborted, and none of them stays."""
    parts.gate.clear()
    path = tmp_path / "release.npz"
    upload = store.upload_file("r/aborted.npz", path)
    _grow(path, 2 * PART)
    upload.advance(2 * PART)
    assert parts.started.wait(WAIT_S)
    aborting = threading.Thread(target=upload.abort)
    aborting.start()
    parts.gate.set()
    aborting.join(WAIT_S)
    assert not aborting.is_alive()
    assert _pending(store) == []
    assert _stored(store, "r/aborted.npz") is None
    with pytest.raises(RuntimeError, match="is over"):
        upload.advance(3 * PART)


def test_a_small_file_is_one_put(store: S3ObjectStore, parts: Parts, tmp_path: Path) -> None:
    path = tmp_path / "metadata.json"
    data = _grow(path, PART)  # one part at most: no multipart upload
    store.put_file("r/metadata.json", path)
    assert parts.creates == 0 and parts.sent == {}
    head = store.client.head_object(
        Bucket=store.bucket, Key="r/metadata.json", ChecksumMode="ENABLED"
    )
    assert head["ChecksumSHA256"] == _b64(data)


def test_a_large_file_put_whole_goes_up_in_parts(
    store: S3ObjectStore, parts: Parts, tmp_path: Path
) -> None:
    path = tmp_path / "weights.pt"
    data = _grow(path, 2 * PART + 1)
    store.put_file("r/weights.pt", path)
    assert store.get("r/weights.pt") == data
    assert sorted(parts.sent) == [1, 2, 3] and _pending(store) == []


def test_part_size_grows_for_files_of_many_parts() -> None:
    assert part_bytes_for(0) == part_bytes_for(10 * MIB) == 8 * MIB
    assert part_bytes_for(100 * 1024 * MIB) == 21 * MIB  # twice the hint in 10 000 parts
    with pytest.raises(ValueError, match="at least"):
        S3FileUpload(None, "b", "k", Path("f"), put=lambda data: None, part_bytes=4 * MIB)
