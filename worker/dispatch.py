"""How a process hands release jobs over, chosen by the composition roots.

``default_dispatcher`` is the one place that decides: jobs run in-process (a background
thread of the API, the same runner code) when no Celery broker is configured, and go to the
Celery workers otherwise. ``service.run`` (the API server), ``worker.celery_app`` (workers) and
the tests pass it, or one of the two below, to ``service.runtime.build_runtime``.
"""

from __future__ import annotations

from collections.abc import Mapping

from service.config import Settings
from service.releases import repository as releases
from service.runtime import Dispatcher, InProcessDispatcher, Route, Runtime
from worker.broker import FINISH_SHARDS, RUN_RELEASE, RUN_SHARD, celery_app
from worker.scratch import clean_stale
from worker.staging import remove_recorded


class CeleryDispatcher:
    """Real mode: queue the job on the broker, on the Celery queue of its route (``queues``:
    worker pool and lane → Celery queue name, from the settings), for a worker consuming it.
    A long job (its declared work above ``long_job_work``) waits on its pool's long queue,
    which the short lane's workers do not read, so they are never taken by one."""

    def __init__(self, queues: Mapping[Route, str]) -> None:
        self.queues = dict(queues)

    @classmethod
    def from_settings(cls, settings: Settings) -> CeleryDispatcher:
        return cls(
            {
                Route("cpu", "short"): settings.cpu_queue,
                Route("cpu", "long"): settings.long_queue,
                Route("gpu", "short"): settings.gpu_queue,
                Route("gpu", "long"): settings.gpu_long_queue,
            }
        )

    def enqueue(self, release_id: str, route: Route) -> None:
        celery_app.send_task(RUN_RELEASE, args=[release_id], queue=self.queues[route])

    # A sharded release (worker.shards): its shards go to the release's queue for any worker
    # of its pool and lane, and its finaliser after them.
    def enqueue_shard(
        self, release_id: str, attempt: int, index: int, plan: str, route: Route
    ) -> None:
        celery_app.send_task(
            RUN_SHARD, args=[release_id, attempt, index, plan], queue=self.queues[route]
        )

    def enqueue_finish(self, release_id: str, attempt: int, plan: str, route: Route) -> None:
        celery_app.send_task(
            FINISH_SHARDS, args=[release_id, attempt, plan], queue=self.queues[route]
        )

    def shutdown(self) -> None:
        pass


def celery_dispatcher(runtime: Runtime) -> Dispatcher:
    return CeleryDispatcher.from_settings(runtime.settings)


def in_process_dispatcher(runtime: Runtime) -> Dispatcher:
    # Imported here so that a process that only queues jobs (the API in real mode) never
    # loads the runner and what it needs (torch, the mechanisms).
    from worker.runner import run_release

    # This process runs the jobs: what killed ones left in the scratch space (and the
    # partitions they staged in the object store) goes first.
    clean_stale(runtime.settings.scratch_dir, before_remove=remove_recorded(lambda: runtime.store))
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
