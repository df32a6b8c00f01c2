"""What a process needs to serve requests or run jobs, built once from the settings.

How jobs are handed over (the dispatcher) is not chosen here: the composition roots
(``service.run`` for the API server, ``worker.celery_app`` for workers) pass a factory built
by ``worker.dispatch``, so that ``service`` never imports ``worker``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from dpcore.mechanisms.spec import WorkerQueue
from service.config import Settings
from service.db import make_engine, make_session_factory
from service.storage import ObjectStore, make_store

log = logging.getLogger(__name__)


class Dispatcher(Protocol):
    """Hands a release's job over to be run. ``queue`` is the worker pool of the release's
    mechanism (``MechanismSpec.queue``); a dispatcher with a single pool ignores it. Called
    after the release's row is committed; nothing may depend on it succeeding."""

    def enqueue(self, release_id: str, queue: WorkerQueue) -> None: ...
    def shutdown(self) -> None: ...


@dataclass
class Runtime:
    settings: Settings
    engine: Engine
    session_factory: sessionmaker[Session]
    store: ObjectStore
    dispatcher: Dispatcher = field(init=False)


# Builds the dispatcher of a runtime (an in-process one needs the runtime to run jobs with).
DispatcherFactory = Callable[[Runtime], Dispatcher]


class InProcessDispatcher:
    """Embedded mode: the same task code, run on one background thread of this process (every
    job, whatever its mechanism's queue)."""

    def __init__(self, run: Callable[[str], None]) -> None:
        self._run = run
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dprelease-job")

    def enqueue(self, release_id: str, queue: WorkerQueue) -> None:
        self._pool.submit(self._safe_run, release_id)

    def _safe_run(self, release_id: str) -> None:
        try:
            self._run(release_id)
        except Exception:  # the job records its own failure; never kill the thread
            log.exception("release %s: job crashed", release_id)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def build_runtime(settings: Settings, dispatcher: DispatcherFactory) -> Runtime:
    """The runtime of ``settings``, its dispatcher made by ``dispatcher(runtime)``."""
    if settings.embedded:
        settings.home.mkdir(parents=True, exist_ok=True)
    engine = make_engine(settings.effective_database_url)
    runtime = Runtime(
        settings=settings,
        engine=engine,
        session_factory=make_session_factory(engine),
        store=make_store(settings),
    )
    runtime.dispatcher = dispatcher(runtime)
    return runtime
