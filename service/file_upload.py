"""Storing a file in S3 while it is still being written: a multipart upload whose parts go up
from the growing file as soon as its writer says they are final, a bounded number at a time,
completed create-only once the file is done.

A writer says which bytes are final with ``advance(end, held)``: bytes [0, end) are on disk
and stay as they are, except [held[0], held[1]), which it may still rewrite before it closes
(an NPZ's first zip entry header, patched with the entry's size and CRC when the entry ends:
``dpcore.artifacts``); and ``advance(size, final=True)`` once the file is finished. Part k
covers bytes [k·P, (k+1)·P) of the file; it is uploaded as soon as it lies wholly below
``end`` and outside ``held``, by a pool of ``in_flight`` threads, each reading its part from
the file when it starts (memory: ``in_flight`` parts, nothing else copied), and sent with its
SHA-256 (``ChecksumSHA256``), which S3 checks.

Once the file is finished (that last ``advance``, or ``complete`` itself) the parts not sent
yet go up, and the pool reads the file once more, to hash it whole (the size and SHA-256 a
release records) and to check every part sent early against the file's final bytes (a
writer that rewrote bytes it had said were final fails the upload instead of storing
something else). ``complete`` waits for those, and completes with ``If-None-Match: *``: an
existing object is never replaced (``ObjectExists``, as a create-only PUT). Whatever fails
there, and ``abort``, waits for the parts in flight and aborts the upload: no part and no
partial object stays behind. A file of one part at most is stored by one create-only PUT.
"""

from __future__ import annotations

import base64
import contextvars
import hashlib
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from botocore.exceptions import BotoCoreError, ClientError

log = logging.getLogger(__name__)
T = TypeVar("T")

MIB = 1024 * 1024
PART_BYTES = 8 * MIB
MIN_PART_BYTES = 5 * MIB  # S3's least, for every part but the last
MAX_PARTS = 10_000  # S3's most
IN_FLIGHT = 4  # parts read and being sent at once, per upload


class ObjectExists(Exception):
    """A create-only write found the key already present."""


class PartChanged(Exception):
    """A part sent before the file was finished no longer holds the file's bytes: its writer
    rewrote bytes it had said were final. Nothing is stored."""


def is_conflict(exc: ClientError) -> bool:
    """S3's answer to a create-only write (``If-None-Match: *``) whose key exists."""
    code = exc.response.get("Error", {}).get("Code")
    return code in {"PreconditionFailed", "ConditionalRequestConflict"}


@dataclass(frozen=True)
class Uploaded:
    """What was stored: the file's size and SHA-256 (hex), read from the file itself."""

    size: int
    sha256: str


class FileUpload(Protocol):
    """A file stored under a key, started while the file is written (``advance``: what of it
    is final), ended by ``complete`` once it is (create-only) or by ``abort``."""

    def advance(self, end: int, held: tuple[int, int] = (0, 0), final: bool = False) -> None: ...
    def complete(self) -> Uploaded: ...
    def abort(self) -> None: ...


def part_bytes_for(size_hint: int, base: int = PART_BYTES) -> int:
    """``base``, or more (whole MiB) where a file of twice ``size_hint`` bytes would need more
    than S3's 10 000 parts."""
    need = -(-2 * size_hint // MAX_PARTS)
    return max(base, -(-need // MIB) * MIB)


@dataclass(frozen=True)
class _Part:
    number: int
    etag: str
    checksum: str  # base64 SHA-256, as S3 takes it
    digest: bytes


class S3FileUpload:
    """One file's upload to ``key`` (see the module's docstring). ``put`` stores a file of
    one part at most by one create-only PUT."""

    def __init__(
        self,
        client: Any,
        bucket: str,
        key: str,
        path: Path,
        *,
        put: Callable[[bytes], None],
        part_bytes: int = PART_BYTES,
        in_flight: int = IN_FLIGHT,
    ) -> None:
        if part_bytes < MIN_PART_BYTES:
            raise ValueError(f"parts of {part_bytes} bytes: S3 takes {MIN_PART_BYTES} at least")
        self.client, self.bucket, self.key, self.path = client, bucket, key, path
        self.part_bytes, self.in_flight = part_bytes, in_flight
        self._put = put
        self._pool: ThreadPoolExecutor | None = None  # started with the first part
        self._lock = threading.Lock()
        self._upload_id: str | None = None
        self._sent: dict[int, Future[_Part]] = {}  # by part index (number - 1)
        self._next = 0  # the first part index not yet looked at
        self._held_back: set[int] = set()  # complete parts skipped because the writer held them
        self._size: int | None = None  # the finished file's, once its writer said so
        self._whole: Future[str] | None = None  # its SHA-256 (hex), hashed in the pool
        self._checks: dict[int, Future[bytes]] = {}  # early parts' final bytes, hashed
        self._closed = False  # completed or aborted
        self._completed = False

    # -- while the file is written ------------------------------------------------------

    def advance(self, end: int, held: tuple[int, int] = (0, 0), final: bool = False) -> None:
        """Bytes [0, ``end``) of the file are final but for ``held``: send the parts that
        became complete. ``final``: the file is finished, ``end`` bytes long: the rest goes
        up now, and the pool reads the file again for ``complete`` (hashed whole, early
        parts checked). Raises what a part's upload raised, if one failed."""
        self._raise_failed()
        if self._closed or self._size is not None:
            raise RuntimeError(f"the upload of {self.key} is over")
        if final:
            self._finished(end)
            return
        ready = end // self.part_bytes  # parts [0, ready) lie wholly below end
        looked = sorted(self._held_back) + list(range(self._next, ready))
        self._next = max(self._next, ready)
        self._held_back = set()
        for index in looked:
            start, stop = index * self.part_bytes, (index + 1) * self.part_bytes
            if held[0] < stop and start < held[1]:
                self._held_back.add(index)
            else:
                self._send(index, start, stop)

    def _finished(self, size: int) -> None:
        count = max(1, -(-size // self.part_bytes))
        if count > MAX_PARTS:
            raise RuntimeError(f"{size} bytes need more than {MAX_PARTS} parts")
        self._size = size
        if not self._sent and count == 1:
            return  # one PUT, at ``complete``
        early = sorted(self._sent)
        if early and early[-1] >= count:
            raise PartChanged(f"{self.key}: the file ended before a part sent early")
        self._whole = self._submit(self._hash_whole, size)
        for index in range(count):
            if index not in self._sent:
                start = index * self.part_bytes
                self._send(index, start, min(size, start + self.part_bytes))
        # Parts read before the file was finished: their final bytes, to compare.
        self._checks = {index: self._submit(self._digest, index) for index in early}

    def _raise_failed(self) -> None:
        for future in self._sent.values():
            if future.done() and not future.cancelled() and future.exception() is not None:
                future.result()  # raises it

    def _submit(self, task: Callable[..., T], *args: Any) -> Future[T]:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.in_flight, thread_name_prefix="s3-part")
        # Each task in a copy of the caller's context (an owner-only job's log records stay
        # owner-only: ``service.owner_only``); a context is entered by one thread at a time.
        context = contextvars.copy_context()
        return self._pool.submit(context.run, task, *args)

    def _send(self, index: int, start: int, stop: int) -> None:
        self._sent[index] = self._submit(self._upload_part, index, start, stop)

    def _upload_part(self, index: int, start: int, stop: int) -> _Part:
        with self.path.open("rb") as handle:
            handle.seek(start)
            data = handle.read(stop - start)
        digest = hashlib.sha256(data).digest()
        checksum = base64.b64encode(digest).decode()
        response = self.client.upload_part(
            Bucket=self.bucket,
            Key=self.key,
            UploadId=self._upload(),
            PartNumber=index + 1,
            Body=data,
            ChecksumAlgorithm="SHA256",
            ChecksumSHA256=checksum,
        )
        return _Part(index + 1, response["ETag"], checksum, digest)

    def _digest(self, index: int) -> bytes:
        """The SHA-256 of part ``index`` as the file holds it now."""
        with self.path.open("rb") as handle:
            handle.seek(index * self.part_bytes)
            return hashlib.sha256(handle.read(self.part_bytes)).digest()

    def _hash_whole(self, size: int) -> str:
        whole, read = hashlib.sha256(), 0
        with self.path.open("rb") as handle:
            for block in iter(lambda: handle.read(MIB), b""):
                whole.update(block)
                read += len(block)
        if read != size:
            raise PartChanged(f"{self.key}: the file changed size after it was finished")
        return whole.hexdigest()

    def _upload(self) -> str:
        """The multipart upload's id, created by the first part that needs it."""
        with self._lock:
            if self._upload_id is None:
                if self._closed:
                    raise RuntimeError(f"the upload of {self.key} is over")
                created = self.client.create_multipart_upload(
                    Bucket=self.bucket, Key=self.key, ChecksumAlgorithm="SHA256"
                )
                self._upload_id = created["UploadId"]
            return self._upload_id

    # -- once it is written ---------------------------------------------------------------

    def complete(self) -> Uploaded:
        """The file is finished: store it (create-only) and say what was stored. Raises
        ``ObjectExists`` when the key exists; on any failure nothing is stored and nothing
        of the upload remains."""
        try:
            uploaded = self._complete()
        except BaseException:
            self.abort()
            raise
        self._finish()
        return uploaded

    def _complete(self) -> Uploaded:
        self._raise_failed()
        if self._closed:
            raise RuntimeError(f"the upload of {self.key} is over")
        size = self.path.stat().st_size
        if self._size is None:
            self._finished(size)
        elif size != self._size:
            raise PartChanged(f"{self.key}: the file changed size after it was finished")
        if self._whole is None:  # one part at most
            data = self.path.read_bytes()
            self._put(data)
            self._completed = True
            return Uploaded(len(data), hashlib.sha256(data).hexdigest())
        for index, final in self._checks.items():
            if final.result() != self._sent[index].result().digest:
                raise PartChanged(f"{self.key}: part {index + 1} changed after it was sent")
        digest = self._whole.result()
        parts = [self._sent[index].result() for index in sorted(self._sent)]
        try:
            self.client.complete_multipart_upload(
                Bucket=self.bucket,
                Key=self.key,
                UploadId=self._upload(),
                MultipartUpload={
                    "Parts": [
                        {"PartNumber": p.number, "ETag": p.etag, "ChecksumSHA256": p.checksum}
                        for p in parts
                    ]
                },
                IfNoneMatch="*",
            )
        except ClientError as exc:
            if is_conflict(exc):
                raise ObjectExists(self.key) from exc
            raise
        self._completed = True
        log.info(
            "stored %s: %d bytes in %d parts, %d sent while it was written",
            self.key,
            size,
            len(parts),
            len(self._checks),
        )
        return Uploaded(size, digest)

    def abort(self) -> None:
        """Stop: parts not started are dropped, those in flight waited for, and the multipart
        upload, if one was created and not completed, aborted. Never raises (it runs while
        another error is on its way); an abort S3 refuses is logged, its parts left to the
        bucket's lifecycle rule (docs/operations.md, "Object storage")."""
        self._finish()
        with self._lock:
            upload_id = self._upload_id
        if upload_id is None or self._completed:
            return
        try:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=self.key, UploadId=upload_id)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "NoSuchUpload":
                log.warning("could not abort the multipart upload of %s: %s", self.key, exc)
        except BotoCoreError as exc:
            log.warning("could not abort the multipart upload of %s: %s", self.key, exc)

    def _finish(self) -> None:
        with self._lock:
            self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
