"""A release job's progress: throttled writes through ``lifecycle.report_progress``, each of
which is also how a job notices it should stop (a cancel, another delivery, a shutdown)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from dpcore.mechanisms.spec import Cancelled
from service.db import transaction
from service.releases import lifecycle
from service.runtime import Runtime
from worker.attempts import Interrupted

# Progress writes (each also reads the status: how a cancel is noticed) at most this often.
PROGRESS_EVERY_S = 0.5
# The share of the progress bar left for storing the output once the rows are written.
UPLOAD_SHARE = 0.05
# The phase of a job whose progress the runner counts in rows (ReleaseOutput.progress "rows").
ROWS_PHASE = "rows"
# The share of the progress bar a sharded release's shards fill; assembling fills the rest.
SHARDS_SHARE = 0.8


class Progress:
    """A job's progress: the latest (done, total, phase) the job knows, written at most once
    every ``PROGRESS_EVERY_S`` (the first at once). Each write reads the release's status back
    (``lifecycle.report_progress``); once the release is no longer running (cancelled, or
    settled by another delivery) the next report raises ``Cancelled``, which stops the
    generator (its ``ctx.report``) or the runner's loop (between chunks) before any more noise
    is drawn or anything is stored.

    ``write(fraction, phase)`` returns whether the release is still running. Fractions keep
    ``UPLOAD_SHARE`` of the bar for storing the output."""

    def __init__(
        self,
        write: Callable[[float, str | None], bool],
        *,
        release_id: str,
        clock: Callable[[], float] = time.monotonic,
        stopping: Callable[[], bool] = lambda: False,
    ) -> None:
        self._write = write
        self._clock = clock
        self._stopping = stopping
        self._last: float | None = None
        self.release_id = release_id
        self.done, self.total = 0.0, 0.0
        self.phase: str | None = None

    @property
    def fraction(self) -> float:
        if not (self.total > 0 and math.isfinite(self.done / self.total)):
            return 0.0
        return (1 - UPLOAD_SHARE) * min(max(self.done / self.total, 0.0), 1.0)

    def report(self, done: float, total: float, phase: str) -> None:
        """``RunContext.report``: progress in the generator's own units."""
        self.done, self.total, self.phase = float(done), float(total), str(phase)
        self.tick()

    def tick(self) -> None:
        # Every chunk and every report, unthrottled: a shutdown stops the job here, between
        # chunks, before the upload claim (nothing of this attempt is stored).
        if self._stopping():
            raise Interrupted(f"release {self.release_id}: this process is shutting down")
        now = self._clock()
        if self._last is not None and now - self._last < PROGRESS_EVERY_S:
            return
        self._last = now
        if not self._write(self.fraction, self.phase):
            raise Cancelled(f"release {self.release_id} is no longer running")


def of_attempt(
    runtime: Runtime, release_id: str, attempt: int, scale: Callable[[float], float]
) -> Progress:
    """The progress of ``attempt``, its fraction mapped onto the bar by ``scale`` (the part of
    the bar this step fills), stopped by the process's shutdown."""
    return Progress(
        lambda fraction, phase: report(runtime, release_id, attempt, scale(fraction), phase),
        release_id=release_id,
        stopping=runtime.stopping.is_set,
    )


def report(
    runtime: Runtime, release_id: str, attempt: int, fraction: float, phase: str | None
) -> bool:
    # Fenced by the attempt: once the sweeper hands the release over again and a later attempt
    # starts, this one stops here (Cancelled) instead of computing beside it.
    with transaction(runtime.session_factory) as session:
        return lifecycle.report_progress(
            session, release_id, progress=fraction, phase=phase, attempt=attempt
        )
