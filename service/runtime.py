"""What a process needs to serve requests or run jobs, built once from the settings.

How jobs are handed over (the dispatcher) is not chosen here: the composition roots
(``service.run`` for the API server, ``worker.celery_app`` for workers) pass a factory built
by ``worker.dispatch``, so that ``service`` never imports ``worker``.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, NamedTuple, Protocol

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from dpcore.mechanisms.spec import WorkerQueue
from service import owner_only
from service.config import Settings
from service.db import make_engine, make_session_factory
from service.storage import ObjectStore, make_store

log = logging.getLogger(__name__)


# A job's lane within its worker pool: "long" when its declared work passes
# ``Settings.long_job_work`` (``service.releases.mechanisms.route``), so that workers reading
# only the short lane's queue are never taken by a long job.
Lane = Literal["short", "long"]


class Route(NamedTuple):
    """Where a release's job waits: the worker pool of its mechanism (``Execution.queue``)
    and its lane in that pool. The Celery dispatcher names one queue per pool and lane."""

    pool: WorkerQueue
    lane: Lane = "short"


class Dispatcher(Protocol):
    """Hands a release's job over to be run. ``route`` is the release's worker pool and lane
    (``Route``); a dispatcher with a single pool (in-process) ignores it. Called after the
    release's row is committed; nothing may depend on it succeeding."""

    def enqueue(self, release_id: str, route: Route) -> None: ...
    def shutdown(self) -> None: ...


@dataclass
class Runtime:
    settings: Settings
    engine: Engine
    session_factory: sessionmaker[Session]
    store: ObjectStore
    dispatcher: Dispatcher = field(init=False)
    # Set when this process shuts down: a running job stops at its next chunk and leaves its
    # release queued for redelivery (worker.runner).
    stopping: threading.Event = field(default_factory=threading.Event)


# Builds the dispatcher of a runtime (an in-process one needs the runtime to run jobs with).
DispatcherFactory = Callable[[Runtime], Dispatcher]


class InProcessDispatcher:
    """Embedded mode: the same task code, run on ``workers`` background threads of this
    process (every job, whatever its mechanism's queue), taken from per-owner queues in turn:
    the next job goes to the owner with the fewest jobs running, the one served longest ago
    first on a tie, so one owner's backlog does not hold up another owner's release. No owner
    runs more than ``per_owner`` jobs at once (default: all threads but one), so one owner's
    long jobs leave a thread for another owner's release even when they arrived first.

    ``owner_of(release_id)`` names a job's owner (read once, at enqueue). ``shutdown`` sets
    ``stopping``: a running job stops at its next chunk and leaves its release queued (the
    next start resumes it, ``service.app``); jobs not yet started are dropped (still queued)."""

    def __init__(
        self,
        run: Callable[[str], None],
        *,
        owner_of: Callable[[str], str] = lambda release_id: "",
        workers: int = 1,
        per_owner: int | None = None,
        stopping: threading.Event | None = None,
    ) -> None:
        self._run = run
        self._owner_of = owner_of
        self._per_owner = max(1, per_owner if per_owner is not None else workers - 1)
        self.stopping = stopping or threading.Event()
        self._lock = threading.Condition()
        self._pending: dict[str, deque[str]] = {}  # owner → release ids, oldest first
        self._queued: set[str] = set()  # a release handed over twice waits once
        self._running: Counter[str] = Counter()
        self._served: dict[str, int] = {}  # owner → turn of its latest start
        self._turn = 0
        self._closed = False
        self._threads = [
            threading.Thread(target=self._work, name=f"dprelease-job-{i}", daemon=True)
            for i in range(workers)
        ]
        for thread in self._threads:
            thread.start()

    def enqueue(self, release_id: str, route: Route) -> None:
        try:
            owner = self._owner_of(release_id)
        except Exception:  # nothing may depend on the hand-over: unknown owners share a turn
            log.exception("release %s: owner unknown", release_id)
            owner = ""
        with self._lock:
            if self._closed or release_id in self._queued:
                return
            self._queued.add(release_id)
            self._pending.setdefault(owner, deque()).append(release_id)
            self._lock.notify()

    def _ready(self) -> list[str]:
        """Owners with a job waiting and fewer than ``per_owner`` running."""
        return [o for o in self._pending if self._running[o] < self._per_owner]

    def _next(self) -> tuple[str, str] | None:
        with self._lock:
            while not self._ready() and not self._closed:
                self._lock.wait()
            if self._closed:
                return None
            owner = min(self._ready(), key=lambda o: (self._running[o], self._served.get(o, -1)))
            waiting = self._pending[owner]
            release_id = waiting.popleft()
            if not waiting:
                del self._pending[owner]
            self._queued.discard(release_id)
            self._running[owner] += 1
            self._turn += 1
            self._served[owner] = self._turn
            return owner, release_id

    def _work(self) -> None:
        while (item := self._next()) is not None:
            owner, release_id = item
            # A unit per job: a research release's job marks it, silencing its log records
            # (``service.owner_only``).
            try:
                with owner_only.unit():
                    try:
                        self._run(release_id)
                    except Exception as exc:  # the job records its own failure
                        # Never kill the thread; log where, not what (owner_only.failure).
                        log.error(
                            "release %s: job crashed: %s", release_id, owner_only.failure(exc)
                        )
            finally:
                with self._lock:
                    self._running[owner] -= 1
                    # The owner may be under its limit again: a waiting thread may take it.
                    self._lock.notify_all()

    def shutdown(self) -> None:
        self.stopping.set()
        with self._lock:
            self._closed = True
            self._pending.clear()
            self._queued.clear()
            self._lock.notify_all()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join()


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
