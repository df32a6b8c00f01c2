"""The worker's progress reporting (worker.runner.Progress) with a fake clock and database:
throttled writes, the generator's own units and phase, and a cancel noticed at the next write."""

from __future__ import annotations

import pytest

from dpcore.mechanisms.spec import Cancelled
from worker.runner import PROGRESS_EVERY_S, UPLOAD_SHARE, Progress


class Fake:
    def __init__(self) -> None:
        self.now = 100.0
        self.writes: list[tuple[float, str | None]] = []
        self.running = True

    def write(self, fraction: float, phase: str | None) -> bool:
        self.writes.append((fraction, phase))
        return self.running

    def progress(self) -> Progress:
        return Progress(self.write, release_id="r", clock=lambda: self.now)


def test_writes_at_most_every_interval_the_first_at_once() -> None:
    fake = Fake()
    progress = fake.progress()
    for done in range(10):  # a burst within one interval: one write
        progress.report(done, 100, "rows")
    assert fake.writes == [(0.0, "rows")]
    fake.now += PROGRESS_EVERY_S / 2
    progress.report(50, 100, "rows")
    assert len(fake.writes) == 1
    fake.now += PROGRESS_EVERY_S / 2
    progress.report(60, 100, "rows")
    assert fake.writes[-1] == (pytest.approx(0.6 * (1 - UPLOAD_SHARE)), "rows")
    assert len(fake.writes) == 2


def test_own_units_and_phase_and_ticks_between_chunks() -> None:
    fake = Fake()
    progress = fake.progress()
    progress.report(3, 12, "epochs")
    assert fake.writes == [(pytest.approx(0.25 * (1 - UPLOAD_SHARE)), "epochs")]
    # A tick (between chunks) writes the generator's latest figures once the interval passed.
    progress.done = 6.0
    progress.tick()
    assert len(fake.writes) == 1
    fake.now += PROGRESS_EVERY_S
    progress.tick()
    assert fake.writes[-1] == (pytest.approx(0.5 * (1 - UPLOAD_SHARE)), "epochs")


@pytest.mark.parametrize(
    ("done", "total", "fraction"),
    [(5, 0, 0.0), (float("nan"), 10, 0.0), (-1, 10, 0.0), (20, 10, 1 - UPLOAD_SHARE)],
)
def test_odd_figures_stay_in_range(done: float, total: float, fraction: float) -> None:
    fake = Fake()
    fake.progress().report(done, total, "x")
    assert fake.writes == [(fraction, "x")]


def test_a_release_no_longer_running_raises_cancelled_at_the_next_write() -> None:
    fake = Fake()
    progress = fake.progress()
    progress.report(1, 10, "rows")
    fake.running = False  # cancelled meanwhile
    progress.report(2, 10, "rows")  # within the interval: not noticed yet, nothing written
    assert len(fake.writes) == 1
    fake.now += PROGRESS_EVERY_S
    with pytest.raises(Cancelled, match="release r is no longer running"):
        progress.tick()
