"""What a process needs to serve requests or run jobs, built once from the settings."""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.db import make_engine, make_session_factory
from service.storage import ObjectStore, make_store

log = logging.getLogger(__name__)


class Dispatcher(Protocol):
    def enqueue(self, release_id: str) -> None: ...
    def shutdown(self) -> None: ...


@dataclass
class Runtime:
    settings: Settings
    engine: Engine
    session_factory: sessionmaker[Session]
    store: ObjectStore
    dispatcher: Dispatcher = field(init=False)


class CeleryDispatcher:
    def enqueue(self, release_id: str) -> None:
        from worker.celery_app import RUN_RELEASE, celery_app

        celery_app.send_task(RUN_RELEASE, args=[release_id])

    def shutdown(self) -> None:
        pass


class InProcessDispatcher:
    """Embedded mode: the same task code, run on one background thread of this process."""

    def __init__(self, run: Callable[[str], None]) -> None:
        self._run = run
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dprelease-job")

    def enqueue(self, release_id: str) -> None:
        self._pool.submit(self._safe_run, release_id)

    def _safe_run(self, release_id: str) -> None:
        try:
            self._run(release_id)
        except Exception:  # the job records its own failure; never kill the thread
            log.exception("release %s: job crashed", release_id)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def build_runtime(settings: Settings, *, in_process_jobs: bool | None = None) -> Runtime:
    if settings.embedded:
        settings.home.mkdir(parents=True, exist_ok=True)
    engine = make_engine(settings.effective_database_url)
    runtime = Runtime(
        settings=settings,
        engine=engine,
        session_factory=make_session_factory(engine),
        store=make_store(settings),
    )
    if in_process_jobs is None:
        in_process_jobs = settings.celery_broker_url is None
    if in_process_jobs:
        from worker.runner import run_release

        runtime.dispatcher = InProcessDispatcher(lambda rid: run_release(runtime, rid))
    else:
        runtime.dispatcher = CeleryDispatcher()
    return runtime
