"""Peak resident memory of this process or of another one (Linux ``/proc``), for the suite.

``PeakRss`` samples ``VmRSS`` in a thread while a block runs (``with PeakRss() as peak: ...``;
then ``peak.peak_mib`` and ``peak.delta_mib``, the rise over the RSS at entry). ``vm_hwm_mib``
reads a process's own high-water mark (``VmHWM``: its peak over its whole life), what a server
or worker subprocess reached, to be read just before it is stopped.
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from types import TracebackType


def _status_kib(pid: int | str, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise KeyError(field)


def rss_mib(pid: int | str = "self") -> float:
    return _status_kib(pid, "VmRSS") / 1024


def vm_hwm_mib(pid: int | str = "self") -> float:
    """The process's peak RSS so far (MiB); 0.0 when it cannot be read (gone, not Linux)."""
    try:
        return _status_kib(pid, "VmHWM") / 1024
    except (OSError, KeyError, ValueError):
        return 0.0


def children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (from /proc/PID/task/*/children), best effort."""
    found: list[int] = []
    stack = [pid]
    while stack:
        parent = stack.pop()
        try:
            tasks = list(Path(f"/proc/{parent}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
            found.extend(kids)
            stack.extend(kids)
    return found


def tree_hwm_mib(pid: int) -> dict[str, float]:
    """``VmHWM`` of ``pid`` and of each live descendant, by pid (MiB)."""
    return {str(p): round(vm_hwm_mib(p), 1) for p in [pid, *children(pid)]}


class PeakRss:
    """The peak ``VmRSS`` of ``pid`` (this process by default) while the block runs, sampled
    every ``interval`` seconds (a short spike between two samples can be missed)."""

    def __init__(self, pid: int | str = "self", interval: float = 0.01) -> None:
        self.pid = pid
        self.interval = interval
        self.start_mib = 0.0
        self.peak_mib = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.peak_mib = max(self.peak_mib, rss_mib(self.pid))
            except (OSError, KeyError, ValueError):
                return

    def __enter__(self) -> PeakRss:
        self.start_mib = self.peak_mib = rss_mib(self.pid)
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with contextlib.suppress(OSError, KeyError, ValueError):
            self.peak_mib = max(self.peak_mib, rss_mib(self.pid))

    @property
    def delta_mib(self) -> float:
        return self.peak_mib - self.start_mib

    def to_json(self) -> dict[str, float]:
        return {"peak_rss_mib": round(self.peak_mib, 1), "rss_rise_mib": round(self.delta_mib, 1)}


__all__ = ["PeakRss", "children", "rss_mib", "tree_hwm_mib", "vm_hwm_mib"]
