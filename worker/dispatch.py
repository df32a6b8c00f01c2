"""How a process hands release jobs over, chosen by the composition roots.

``default_dispatcher`` is the one place that decides: jobs run in-process (a background
thread of the API, the same runner code) when no Celery broker is configured, and go to the
Celery workers otherwise. ``service.run`` (the API server), ``worker.celery_app`` (workers) and
the tests pass it, or one of the two below, to ``service.runtime.build_runtime``.
"""

from __future__ import annotations

from collections.abc import Mapping

from dpcore.mechanisms.spec import WorkerQueue
from service.config import Settings
from service.releases import repository as releases
from service.runtime import Dispatcher, InProcessDispatcher, Runtime
from worker.broker import FINISH_SHARDS, RUN_RELEASE, RUN_SHARD, celery_app
from worker.scratch import clean_stale


class CeleryDispatcher:
    """Real mode: queue the job on the broker, on the Celery queue of its worker pool
    (``queues``: pool → Celery queue name, from the settings), for a worker consuming it."""

    def __init__(self, queues: Mapping[WorkerQueue, str]) -> None:
        self.queues = dict(queues)

    @classmethod
    def from_settings(cls, settings: Settings) -> CeleryDispatcher:
        return cls({"cpu": settings.cpu_queue, "gpu": settings.gpu_queue})

    def enqueue(self, release_id: str, queue: WorkerQueue) -> None:
        celery_app.send_task(RUN_RELEASE, args=[release_id], queue=self.queues[queue])

    # A sharded release (worker.shards): its shards go to the pool's queue for any worker of
    # it, and its finaliser after them.
    def enqueue_shard(
        self, release_id: str, attempt: int, index: int, plan: str, queue: WorkerQueue
    ) -> None:
        celery_app.send_task(
            RUN_SHARD, args=[release_id, attempt, index, plan], queue=self.queues[queue]
        )

    def enqueue_finish(self, release_id: str, attempt: int, plan: str, queue: WorkerQueue) -> None:
        celery_app.send_task(
            FINISH_SHARDS, args=[release_id, attempt, plan], queue=self.queues[queue]
        )

    def shutdown(self) -> None:
        pass


def celery_dispatcher(runtime: Runtime) -> Dispatcher:
    return CeleryDispatcher.from_settings(runtime.settings)


def in_process_dispatcher(runtime: Runtime) -> Dispatcher:
    # Imported here so that a process that only queues jobs (the API in real mode) never
    # loads the runner and what it needs (torch, the mechanisms).
    from worker.runner import run_release

    # This process runs the jobs: what killed ones left in the scratch space goes first.
    clean_stale(runtime.settings.scratch_dir)
    return InProcessDispatcher(
        lambda release_id: run_release(runtime, release_id),
        owner_of=lambda release_id: _owner_of(runtime, release_id),
        workers=runtime.settings.job_threads,
        per_owner=runtime.settings.job_threads_per_owner,
        stopping=runtime.stopping,
    )


def _owner_of(runtime: Runtime, release_id: str) -> str:
    """Whose queue a release waits in: the owner who requested it (only a dataset's owner
    requests its releases)."""
    with runtime.session_factory() as session:
        return releases.requested_by(session, release_id)


def default_dispatcher(runtime: Runtime) -> Dispatcher:
    """In-process jobs when no Celery broker is configured, else Celery."""
    if runtime.settings.celery_broker_url is None:
        return in_process_dispatcher(runtime)
    return celery_dispatcher(runtime)
