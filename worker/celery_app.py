"""The workers' composition root: ``celery -A worker.celery_app worker``.

The Celery application itself (broker, delivery guarantees) is defined in ``worker.broker``
and re-exported here; this module builds the runtime that the tasks of this process use.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from celery.signals import (
    after_setup_logger,
    after_setup_task_logger,
    task_postrun,
    task_prerun,
    worker_init,
    worker_ready,
    worker_shutting_down,
)
from prometheus_client import REGISTRY, CollectorRegistry, start_http_server
from prometheus_client.multiprocess import MultiProcessCollector

from service import logs, owner_only
from service.config import get_settings
from service.runtime import Runtime, build_runtime
from worker.broker import RUN_RELEASE, celery_app
from worker.dispatch import default_dispatcher
from worker.scratch import clean_stale
from worker.staging import remove_recorded

__all__ = ["RUN_RELEASE", "celery_app", "configure", "worker_runtime"]

_runtime: Runtime | None = None
_runtime_lock = threading.Lock()


def configure(runtime: Runtime | None) -> None:
    """Use ``runtime`` for tasks of this process (tests, embedding); None resets."""
    global _runtime
    with _runtime_lock:
        _runtime = runtime


def worker_runtime() -> Runtime:
    global _runtime
    with _runtime_lock:
        if _runtime is None:
            # A worker runs the jobs it is handed; its runtime's dispatcher would only be used
            # to queue more, which it does not do.
            _runtime = build_runtime(get_settings(), default_dispatcher)
        return _runtime


@worker_init.connect
def _serve_metrics(**_: Any) -> None:
    """Job durations (``service.meta.metrics``) on ``DPRELEASE_WORKER_METRICS_PORT``: the
    prefork pool's children each count their own, so with more than one, set
    ``PROMETHEUS_MULTIPROC_DIR`` and this serves their sum."""
    port = get_settings().worker_metrics_port
    if port:
        registry = REGISTRY
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            registry = CollectorRegistry()
            MultiProcessCollector(registry)
        start_http_server(port, registry=registry)


@worker_ready.connect
def _clean_scratch(**_: Any) -> None:
    """Remove the scratch directories of jobs whose process was killed (worker.scratch), and
    the partitions they staged in the object store (worker.staging; the runtime is built only
    when there are some)."""
    clean_stale(
        get_settings().scratch_dir if _runtime is None else _runtime.settings.scratch_dir,
        before_remove=remove_recorded(lambda: worker_runtime().store),
    )


@worker_shutting_down.connect
def _stop_jobs(**_: Any) -> None:
    """Warm shutdown (SIGTERM): the running job stops at its next chunk and its release goes
    back to the queue (worker.tasks), instead of holding the shutdown for the rest of the
    job. Sent in the worker's main process: jobs must run in it (``--pool threads`` or
    ``solo``) for the flag to reach them; a prefork child finishes its job."""
    runtime = _runtime  # no lock: a signal handler, maybe interrupting its holder
    if runtime is not None:
        runtime.stopping.set()


# The owner-only unit of each running task (service.owner_only), by task id: opened before the
# task runs, closed after Celery's own trace lines (its "succeeded in" line, with the job's run
# time, is written in between), in the thread that ran it.
_units: dict[str, object] = {}


@task_prerun.connect
def _open_unit(task_id: str | None = None, **_: Any) -> None:
    if task_id is not None:
        _units[task_id] = owner_only.enter()


@task_postrun.connect
def _close_unit(task_id: str | None = None, **_: Any) -> None:
    token = _units.pop(task_id, None) if task_id is not None else None
    if token is not None:
        owner_only.leave(token)


@after_setup_logger.connect
@after_setup_task_logger.connect
def _filter_logs(loglevel: int | str | None = None, **_: Any) -> None:
    """JSON lines, third-party chatter kept out (``service.logs``), and no log record of a
    research release's job (``service.owner_only``). The consumer logs each task it receives
    before any job reads the release, so that line (task name and id, at INFO) is not written
    at all: its time would date a research release's job."""
    logging.getLogger("celery.worker.strategy").setLevel(logging.WARNING)
    logs.configure(loglevel if loglevel is not None else logging.INFO)
