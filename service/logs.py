"""The processes' log lines: one JSON object each, and third-party chatter kept out.

``configure`` (the API at start-up, a Celery worker once its logging is set up) gives the root
logger a handler of its own, so that a library's first warning finds one instead of adding a
plain one (absl calls ``logging.basicConfig``; without any handler, ``logging.lastResort``
prints the bare message), formats every handler of the loggers the service writes through
(``owner_only.LOGGERS``) as JSON (``JsonFormatter``), and filters third-party records
(``ThirdParty``): below ERROR they are debug output, shown only when the process logs at
DEBUG, and any one kind of them (logger and message template) at most once a window, the next
one stating how many were left out. A library's warning can repeat for every release (the
accountants' "failed to converge"); once a window is what an operator needs to see it.
Python warnings (``warnings.warn``: jax, scikit-learn) are routed to logging
(``py.warnings``) and treated the same. The owner-only filter stays on every handler.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from service import owner_only

# Loggers whose records are the service's own (or its servers'): never demoted.
OWN = ("service", "worker", "dpcore", "dprelease_cli", "dprelease_client", "uvicorn", "celery")
# How long one kind of third-party record stays quiet after it was written.
WINDOW_S = 60.0


class Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """The root handler ``configure`` adds: writes to whatever ``sys.stderr`` is when it
    writes (a harness that swaps it does not leave the handler on a closed stream)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time (UTC, ISO 8601), level, logger, message, and the
    exception's traceback when there is one; ``suppressed``: how many records of the same
    kind ``ThirdParty`` left out before this one."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        suppressed = getattr(record, "suppressed", None)
        if suppressed:
            line["suppressed"] = suppressed
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def own(name: str) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in OWN)


class ThirdParty(logging.Filter):
    """Third-party records: below ERROR, written only at ``level`` DEBUG (as DEBUG); and at
    most one of each kind (logger, message template) per ``window`` seconds."""

    def __init__(
        self,
        level: int = logging.INFO,
        window: float = WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.level, self.window, self.clock = level, window, clock
        self._lock = threading.Lock()
        self._last: dict[tuple[str, str], float] = {}
        self._left_out: dict[tuple[str, str], int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if own(record.name):
            return True
        if record.levelno < logging.ERROR:
            if self.level > logging.DEBUG:
                return False
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        key = (record.name, str(record.msg))
        now = self.clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.window:
                self._left_out[key] = self._left_out.get(key, 0) + 1
                return False
            self._last[key] = now
            record.suppressed = self._left_out.pop(key, 0)
        return True


def _level(level: str | int) -> int:
    if isinstance(level, int):
        return level
    return logging.getLevelNamesMapping().get(level.upper(), logging.INFO)


def structure(handler: logging.Handler, level: int) -> None:
    """JSON lines and the third-party filter on ``handler`` (idempotent)."""
    handler.setFormatter(JsonFormatter())
    if not any(isinstance(f, ThirdParty) for f in handler.filters):
        handler.addFilter(ThirdParty(level))


def configure(level: str | int = "info") -> None:
    """Structure this process's logs (module docstring); idempotent."""
    number = _level(level)
    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(Stderr())
    root.setLevel(number)
    logging.captureWarnings(True)
    for name in owner_only.LOGGERS:
        for handler in logging.getLogger(name).handlers:
            # Handlers of the servers' own configuration (uvicorn's, Celery's) and ours;
            # never another's (a test harness's capture keeps its own format).
            if type(handler) in (logging.StreamHandler, Stderr):
                structure(handler, number)
    owner_only.install()


def uvicorn_config(level: str | int = "info") -> dict[str, Any]:
    """uvicorn's ``log_config``: its loggers write JSON lines from its first line on."""
    formatter = {"()": f"{__name__}.JsonFormatter"}
    handler = {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"}
    name = logging.getLevelName(_level(level))
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": formatter},
        "handlers": {"default": handler},
        "loggers": {
            "uvicorn": {"handlers": ["default"], "level": name, "propagate": False},
            "uvicorn.error": {"level": name},
            "uvicorn.access": {"handlers": ["default"], "level": name, "propagate": False},
        },
    }
