"""Where a Dask release's partitions wait for the cluster's tasks (docs/scaling.md, "The
data"): the parsed dataset as Parquet partitions of ``DPRELEASE_DASK_ROW_GROUP_ROWS`` rows, one
row group each, written by the driver (the release's job) one partition at a time, so its
memory holds the parsed dataset and one partition's copy, never a second whole dataset.

- ``StoreStaging``: objects in the service's object store under the release's own prefix
  (``keys.staging_prefix``: the uploads' bucket, client and credentials; never served), one
  folder per job, read by the tasks through the S3 protocol with the store's endpoint and
  credentials that each partition carries (``dask_release.S3Access``): a remote cluster
  needs no shared filesystem. With the embedded mode's local store, the tasks read its files.
- ``ScratchStaging``: files in the job's scratch directory, for the job's own LocalCluster (or
  a remote cluster that mounts ``DPRELEASE_SCRATCH_DIR`` at the same path).

``staging_for`` is the one place that reads ``DPRELEASE_DASK_STAGING``.

Removal, however the job ends: ``worker.engines`` clears the staging when the Dask rows end
(exhausted, failed, or closed by the writer on a failure or a cancel). A job's staged folder is
also named in a record in its scratch directory before the first object is stored, so the
objects of a job whose process was killed go with its scratch directory at the next start
(``scratch.clean_stale``'s ``before_remove``: ``remove_recorded``). And the release's whole
staging prefix is deleted once the release is settled (``discard``), which also removes what a
job could not delete (the store did not answer) or a killed job on another host left.

This module imports no Dask, pyarrow or torch at import time: the processes that only clean up
(an API running jobs in-process at its start, a Celery worker at ``worker_ready``) import it.
"""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from service.releases import keys
from service.storage import ObjectStore

if TYPE_CHECKING:
    from worker.dask_release import Columns, Part, S3Access

log = logging.getLogger(__name__)

# In the job's scratch folder: the store folder its partitions are staged in.
RECORD = "object-staging"
# What a record may name (anything else in one is left alone): one job's staging folder.
_FOLDER = re.compile(r"releases/[A-Za-z0-9_-]+/staging/[A-Za-z0-9_-]+/")
# The driver's copy of the partition on its way to the store.
_OUTGOING = "outgoing.parquet"


class Staging(Protocol):
    def stage(self, X: np.ndarray, labels: np.ndarray, columns: Columns, rows: int) -> list[Part]:
        """Write the rows ``X`` (float64) and ``labels`` (class indices) as partitions of at
        most ``rows`` rows, in order; return them."""
        ...

    def clear(self) -> None:
        """Remove what ``stage`` wrote (idempotent; best effort: never raises)."""
        ...


def staging_for(
    settings: Any, store: ObjectStore, release_id: str, attempt: int, scratch: Path
) -> Staging:
    """The staging of one job under ``DPRELEASE_DASK_STAGING`` (``auto``: the object store when
    the cluster is a remote one, ``dask_scheduler``, else the job's scratch directory).
    ``scratch``: a folder of the job's scratch directory."""
    mode = settings.dask_staging
    if mode == "auto":
        mode = "store" if settings.dask_scheduler else "scratch"
    if mode == "scratch":
        return ScratchStaging(scratch)
    # One folder per job: a job never deletes another attempt's partitions while it reads them
    # (an old attempt may still run beside the one the sweeper handed the release to).
    folder = f"{keys.staging_prefix(release_id)}{attempt}-{secrets.token_hex(6)}/"
    return StoreStaging(store, folder, access_of(settings), settings.s3_bucket, scratch)


def access_of(settings: Any) -> S3Access | None:
    """The S3 endpoint and credentials of the service's store, for the tasks; None for the
    embedded mode's local store."""
    from worker.dask_release import S3Access

    if not settings.uses_s3:
        return None
    secret = settings.s3_secret_access_key
    return S3Access(
        endpoint_url=settings.s3_endpoint_url,
        region=settings.s3_region,
        access_key=settings.s3_access_key_id,
        secret_key=secret.get_secret_value() if secret is not None else None,
    )


def _ranges(n: int, rows: int) -> list[tuple[int, int]]:
    return [(start, min(n, start + rows)) for start in range(0, n, rows)]


@dataclass
class ScratchStaging:
    """Partitions as files of ``folder`` (in the job's scratch directory)."""

    folder: Path

    def stage(self, X: np.ndarray, labels: np.ndarray, columns: Columns, rows: int) -> list[Part]:
        from worker.dask_release import Part, write_partition

        self.folder.mkdir(parents=True, exist_ok=True)
        parts = []
        for index, (start, end) in enumerate(_ranges(len(X), rows)):
            path = self.folder / f"part-{index:05d}.parquet"
            write_partition(path, X[start:end], labels[start:end], columns.features, columns.label)
            parts.append(Part(str(path), 0, end - start))
        return parts

    def clear(self) -> None:
        for path in self.folder.glob("part-*.parquet"):
            path.unlink(missing_ok=True)


@dataclass
class StoreStaging:
    """Partitions as objects of the folder ``folder`` of the service's store; ``access`` and
    ``bucket``: how the tasks reach them (None: the local store's files). ``scratch``: the
    driver's folder for the record and each partition on its way to the store."""

    store: ObjectStore
    folder: str
    access: S3Access | None
    bucket: str | None
    scratch: Path

    def stage(self, X: np.ndarray, labels: np.ndarray, columns: Columns, rows: int) -> list[Part]:
        from worker.dask_release import write_partition

        self.scratch.mkdir(parents=True, exist_ok=True)
        # Named before anything is stored: a killed job's objects are found at the next start.
        (self.scratch / RECORD).write_text(self.folder)
        outgoing = self.scratch / _OUTGOING
        parts = []
        for index, (start, end) in enumerate(_ranges(len(X), rows)):
            key = keys.staging_part(self.folder, index)
            write_partition(
                outgoing, X[start:end], labels[start:end], columns.features, columns.label
            )
            try:
                self.store.put_file(key, outgoing)
            finally:
                outgoing.unlink(missing_ok=True)
            parts.append(self._part(key, end - start))
        return parts

    def _part(self, key: str, rows: int) -> Part:
        from worker.dask_release import Part

        local = self.store.local_path(key)
        if local is not None:
            return Part(str(local), 0, rows)
        return Part(f"{self.bucket}/{key}", 0, rows, self.access)

    def clear(self) -> None:
        try:
            removed = self.store.delete_prefix(self.folder)
        except Exception:
            # The release's settlement deletes its whole staging prefix again (``discard``).
            log.warning("could not delete the staged partitions %s", self.folder, exc_info=True)
            return
        (self.scratch / RECORD).unlink(missing_ok=True)
        log.debug("deleted %d staged partition(s) of %s", removed, self.folder)


def remove_recorded(store: Callable[[], ObjectStore]) -> Callable[[Path], None]:
    """``scratch.clean_stale``'s ``before_remove``: delete the objects a dead job staged, as
    its scratch directory's record names them (the store is built only when one is found). A
    failure raises, so the directory, and with it the record, is kept for the next start."""

    def remove(job_dir: Path) -> None:
        for record in job_dir.rglob(RECORD):
            folder = record.read_text().strip()
            if not _FOLDER.fullmatch(folder):
                log.warning("scratch record %s names no staging folder; ignored", record)
                continue
            removed = store().delete_prefix(folder)
            log.info("deleted %d partition(s) a dead job staged in %s", removed, folder)

    return remove


def discard(store: ObjectStore, release_id: str) -> None:
    """Delete every partition staged for the release (settled: published, failed or
    cancelled). Best effort, as for shard parts: staged objects are never served."""
    try:
        removed = store.delete_prefix(keys.staging_prefix(release_id))
    except Exception:
        log.warning("release %s: could not delete its staged partitions", release_id)
        return
    if removed:
        log.info("release %s: deleted %d staged partition(s) left behind", release_id, removed)
