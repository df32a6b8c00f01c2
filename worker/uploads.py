"""A release's files stored while they are written: the artifact and the owner's raw copy go
up from the scratch files as their writers settle bytes (``service.file_upload``: S3 parts
sent from the growing file, a bounded number at a time; the local store links the finished
file in, as before), and each is completed only where publishing stores it, in its order
(further files, the raw copy, then the artifact: ``worker.publishing``).

``EarlyUploads`` spans writing and publishing (``worker.production``). However the job ends,
closing it aborts every upload not completed (a failure, a cancel, a settled release whose
claim was refused): parts in flight are waited for and nothing of them stays in the store.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from service.file_upload import FileUpload, Uploaded
from service.storage import ObjectStore

Settle = Callable[[int, tuple[int, int], bool], None]


class _Followed:
    """One file being written, its upload started now or later (``start``)."""

    def __init__(self, store: ObjectStore, key: str, path: Path, size_hint: int) -> None:
        self.store, self.key, self.path, self.size_hint = store, key, path, size_hint
        self.upload: FileUpload | None = None
        self.last: tuple[int, tuple[int, int], bool] | None = None

    def settle(self, end: int, held: tuple[int, int], final: bool) -> None:
        self.last = (end, held, final)
        if self.upload is not None:
            self.upload.advance(end, held, final)

    def start(self) -> None:
        if self.upload is None:
            self.upload = self.store.upload_file(self.key, self.path, size_hint=self.size_hint)
            if self.last is not None:
                self.upload.advance(*self.last)


class EarlyUploads:
    """The files of one job whose uploads start while they are written. Without a store
    (``EarlyUploads(None)``) it follows nothing: each file goes up whole when stored."""

    def __init__(self, store: ObjectStore | None) -> None:
        self.store = store
        self._files: dict[Path, _Followed] = {}

    def follow(
        self, key: str, path: Path, size_hint: int = 0, *, start: bool = True
    ) -> Settle | None:
        """The writer's ``on_settled`` for the file at ``path``, to be stored under ``key``;
        its upload begins now, or at ``start(path)`` (a file that may yet be dropped)."""
        if self.store is None:
            return None
        followed = _Followed(self.store, key, path, size_hint)
        self._files[path] = followed
        if start:
            followed.start()
        return followed.settle

    def start(self, path: Path) -> None:
        if path in self._files:
            self._files[path].start()

    def drop(self, path: Path) -> None:
        """The file will not be stored: its upload, if begun, is aborted."""
        followed = self._files.pop(path, None)
        if followed is not None and followed.upload is not None:
            followed.upload.abort()

    def store_file(self, store: ObjectStore, key: str, path: Path) -> Uploaded:
        """Store the finished file at ``path`` under ``key``, create-only (``ObjectExists``):
        completing its upload if it was followed, else storing it now. Its size and SHA-256
        are read from the file as stored."""
        followed = self._files.pop(path, None)
        if followed is None:
            return store.upload_file(key, path).complete()
        if followed.key != key:
            if followed.upload is not None:
                followed.upload.abort()
            raise ValueError(f"{path.name} was uploaded to {followed.key}, not {key}")
        followed.start()
        assert followed.upload is not None
        return followed.upload.complete()

    def close(self) -> None:
        """Abort every upload not completed."""
        files, self._files = self._files, {}
        for followed in files.values():
            if followed.upload is not None:
                followed.upload.abort()

    def __enter__(self) -> EarlyUploads:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
