"""Readiness: can this process serve releases now? The database, the broker and the object
store are each asked one cheap question, all at once, each on its own thread and bounded by
``ready_timeout_s``, so that a dead dependency answers "not ready" in bounded time instead of
hanging the probe (and a slow one cannot hold the event loop).

The answer names the checks and whether each passed, with the exception's type only: error
texts of drivers carry URLs, hosts and sometimes credentials, and the probe is unauthenticated.
The full error goes to the log.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis
from kombu import Connection
from sqlalchemy import text

from service.runtime import Runtime

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckResult:
    name: str
    ok: bool
    seconds: float
    error: str | None = None  # the exception's type name, never its text


def _database(runtime: Runtime) -> None:
    with runtime.engine.connect() as connection:
        connection.execute(text("SELECT 1"))


def _broker(runtime: Runtime) -> None:
    url = runtime.settings.celery_broker_url
    if url is None:  # embedded: jobs run in this process, there is no broker to reach
        return
    if url.startswith(("redis://", "rediss://", "unix://")):
        # Redis' own ping, with short socket timeouts: kombu's connection check retries.
        client = redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1)
        try:
            client.ping()
        finally:
            client.close()
        return
    with Connection(url, connect_timeout=1) as connection:
        connection.ensure_connection(max_retries=1)


def _store(runtime: Runtime) -> None:
    runtime.store.ping()


CHECKS: dict[str, Callable[[Runtime], None]] = {
    "database": _database,
    "broker": _broker,
    "store": _store,
}


async def _run(name: str, check: Callable[[Runtime], None], runtime: Runtime) -> CheckResult:
    start = time.perf_counter()
    try:
        await asyncio.wait_for(
            asyncio.to_thread(check, runtime), timeout=runtime.settings.ready_timeout_s
        )
    except Exception as exc:  # any failure means "not ready"; logged in full
        log.warning("readiness check %s failed: %r", name, exc)
        error = "Timeout" if isinstance(exc, TimeoutError) else type(exc).__name__
        return CheckResult(name, False, time.perf_counter() - start, error)
    return CheckResult(name, True, time.perf_counter() - start)


async def check_all(runtime: Runtime) -> list[CheckResult]:
    return list(await asyncio.gather(*(_run(n, c, runtime) for n, c in CHECKS.items())))
