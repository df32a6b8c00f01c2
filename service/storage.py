"""Object storage: a local directory (embedded mode) or any S3-compatible store.

Writes are create-only: a key is written once and never overwritten, so a retried job can
never replace an artifact that a download or a ledger entry already refers to.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import mmap
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from dpcore.artifacts import sha256_file
from service.config import Settings
from service.file_upload import (
    PART_BYTES,
    FileUpload,
    S3FileUpload,
    Uploaded,
    is_conflict,
    part_bytes_for,
)
from service.file_upload import ObjectExists as ObjectExists

# botocore's DEBUG records carry request headers, among them x-amz-content-sha256 of what is
# stored: for an upload, a hash of the raw data. Never let them through, whatever the root
# logger's level.
for _name in ("botocore", "boto3", "s3transfer"):
    _logger = logging.getLogger(_name)
    _logger.setLevel(max(_logger.level, logging.INFO))

# Bytes per read when an object is copied from S3 into a scratch file to be mapped: what
# memory holds of it at once.
MAP_COPY_BYTES = 8 << 20


@dataclass
class ObjectStream:
    """A stored object read in chunks (streamed downloads): memory holds one chunk at a
    time. ``close`` releases the underlying file or connection; call it once done."""

    size: int
    chunks: Iterator[bytes]
    close: Callable[[], None]
    etag: str | None = None
    checksum_sha256: str | None = None  # base64, as S3's x-amz-checksum-sha256


class ObjectStore(Protocol):
    def put(self, key: str, data: bytes) -> None: ...
    def put_file(self, key: str, path: Path) -> None: ...
    def upload_file(self, key: str, path: Path, *, size_hint: int = 0) -> FileUpload:
        """Store the file at ``path`` under ``key``, create-only, starting while it is still
        written (``FileUpload.advance``) where the store can (S3: a multipart upload), else
        all at ``complete``. ``size_hint``: about how large it will be."""
        ...

    def get(self, key: str) -> bytes: ...
    def exists(self, key: str) -> bool: ...
    def delete(self, key: str) -> None:
        """Remove the object for good; idempotent (a missing key is not an error)."""
        ...

    def delete_prefix(self, prefix: str) -> int:
        """Remove every object whose key starts with ``prefix`` (a folder, ending in "/");
        returns how many. Idempotent."""
        ...

    def local_path(self, key: str) -> Path | None: ...
    def presigned_url(self, key: str, *, filename: str) -> str | None: ...
    def ping(self) -> None:
        """Raise unless the store answers (readiness); cheap and bounded in time."""
        ...

    def open_stream(self, key: str, *, chunk_bytes: int) -> ObjectStream: ...

    def open_mapped(
        self, key: str, *, scratch: Path | None = None
    ) -> AbstractContextManager[memoryview]:
        """The stored object as read-only memory, for as long as the context lasts: a memory
        map of a file, never the whole object in one ``bytes``. The local store maps its own
        file (no copy); the S3 store streams the object into a private (0600) file in
        ``scratch`` (else the system's temporary directory), maps it and unlinks it at once,
        so nothing of it is left on disk however the context ends."""
        ...


def sha256_hex(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


@contextlib.contextmanager
def map_file(path: Path) -> Iterator[memoryview]:
    """The file at ``path`` mapped read-only, as a memoryview (an empty file, which mmap
    cannot map: an empty view). The map is closed on exit; where a view of it is still held
    (an array in an exception's traceback), it is unmapped once that goes instead."""
    with path.open("rb") as handle:
        if os.fstat(handle.fileno()).st_size == 0:
            yield memoryview(b"")
            return
        mapping = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    view = memoryview(mapping)
    try:
        yield view
    finally:
        with contextlib.suppress(BufferError):  # exported: unmapped when the last view goes
            view.release()
            mapping.close()


class LocalObjectStore:
    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if self.root not in path.parents:
            raise ValueError(f"object key escapes the store: {key!r}")
        return path

    def put(self, key: str, data: bytes) -> None:
        self._publish(key, lambda handle: handle.write(data))

    def put_file(self, key: str, path: Path) -> None:
        """The file itself is linked in where it lies on the store's filesystem (a job's
        scratch file: no copy of a release's bytes), else copied; create-only either way."""
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        with path.open("rb+") as source:
            os.fsync(source.fileno())
            os.fchmod(source.fileno(), 0o600)  # as ``_publish``'s temporary files are
        try:
            os.link(path, target)
            return
        except FileExistsError as exc:
            raise ObjectExists(key) from exc
        except OSError:
            pass  # another filesystem (EXDEV) or links not allowed there: copy
        with path.open("rb") as source:
            self._publish(key, lambda handle: shutil.copyfileobj(source, handle))

    def upload_file(self, key: str, path: Path, *, size_hint: int = 0) -> FileUpload:
        return WholeFile(self, key, path)

    def _publish(self, key: str, fill: Callable[[BinaryIO], object]) -> None:
        """Write a temporary file beside the key, then link it in: link() fails if the key
        exists, so publishing is atomic and create-only."""
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".part-")
        try:
            with os.fdopen(fd, "wb") as handle:
                fill(handle)
                handle.flush()
                os.fsync(handle.fileno())
            try:
                os.link(tmp, path)
            except FileExistsError as exc:
                raise ObjectExists(key) from exc
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def get(self, key: str) -> bytes:
        return self._path(key).read_bytes()

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def delete(self, key: str) -> None:
        path = self._path(key)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        # Drop the object's own directory if that leaves it empty (datasets/<id>/), but never
        # a top-level one (datasets/) that a concurrent upload may be creating a child in.
        if path.parent.parent != self.root and path.parent != self.root:
            with contextlib.suppress(OSError):  # not empty, or already gone
                path.parent.rmdir()

    def delete_prefix(self, prefix: str) -> int:
        if not prefix.endswith("/"):
            raise ValueError("a prefix names a folder and ends with '/'")
        folder = self._path(prefix.rstrip("/"))
        if not folder.is_dir():
            return 0
        removed = sum(1 for p in folder.rglob("*") if p.is_file())
        shutil.rmtree(folder, ignore_errors=True)
        return removed

    def local_path(self, key: str) -> Path | None:
        return self._path(key)

    def presigned_url(self, key: str, *, filename: str) -> str | None:
        return None

    def ping(self) -> None:
        if not self.root.is_dir() or not os.access(self.root, os.W_OK | os.X_OK):
            raise OSError("the object directory is missing or not writable")

    def open_stream(self, key: str, *, chunk_bytes: int) -> ObjectStream:
        handle = self._path(key).open("rb")
        size = os.fstat(handle.fileno()).st_size
        chunks = iter(lambda: handle.read(chunk_bytes), b"")
        return ObjectStream(size=size, chunks=chunks, close=handle.close)

    @contextlib.contextmanager
    def open_mapped(self, key: str, *, scratch: Path | None = None) -> Iterator[memoryview]:
        # The object's own file, mapped read-only: no copy, on disk or in memory.
        with map_file(self._path(key)) as view:
            yield view


@dataclass
class WholeFile:
    """A file stored whole once it is written (the local store links it in: nothing to
    start early). Once its writer says it is finished, it is hashed and flushed to disk in a
    thread of its own while the job goes on (the other files' writing, their hashes), so
    that storing it finds little left to do."""

    store: ObjectStore
    key: str
    path: Path
    _hashing: Future[str] | None = field(default=None, init=False, repr=False)

    def advance(self, end: int, held: tuple[int, int] = (0, 0), final: bool = False) -> None:
        if final and self._hashing is None:
            pool = ThreadPoolExecutor(1, thread_name_prefix="hash")
            self._hashing = pool.submit(_hash_and_flush, self.path)
            pool.shutdown(wait=False)  # the one task still runs; its thread then ends

    def complete(self) -> Uploaded:
        # Hashed from the file: linking it in (or copying it) does not change its bytes.
        digest = self._hashing.result() if self._hashing is not None else sha256_file(self.path)
        self.store.put_file(self.key, self.path)
        return Uploaded(self.path.stat().st_size, digest)

    def abort(self) -> None:
        if self._hashing is not None:
            # Nothing reads the file once its scratch directory goes.
            with contextlib.suppress(Exception):
                self._hashing.result()


def _hash_and_flush(path: Path) -> str:
    """The file's SHA-256, its bytes then written to disk (``put_file``'s own fsync, later,
    finds them there)."""
    digest = sha256_file(path)
    with path.open("rb") as handle:
        os.fsync(handle.fileno())
    return digest


class S3ObjectStore:
    def __init__(self, settings: Settings) -> None:
        assert settings.s3_bucket is not None
        self.bucket = settings.s3_bucket
        # Files larger than one part are stored by multipart uploads of parts this large (or
        # larger, for a file that would need more than S3's 10 000).
        self.part_bytes = PART_BYTES
        self.client = _s3_client(settings, settings.s3_endpoint_url)
        # Presigned URLs must name a host the downloader can reach (e.g. localhost:9000
        # outside docker-compose while the API talks to minio:9000).
        public = settings.s3_public_endpoint_url or settings.s3_endpoint_url
        self.presigner = _s3_client(settings, public)
        self.presign_seconds = settings.s3_presign_seconds
        # Readiness asks with one attempt and short timeouts: the client above retries.
        self.probe = _s3_client(
            settings,
            settings.s3_endpoint_url,
            Config(
                signature_version="s3v4",
                retries={"max_attempts": 1, "mode": "standard"},
                connect_timeout=1,
                read_timeout=2,
            ),
        )

    def ping(self) -> None:
        self.probe.head_bucket(Bucket=self.bucket)

    def ensure_bucket(self) -> None:
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except ClientError:
            self.client.create_bucket(Bucket=self.bucket)

    def put(self, key: str, data: bytes) -> None:
        self._put(key, data)

    def _put(self, key: str, body: Any) -> None:
        try:
            self.client.put_object(
                Bucket=self.bucket,
                Key=key,
                Body=body,
                IfNoneMatch="*",
                ChecksumAlgorithm="SHA256",
            )
        except ClientError as exc:
            if is_conflict(exc):
                raise ObjectExists(key) from exc
            raise

    def put_file(self, key: str, path: Path) -> None:
        """One create-only PUT for a file of one part at most; a larger one goes up in parts,
        a bounded number at a time (``service.file_upload``)."""
        self.upload_file(key, path).complete()

    def upload_file(self, key: str, path: Path, *, size_hint: int = 0) -> FileUpload:
        if size_hint == 0 and path.exists():
            size_hint = path.stat().st_size
        return S3FileUpload(
            self.client,
            self.bucket,
            key,
            path,
            put=lambda data: self._put(key, data),
            part_bytes=part_bytes_for(size_hint, self.part_bytes),
        )

    def get(self, key: str) -> bytes:
        body: bytes = self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        return body

    def exists(self, key: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in {"404", "NoSuchKey", "NotFound"}:
                return False
            raise
        return True

    def delete(self, key: str) -> None:
        # S3 answers 204 for a missing key too. On a versioned bucket this only adds a delete
        # marker: erasure there needs a lifecycle rule expiring noncurrent versions.
        self.client.delete_object(Bucket=self.bucket, Key=key)

    def delete_prefix(self, prefix: str) -> int:
        if not prefix.endswith("/"):
            raise ValueError("a prefix names a folder and ends with '/'")
        removed = 0
        for page in self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=prefix
        ):
            batch = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if batch:
                self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch})
                removed += len(batch)
        return removed

    def local_path(self, key: str) -> Path | None:
        return None

    def presigned_url(self, key: str, *, filename: str) -> str | None:
        url: str = self.presigner.generate_presigned_url(
            "get_object",
            Params={
                "Bucket": self.bucket,
                "Key": key,
                "ResponseContentDisposition": f'attachment; filename="{filename}"',
            },
            ExpiresIn=self.presign_seconds,
        )
        return url

    def open_stream(self, key: str, *, chunk_bytes: int) -> ObjectStream:
        # ChecksumMode: S3 returns the SHA-256 stored with the object (every put sends one),
        # and botocore checks the body against it as it is read, so a corrupted stream ends in
        # an error instead of a complete-looking download.
        response = self.client.get_object(Bucket=self.bucket, Key=key, ChecksumMode="ENABLED")
        body = response["Body"]
        return ObjectStream(
            size=int(response["ContentLength"]),
            chunks=body.iter_chunks(chunk_size=chunk_bytes),
            close=body.close,
            etag=response.get("ETag"),
            checksum_sha256=response.get("ChecksumSHA256"),
        )

    @contextlib.contextmanager
    def open_mapped(self, key: str, *, scratch: Path | None = None) -> Iterator[memoryview]:
        # mkstemp: created 0600, readable by this user alone, under a name no one else chose.
        fd, name = tempfile.mkstemp(dir=scratch, prefix=".object-")
        path = Path(name)
        try:
            with os.fdopen(fd, "wb") as handle:
                body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"]
                try:
                    for block in body.iter_chunks(chunk_size=MAP_COPY_BYTES):
                        handle.write(block)
                finally:
                    body.close()
            with map_file(path) as view:
                path.unlink()  # the map holds the bytes now; no name is left to find them by
                yield view
        finally:
            path.unlink(missing_ok=True)


def _s3_client(settings: Settings, endpoint_url: str | None, config: Config | None = None) -> Any:
    secret = settings.s3_secret_access_key
    return boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        region_name=settings.s3_region,
        aws_access_key_id=settings.s3_access_key_id,
        aws_secret_access_key=secret.get_secret_value() if secret else None,
        config=config or Config(signature_version="s3v4", retries={"max_attempts": 5}),
    )


def make_store(settings: Settings) -> ObjectStore:
    if settings.uses_s3:
        store = S3ObjectStore(settings)
        store.ensure_bucket()
        return store
    return LocalObjectStore(settings.home / "objects")
