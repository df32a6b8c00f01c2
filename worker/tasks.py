"""Celery task wrappers around ``worker.runner``: they own retries, the runner owns the work."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery.exceptions import Reject

from worker.attempts import retry_delay
from worker.broker import FINISH_SHARDS, RUN_SHARD
from worker.celery_app import RUN_RELEASE, celery_app, worker_runtime
from worker.runner import Interrupted, TransientError, execute, fail, finish_shards, run_shard


def _run(task: Any, release_id: str, work: Callable[[], None]) -> None:
    runtime = worker_runtime()
    attempts = runtime.settings.task_max_attempts
    try:
        work()
    except Interrupted as exc:
        # Warm shutdown (worker.celery_app): the job stopped between chunks and its release is
        # queued again, this attempt uncounted. The message goes back to the broker unacked,
        # for another worker or this one's restart (the outbox sweeper re-sends it otherwise).
        raise Reject(str(exc), requeue=True) from exc
    except TransientError as exc:
        if task.request.retries + 1 >= attempts:
            fail(runtime, release_id, f"gave up after {attempts} attempts: {exc}")
            return
        wait = retry_delay(
            task.request.retries + 1,
            attempts=attempts,
            window_s=runtime.settings.task_retry_window_s,
        )
        raise task.retry(exc=exc, countdown=wait) from exc


@celery_app.task(name=RUN_RELEASE, bind=True, max_retries=None)
def run_release_task(self: Any, release_id: str) -> None:
    _run(self, release_id, lambda: execute(worker_runtime(), release_id))


@celery_app.task(name=RUN_SHARD, bind=True, max_retries=None)
def run_shard_task(self: Any, release_id: str, attempt: int, index: int, plan: str) -> None:
    """One shard of a sharded release (worker.shards); a shard whose worker dies is
    redelivered (late acknowledgement) and drawn again, nothing of it having been stored."""
    _run(self, release_id, lambda: run_shard(worker_runtime(), release_id, attempt, index, plan))


@celery_app.task(name=FINISH_SHARDS, bind=True, max_retries=None)
def finish_shards_task(self: Any, release_id: str, attempt: int, plan: str) -> None:
    _run(self, release_id, lambda: finish_shards(worker_runtime(), release_id, attempt, plan))
