"""The Celery application: how release jobs travel from the API to the workers.

Jobs travel on one queue per worker pool (``Execution.queue``) and lane: the CPU pool's short
lane (``DPRELEASE_CPU_QUEUE``, Celery's default "celery") and long lane
(``DPRELEASE_LONG_QUEUE``, "long"), the GPU pool's (``DPRELEASE_GPU_QUEUE``, "gpu", and
``DPRELEASE_GPU_LONG_QUEUE``, "gpu-long"). A job goes to the long lane when its declared work
passes ``DPRELEASE_LONG_JOB_WORK`` (``service.releases.mechanisms.route``). A worker consumes
the queues named by its ``-Q``; without it, both lanes of the CPU pool. Jobs are
acknowledged late and re-delivered if a worker dies (the task is idempotent by release id), one
job is prefetched at a time, and the number of attempts is bounded both by Celery retries and by
the attempt counter stored on the release.

Shared by the producer side (``worker.dispatch.CeleryDispatcher``) and the consumer side
(``worker.celery_app``, the worker's composition root, and ``worker.tasks``).
"""

from __future__ import annotations

from celery import Celery
from kombu import Exchange, Queue

from service.config import get_settings

RUN_RELEASE = "dprelease.run_release"
# A sharded release's tasks (worker.shards): one per shard, then its finaliser.
RUN_SHARD = "dprelease.run_shard"
FINISH_SHARDS = "dprelease.finish_shards"

_settings = get_settings()
celery_app = Celery("dprelease", broker=_settings.celery_broker_url or "memory://")
celery_app.conf.update(
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    task_ignore_result=True,
    # Jobs go to the Celery queue of their mechanism's worker pool and their lane
    # (worker.dispatch); a worker started without -Q consumes the CPU pool's two lanes. A
    # queue named by -Q and not listed here is made as Celery makes any missing one.
    task_default_queue=_settings.cpu_queue,
    task_queues=[
        Queue(name, Exchange(name), routing_key=name)
        for name in dict.fromkeys((_settings.cpu_queue, _settings.long_queue))
    ],
    task_serializer="json",
    accept_content=["json"],
    # Longer than the longest job, so a running job is not handed to a second worker; a job
    # whose worker died is redelivered after it. (A second delivery is safe anyway: the
    # artifact is create-only and the runner claims the upload under the release row lock.)
    broker_transport_options={"visibility_timeout": _settings.celery_visibility_timeout},
    broker_connection_retry_on_startup=True,
    include=["worker.tasks"],
)
