"""Jobs' scratch directories: one per job, removed when the job ends however it ends, and
those of dead processes removed at the next start.

A job writes its release files under ``dprelease-<pid>-<random>/`` in the scratch root
(``DPRELEASE_SCRATCH_DIR``, else the system's temporary directory) and holds an exclusive
``flock`` on the directory's ``.lock`` for as long as it runs. The directory is made and locked
under a name ``clean_stale`` passes over (``.making-…``) and only then renamed into view, so no
live job's directory is ever seen unlocked, however the start of a job and another process's
clean-up interleave. The kernel drops the lock when
the process dies, however it dies (SIGKILL, OOM), so ``clean_stale`` can tell a dead job's
directory (its lock can be taken) from a live one's, in this process or another, whatever the
pid in the name has become since (the pid is only there for people reading ``ls``). What a dead
job left outside its directory (a Dask release's partitions staged in the object store, named
in its directory: ``worker.staging``) goes first, through ``clean_stale``'s ``before_remove``.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

log = logging.getLogger(__name__)

PREFIX = "dprelease-"
MAKING = ".making-"
LOCK = ".lock"
# A directory with no lock file was made by a version before locks (or is being made now):
# removed only once this old, longer than any job runs.
UNLOCKED_AFTER_S = 24 * 3600.0


def root_of(configured: Path | None) -> Path:
    return Path(configured) if configured is not None else Path(tempfile.gettempdir())


@contextlib.contextmanager
def job_dir(configured: Path | None) -> Iterator[Path]:
    """A fresh scratch directory for one job, locked while the job runs and removed after it
    (success, failure, interruption)."""
    root = root_of(configured)
    root.mkdir(parents=True, exist_ok=True)
    making = Path(tempfile.mkdtemp(prefix=f"{MAKING}{PREFIX}{os.getpid()}-", dir=root))
    fd = os.open(making / LOCK, os.O_CREAT | os.O_RDWR, 0o600)
    path = making
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        path = _into_view(making)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        os.close(fd)


def _into_view(making: Path) -> Path:
    """``making``, locked, renamed to its ``dprelease-`` name. rename(2) moves a directory
    atomically and never onto a non-empty one (every job's holds its lock file), so a name
    another job took meanwhile is an error: then another suffix is tried."""
    name = making.name.removeprefix(MAKING)
    for attempt in range(100):
        path = making.with_name(name if attempt == 0 else f"{name}-{attempt}")
        try:
            making.rename(path)
        except OSError:
            if path.exists():
                continue
            raise
        return path
    raise FileExistsError(f"no free name for the scratch directory {making}")


def clean_stale(
    configured: Path | None, *, before_remove: Callable[[Path], None] | None = None
) -> list[Path]:
    """Remove the scratch directories of jobs whose process died; return them. A live job's
    directory (its lock held) is left alone. ``before_remove`` is called with each dead job's
    directory before it goes; when it raises, the directory is kept for the next start."""
    root = root_of(configured)
    removed: list[Path] = []
    try:
        entries = list(root.iterdir())
    except OSError:
        return removed
    for entry in entries:
        making = entry.name.startswith(MAKING + PREFIX)
        if not (making or entry.name.startswith(PREFIX)) or entry.is_symlink():
            continue
        if not entry.is_dir():
            continue
        try:
            if _remove_if_dead(entry, before_remove, making=making):
                removed.append(entry)
        except OSError as exc:  # another user's directory, or removed meanwhile
            log.debug("scratch %s left: %s", entry, exc)
    for path in removed:
        log.info("removed the scratch directory of a dead job: %s", path)
    return removed


def _remove_if_dead(
    path: Path, before_remove: Callable[[Path], None] | None, *, making: bool
) -> bool:
    lock = path / LOCK
    # A directory being made is unlocked for a moment: left until it is older than any
    # job runs (its maker died between mkdtemp and the rename).
    if making or not lock.exists():
        if time.time() - path.stat().st_mtime < UNLOCKED_AFTER_S:
            return False
        return _remove(path, before_remove)
    fd = os.open(lock, os.O_RDWR)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # a live job holds it
        return _remove(path, before_remove)
    finally:
        os.close(fd)


def _remove(path: Path, before_remove: Callable[[Path], None] | None) -> bool:
    if before_remove is not None:
        try:
            before_remove(path)
        except Exception:
            log.warning("scratch %s kept: its cleanup failed", path, exc_info=True)
            return False
    shutil.rmtree(path)
    return True
