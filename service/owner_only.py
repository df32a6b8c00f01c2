"""Owner-only units of work: requests and jobs whose operational traces (request timings,
statuses, log records) only the dataset's owner may see.

A research release (``service.releases.research``) is shown to its dataset's owner alone,
and some requests answer from private data (an upload's size, an admission check reading
class counts). The operator's channels (``/metrics`` and the process logs) would otherwise
tell admins that such a thing exists, when, how long it ran and how it ended. So every
request (``service.meta.metrics.RequestMetrics``) and every job (the Celery task signals in
``worker.celery_app``, the embedded job threads in ``service.runtime``) runs in a *unit*; the
code that touches a research release, or a route whose outcome reads private data, marks its
unit owner-only, and then:

- the request is not observed by the request-duration histogram (``service.meta.metrics``);
- no log record emitted while the unit runs passes a handler carrying ``OwnerOnlyFilter``
  (``install`` puts it on every handler of the root, uvicorn and Celery loggers), the access
  log line of the request included (uvicorn writes it while the response starts, inside the
  unit).

A unit is a mutable flag held by a context variable: a sync endpoint runs in a worker thread
with a *copy* of the request's context, which still refers to the same flag, so marking it
there is seen by the middleware and by the access log. Outside any unit (a script, a test
calling the service directly) ``mark`` does nothing: a unit is never left marked behind.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Unit:
    owner_only: bool = False


_UNIT: ContextVar[Unit | None] = ContextVar("dprelease_owner_only_unit", default=None)

# Loggers whose handlers get the filter: the root (the service's and worker's own loggers
# propagate to it), uvicorn's (its access log does not propagate) and Celery's.
LOGGERS = ("", "uvicorn", "uvicorn.access", "uvicorn.error", "celery", "celery.app.trace")


@contextmanager
def unit() -> Iterator[Unit]:
    """Run a request or a job in a fresh unit (not owner-only until marked)."""
    current = Unit()
    token = _UNIT.set(current)
    try:
        yield current
    finally:
        _UNIT.reset(token)


def enter() -> object:
    """Open a unit without a ``with`` block (a Celery task's prerun signal); ``leave`` closes
    it with the returned token."""
    return _UNIT.set(Unit())


def leave(token: object) -> None:
    _UNIT.reset(token)  # type: ignore[arg-type]


def mark(owner_only: bool = True) -> None:
    """Mark the current unit owner-only (when ``owner_only``); a unit stays marked."""
    current = _UNIT.get()
    if owner_only and current is not None:
        current.owner_only = True


def active() -> bool:
    """Whether the current unit is owner-only."""
    current = _UNIT.get()
    return current is not None and current.owner_only


class OwnerOnlyFilter(logging.Filter):
    """Drops every record emitted inside an owner-only unit: its message may name a research
    release, its parameters or size, and its very time stamp is a timing of the owner's work.
    (An error of a research job is stored on the release, which its owner reads.)"""

    def filter(self, record: logging.LogRecord) -> bool:
        return not active()


FILTER = OwnerOnlyFilter()


def install_on(handlers: Iterable[logging.Handler]) -> None:
    for handler in handlers:
        if not any(isinstance(f, OwnerOnlyFilter) for f in handler.filters):
            handler.addFilter(FILTER)


def install(names: Iterable[str] = LOGGERS) -> None:
    """Put the filter on every handler the named loggers have now (idempotent). Called when
    the API starts and when a worker has set up its logging; a handler added later must be
    given it (``install_on``)."""
    for name in names:
        install_on(logging.getLogger(name).handlers)


def failure(exc: BaseException) -> str:
    """An exception as the operator's logs may carry it: its type and where it was raised (the
    innermost frames' files, lines and functions), never its message, which can quote what a
    job computed from private data — a value, a count, a shape (docs/privacy.md, "What leaves
    a job"). The message itself is stored on the release, which its owner reads."""
    frames = traceback.extract_tb(exc.__traceback__)[-6:]
    where = " < ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(frames))
    return f"{type(exc).__name__} at {where}" if where else type(exc).__name__
