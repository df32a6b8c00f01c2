"""Log lines (issue 35, item 8): every line one JSON object; third-party warnings are debug
output, and at most one of a kind per window. On main 56 tabular releases printed ~200 lines
of absl's "failed to converge"; now a process logging at INFO prints none, one at DEBUG one
per window, the next stating how many it left out."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
from absl import logging as absl_logging

from service import logs


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logs.JsonFormatter())
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def lines() -> Iterator[_Lines]:
    handler = _Lines()
    root = logging.getLogger()
    before = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(before)


def _converge_warning() -> None:
    absl_logging.warning("_compute_log_a_frac failed to converge after %d iterations", 1000)


def test_third_party_warnings_are_not_written_at_info(lines: _Lines) -> None:
    lines.addFilter(logs.ThirdParty(logging.INFO))
    for _ in range(56):
        _converge_warning()
    logging.getLogger("service.releases").warning("our own warning")
    assert [json.loads(line)["message"] for line in lines.lines] == ["our own warning"]


def test_third_party_warnings_at_debug_once_a_window(lines: _Lines) -> None:
    clock = _Clock()
    lines.addFilter(logs.ThirdParty(logging.DEBUG, window=60.0, clock=clock))
    for _ in range(56):
        _converge_warning()
        clock.now += 1.0
    written = [json.loads(line) for line in lines.lines]
    assert len(written) == 1 and written[0]["level"] == "DEBUG"
    assert written[0]["logger"] == "absl" and "suppressed" not in written[0]
    clock.now += 60.0
    _converge_warning()
    last = json.loads(lines.lines[-1])
    assert len(lines.lines) == 2 and last["suppressed"] == 55


def test_third_party_errors_are_kept_rate_limited(lines: _Lines) -> None:
    lines.addFilter(logs.ThirdParty(logging.INFO, clock=_Clock()))
    for _ in range(3):
        logging.getLogger("botocore").error("could not connect")
    assert len(lines.lines) == 1 and json.loads(lines.lines[0])["level"] == "ERROR"


def test_every_line_is_one_json_object(lines: _Lines) -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("worker.runner").exception("release %s: job crashed", "r1")
    (line,) = lines.lines
    record = json.loads(line)
    assert record["message"] == "release r1: job crashed" and record["level"] == "ERROR"
    assert "ValueError: boom" in record["exception"] and "\n" not in line
    assert set(record) == {"time", "level", "logger", "message", "exception"}


def test_configure_gives_the_root_a_json_handler_before_any_library_does(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Without a root handler absl's first warning would install a plain one
    (``logging.basicConfig``), without the filters; ``configure`` installs its own first."""
    root = logging.getLogger()
    saved, level = root.handlers[:], root.level
    root.handlers.clear()
    try:
        logs.configure("info")
        (handler,) = root.handlers
        assert isinstance(handler, logs.Stderr)
        for _ in range(56):
            _converge_warning()
        logging.getLogger("service.app").warning("started")
        err = capsys.readouterr().err.strip().splitlines()
        assert [json.loads(line)["message"] for line in err] == ["started"]
    finally:
        root.handlers[:] = saved
        root.setLevel(level)
        logging.captureWarnings(False)
