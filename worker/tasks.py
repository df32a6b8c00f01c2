"""Celery task wrapper around ``worker.runner``: it owns retries, the runner owns the work."""

from __future__ import annotations

from typing import Any

from celery.exceptions import Reject

from worker.celery_app import RUN_RELEASE, celery_app, worker_runtime
from worker.runner import Interrupted, TransientError, execute, fail


@celery_app.task(name=RUN_RELEASE, bind=True, max_retries=None)
def run_release_task(self: Any, release_id: str) -> None:
    runtime = worker_runtime()
    attempts = runtime.settings.task_max_attempts
    try:
        execute(runtime, release_id)
    except Interrupted as exc:
        # Warm shutdown (worker.celery_app): the job stopped between chunks and its release is
        # queued again, this attempt uncounted. The message goes back to the broker unacked,
        # for another worker or this one's restart (the outbox sweeper re-sends it otherwise).
        raise Reject(str(exc), requeue=True) from exc
    except TransientError as exc:
        if self.request.retries + 1 >= attempts:
            fail(runtime, release_id, f"gave up after {attempts} attempts: {exc}")
            return
        raise self.retry(exc=exc, countdown=min(60, 2 ** (self.request.retries + 1))) from exc
