"""Prometheus metrics (``prometheus-client``), served by ``GET /metrics`` to admins.

What is measured, and where:
- ``dprelease_http_request_duration_seconds{method,route,status}``: requests, timed by the
  ASGI middleware below; ``route`` is the route's template (``/releases/{release_id}``), never
  the raw path, so ids do not become label values (unbounded series, and ids are not the
  operator's business either). Not observed: requests of ``OWNER_ONLY_ROUTES``, whose status
  or time reads private data (an upload's time tracks its file's size; an admission refusal
  can read class counts; a deletion is refused while a research release runs), and requests
  that touched a research release (``service.owner_only``): such a request leaves no sample,
  so neither its status nor its time nor its existence reaches the operator.
- ``dprelease_ledger_decisions_total{decision}``: admissions and refusals of the ledger
  (``service.budgets.service.admit``), counted by the process that decided.
- ``dprelease_job_duration_seconds{mechanism,outcome}``: wall time from a job's start to its
  end (succeeded / failed), observed by the process that ran it: the API process in embedded
  mode, a Celery worker in real mode (served on ``DPRELEASE_WORKER_METRICS_PORT``). Research
  releases' jobs are not observed.
- ``dprelease_releases{status}`` and ``dprelease_queue_depth{queue}``: read at scrape time from
  the database (releases by status, across all API processes) and the broker (messages
  waiting per Celery queue), so any API process answers them for the whole deployment.
  Neither counts research releases: the gauge skips their rows, the depth their messages.

Job durations are timings of computations on private data: they go to the operator (an admin
key) only, like every other metric here. Label values are the operator's own vocabulary
(mechanism names, statuses, route templates): nothing of a dataset or a tenant.

Several processes (uvicorn ``--workers``, Celery's prefork pool) each count their own; set
``PROMETHEUS_MULTIPROC_DIR`` (prometheus-client's multiprocess mode) to serve their sum.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import redis
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service import owner_only
from service.models import Release
from service.releases import repository as release_repository
from service.releases.status import ReleaseStatus

if TYPE_CHECKING:
    from service.runtime import Runtime

log = logging.getLogger(__name__)

CONTENT_TYPE = CONTENT_TYPE_LATEST

REQUEST_SECONDS = Histogram(
    "dprelease_http_request_duration_seconds",
    "Time from a request's arrival to its response's start, by route template",
    ["method", "route", "status"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
LEDGER_DECISIONS = Counter(
    "dprelease_ledger_decisions",
    "Release requests the ledger admitted or refused (budget), in this process",
    ["decision"],
)
JOB_SECONDS = Histogram(
    "dprelease_job_duration_seconds",
    "Wall time of release jobs from start to end, in the process that ran them",
    ["mechanism", "outcome"],
    buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 3 * 3600, 6 * 3600),
)


def ledger_decision(admitted: bool) -> None:
    LEDGER_DECISIONS.labels("admitted" if admitted else "refused").inc()


def job_ended(mechanism: str, outcome: str, seconds: float) -> None:
    JOB_SECONDS.labels(mechanism, outcome).observe(max(0.0, seconds))


# Routes never observed: their status or time reads private data. An upload's time tracks its
# file's size (hidden from admins as ``size_bytes``); an admission or a preview can be refused
# from private counts (422/409) and runs longer when admitted; a deletion is refused (409)
# while a release, maybe a research one, reads the dataset. All are the owner's own requests.
OWNER_ONLY_ROUTES = frozenset(
    {
        ("POST", "/datasets"),
        ("DELETE", "/datasets/{dataset_id}"),
        ("POST", "/releases"),
        ("POST", "/releases/preview"),
    }
)


# The same routes by raw path: a request refused before routing (a rate limit, an upload over
# its size limit or without a free slot) has no route template.
_OWNER_ONLY_PATHS = tuple(
    (method, re.compile(re.sub(r"\{[^}]+\}", "[^/]+", template) + "/?"))
    for method, template in sorted(OWNER_ONLY_ROUTES)
)


def _owner_only_route(method: str, template: str, path: str) -> bool:
    if (method, template) in OWNER_ONLY_ROUTES:
        return True
    return template == "-" and any(
        method == m and pattern.fullmatch(path) for m, pattern in _OWNER_ONLY_PATHS
    )


class RequestMetrics:
    """Pure ASGI middleware timing HTTP requests until their response starts. Each request
    runs in an ``owner_only`` unit: one marked owner-only (its route is in
    ``OWNER_ONLY_ROUTES``, or its handler touched a research release) is not observed, and
    its log records (the access log line included) are dropped."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        with owner_only.unit() as unit:
            start = time.perf_counter()
            status = 500  # what a crash before any response start amounts to

            async def timed_send(message: Message) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = message["status"]
                    _observe(scope, unit, status, time.perf_counter() - start)
                await send(message)

            try:
                await self.app(scope, receive, timed_send)
            except Exception:
                _observe(scope, unit, status, time.perf_counter() - start)
                raise


def _observe(scope: Scope, unit: owner_only.Unit, status: int, seconds: float) -> None:
    route = scope.get("route")
    # Unmatched paths share one label value: every probe of a random URL would be a series.
    template = route.path if isinstance(route, BaseRoute) and hasattr(route, "path") else "-"
    if _owner_only_route(scope["method"], template, scope.get("path", "")):
        unit.owner_only = True
    if unit.owner_only:
        return
    REQUEST_SECONDS.labels(scope["method"], template, str(status)).observe(seconds)


class DeploymentCollector(Collector):
    """Gauges read at scrape time from the shared database and broker."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def collect(self) -> Iterator[Metric]:
        releases = GaugeMetricFamily(
            "dprelease_releases", "Releases by status (whole deployment)", labels=["status"]
        )
        with self.runtime.session_factory() as session:
            rows = session.execute(
                select(Release.status, func.count())
                .where(release_repository.ordinary())
                .group_by(Release.status)
            )
            counts = {status: count for status, count in rows}
        for status in ReleaseStatus:
            releases.add_metric([status.value], counts.get(status, 0))
        yield releases
        depth = self._queue_depth()
        if depth is not None:
            family = GaugeMetricFamily(
                "dprelease_queue_depth", "Jobs waiting on each Celery queue", labels=["queue"]
            )
            for queue, length in depth.items():
                family.add_metric([queue], length)
            yield family

    def _queue_depth(self) -> dict[str, int] | None:
        settings = self.runtime.settings
        url = settings.celery_broker_url
        if url is None or not url.startswith(("redis://", "rediss://", "unix://")):
            return None  # embedded (releases queued is the depth) or a broker we cannot read
        queues = sorted(
            {settings.cpu_queue, settings.long_queue, settings.gpu_queue, settings.gpu_long_queue}
        )
        client = redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1)
        try:
            # Kombu's Redis transport keeps a queue as a list named after it.
            waiting = {q: _waiting_releases(client, q) for q in queues}
        except redis.RedisError as exc:
            log.warning("queue depth unavailable: %r", exc)
            return None
        finally:
            client.close()
        named = {r for ids in waiting.values() for r in ids if r is not None}
        research = self._research_ids(named)
        return {q: sum(r is None or r not in research for r in ids) for q, ids in waiting.items()}

    def _research_ids(self, release_ids: set[str]) -> set[str]:
        with self.runtime.session_factory() as session:
            return release_repository.research_ids(session, sorted(release_ids))


# Messages read from the broker per round trip while counting a queue.
_PAGE = 1000


def _waiting_releases(client: redis.Redis, queue: str) -> list[str | None]:
    """The release id of each message waiting on ``queue`` (None where unreadable: counted
    as an ordinary job). Every task's first argument is its release's id (``worker.dispatch``)."""
    out: list[str | None] = []
    start = 0
    while True:
        page = client.lrange(queue, start, start + _PAGE - 1)
        out.extend(release_of_message(m) for m in page)  # type: ignore[union-attr]
        if len(page) < _PAGE:  # type: ignore[arg-type]
            return out
        start += _PAGE


def release_of_message(raw: bytes | str) -> str | None:
    """The first task argument of a Kombu (Redis transport) message carrying a Celery task
    in protocol 2: a JSON envelope whose body is ``[args, kwargs, embed]``, base64-encoded."""
    try:
        envelope = json.loads(raw)
        body: Any = envelope["body"]
        if envelope.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
        first = args[0] if args else None
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None
    return first if isinstance(first, str) else None


def exposition(runtime: Runtime) -> bytes:
    """The text exposition: this process's instruments (in multiprocess mode, every
    process's), then the deployment's gauges."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        merged = CollectorRegistry()
        MultiProcessCollector(merged)
        own = generate_latest(merged)
    else:
        own = generate_latest(REGISTRY)
    deployment = CollectorRegistry(auto_describe=False)
    deployment.register(DeploymentCollector(runtime))
    return own + generate_latest(deployment)
