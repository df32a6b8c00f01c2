"""Scratch directories: another process's clean-up, however it interleaves with the start of
a job, never removes a live job's directory (the test suite's parallel workers share /tmp and
each embedded start cleans it)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from worker import scratch


def test_a_cleanup_while_a_job_makes_its_directory_leaves_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The clean-up runs at the worst moment: the job's lock file exists and is not locked yet
    (between its open and its flock). The directory survives and the job writes into it."""
    real_flock = scratch.fcntl.flock
    seen: list[list[Path]] = []

    def flock_after_a_cleanup(fd: int, operation: int) -> Any:
        if operation == scratch.fcntl.LOCK_EX and not seen:  # the job's own, blocking lock
            seen.append(scratch.clean_stale(tmp_path))
        return real_flock(fd, operation)

    monkeypatch.setattr(scratch.fcntl, "flock", flock_after_a_cleanup)
    with scratch.job_dir(tmp_path) as path:
        assert seen == [[]]
        assert path.is_dir() and path.name.startswith(f"{scratch.PREFIX}{os.getpid()}-")
        (path / "release.npz").write_bytes(b"x")
        assert scratch.clean_stale(tmp_path) == []  # locked now, under its visible name
    assert list(tmp_path.iterdir()) == []


def test_a_directory_whose_maker_died_goes_once_it_is_old(tmp_path: Path) -> None:
    making = tmp_path / f"{scratch.MAKING}{scratch.PREFIX}999999-dead"
    making.mkdir()
    (making / scratch.LOCK).touch()
    assert scratch.clean_stale(tmp_path) == []  # young: its maker may be about to lock it
    old = time.time() - scratch.UNLOCKED_AFTER_S - 60
    os.utime(making, (old, old))
    assert scratch.clean_stale(tmp_path) == [making]
    assert not making.exists()


def test_a_taken_name_gets_another(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dead job of an earlier process with the same pid left the visible name."""
    monkeypatch.setattr(scratch.tempfile, "mkdtemp", lambda prefix, dir: _made(dir, prefix))
    taken = tmp_path / f"{scratch.PREFIX}{os.getpid()}-fixed"
    taken.mkdir()
    (taken / scratch.LOCK).touch()
    with scratch.job_dir(tmp_path) as path:
        assert path == tmp_path / f"{scratch.PREFIX}{os.getpid()}-fixed-1"
    assert taken.is_dir()


def _made(root: str, prefix: str) -> str:
    path = Path(root) / f"{prefix}fixed"
    path.mkdir()
    return str(path)
