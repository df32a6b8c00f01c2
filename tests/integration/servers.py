"""Processes of their own for the concurrency and crash tests: a private Redis server and the
API under uvicorn. Private, so a short visibility timeout or a pile of queued jobs never
touches the Redis that other test sessions share."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import uvicorn
from starlette.types import ASGIApp

from service.config import Settings
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def private_redis(directory: Path) -> Iterator[str]:
    """A throwaway redis-server on a free port (no persistence); yields its URL."""
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server is not installed (scripts/ensure_services.sh installs it)")
    port = free_port()
    directory.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        cwd=directory,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("private redis-server did not start") from None
                time.sleep(0.05)
        yield url
    finally:
        client.close()
        stop(proc)


def stop(proc: subprocess.Popen[Any], timeout: float = 20) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def settings_env(settings: Settings, **extra: str) -> dict[str, str]:
    """The process environment that gives a subprocess ``settings`` (and ``extra``, named
    without the DPRELEASE_ prefix); nothing inherited from ours."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPRELEASE_")}
    values: dict[str, Any] = {
        "HOME": settings.home,
        "DATABASE_URL": settings.database_url,
        "CELERY_BROKER_URL": settings.celery_broker_url,
        "S3_ENDPOINT_URL": settings.s3_endpoint_url,
        "S3_BUCKET": settings.s3_bucket,
        "S3_ACCESS_KEY_ID": settings.s3_access_key_id,
        "S3_SECRET_ACCESS_KEY": settings.s3_secret_access_key.get_secret_value()
        if settings.s3_secret_access_key
        else None,
        "ADMIN_KEY": settings.admin_key.get_secret_value() if settings.admin_key else None,
        "TASK_MAX_ATTEMPTS": settings.task_max_attempts,
        "TASK_RETRY_WINDOW_S": settings.task_retry_window_s,
        "CELERY_VISIBILITY_TIMEOUT": settings.celery_visibility_timeout,
        "CPU_QUEUE": settings.cpu_queue,
        "GPU_QUEUE": settings.gpu_queue,
        "LONG_QUEUE": settings.long_queue,
        "GPU_LONG_QUEUE": settings.gpu_long_queue,
        "LONG_JOB_WORK": settings.long_job_work,
        "SHARD_ROWS": settings.shard_rows,
        "DEVICE": "cpu",
        **extra,
    }
    env.update({f"DPRELEASE_{k}": str(v) for k, v in values.items() if v is not None})
    env["PYTHONPATH"] = str(ROOT)
    return env


def wait_healthy(
    url: str, proc: subprocess.Popen[Any], deadline: float, log_tail: Callable[[], str]
) -> None:
    """Ask ``url``'s /health until it answers 200; RuntimeError (with ``log_tail()``) once the
    server's process has ended or ``deadline`` (``time.monotonic``) has passed."""
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=10).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not become healthy:\n{log_tail()}")
        time.sleep(0.1)


@contextmanager
def uvicorn_server(env: dict[str, str], *, workers: int, log: Path) -> Iterator[str]:
    """``uvicorn service.run:app_factory --factory`` with ``workers`` processes; yields its
    URL once every worker has started (the database must be migrated beforehand)."""
    port = free_port()
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "service.run:app_factory",
                "--factory",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--workers",
                str(workers),
                "--no-access-log",
            ],
            env={**env, "DPRELEASE_RUN_MIGRATIONS": "false"},
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while log.read_text().count("Application startup complete") < workers:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        # A single uvicorn process logs its startup before it binds the port (the lifespan
        # runs first): a request right after the line can be refused. Ask until it answers.
        wait_healthy(url, proc, deadline, lambda: log.read_text()[-3000:])
        yield url
    finally:
        stop(proc)


@contextmanager
def served(app: ASGIApp) -> Iterator[str]:
    """``app`` served by uvicorn on a loopback port from a thread of this process; yields its
    URL. The app must be started already (a harness's ``TestClient`` ran its lifespan, so
    ``app.state.runtime`` is set): uvicorn runs no lifespan of its own. For tests that need a
    real socket (a client that sends its body slowly), at the cost of no process start."""
    port = free_port()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, lifespan="off", log_level="warning", access_log=False
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn-served", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=20)


def shared_machine_factor() -> float:
    """How much slower than alone this machine runs now: its run queue per core over the last
    minute, at least 1. The scenarios' own load keeps it near 1 on an otherwise idle CI box
    (2 test workers on 2 cores), so the limit there is the 50 ms; work sharing the machine
    from outside (another suite, a study) raises everyone's latency alike, and a stall the
    scenarios cause (seconds behind a lock) stays far above the scaled limit."""
    per_core = os.getloadavg()[0] / max(1, os.cpu_count() or 1)
    return max(1.0, per_core)
