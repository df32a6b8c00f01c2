"""End-to-end release latency and admission throughput through the real HTTP API.

Two stacks, each a fresh one of its own:

- ``embedded``: what ``make run`` serves (SQLite and local files under a temporary
  ``DPRELEASE_HOME``, jobs in the server's own threads), one uvicorn process
  (``bench.health_latency.uvicorn_process``);
- ``real``: a scratch Postgres database migrated from scratch (created beside
  ``DPRELEASE_BENCH_DATABASE_URL``, else ``DPRELEASE_TEST_DATABASE_URL``; dropped after), a
  private redis-server on a free port, moto's S3 behind the tests' SigV4 check (in this
  process), the API under uvicorn and a ``celery worker --pool solo`` consuming both
  queues: the pieces of ``tests/integration/servers.py`` and ``tests/conftest.py``, reused.

``e2e`` cases (one server, or one worker in real mode, per case, so its ``VmHWM`` is the
case's peak RSS): upload → ``POST /releases`` → polled (every 0.1 s) until succeeded →
downloaded with its sha256 checked. ``walkthrough`` is the guide's (MNIST t10k when
``shared/datasets/mnist-t10k`` is there, else random images of its shape; dpmix ℓ = 64,
T = 10 000, ε = 10, δ = 1e-5, NPZ); ``mnist60k`` is the same at MNIST's training size (t10k
six times over, or random images: 60 000 × 784, T = 60 000), whose job is also stated as the
effective bandwidth of its mixing, T·ℓ·d·4 B / job s, over the read bandwidth measured in the
same run (``bench.mixing.bandwidth``); ``million`` is T = 10^6 rows of a 16-feature, 2-class
table (dpmix ℓ = 16, ε = 1): 10^6 × 18 × 4 B = 72 MB, under the default
``DPRELEASE_MAX_RELEASE_BYTES`` (2 GiB) that a 784-wide release of 10^6 rows would pass.

``admission``: ``POST /releases`` and ``POST /releases/preview`` sent by C concurrent clients
(a bounded number of requests and seconds), the same small body each time (dpmix on a
2 000-row table, ε = 0.01, 50 rows) against a budget large enough that all are admitted;
throughput, p50/p99 latency and the answers' statuses. Traffic goes to 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.health_latency import ROOT, embedded_env, uvicorn_process
from bench.rss import vm_hwm_mib
from dprelease_client import Client

# The server and an existing database to create the scratch one from (it is dropped after).
BENCH_DATABASE_URL = os.environ.get(
    "DPRELEASE_BENCH_DATABASE_URL",
    os.environ.get(
        "DPRELEASE_TEST_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/dprelease_test"
    ),
)
POLL = 0.1


def log(message: str) -> None:
    print(f"  [api] {message}", file=sys.stderr, flush=True)


@dataclass
class Stack:
    mode: str
    url: str
    admin_key: str
    server: subprocess.Popen[bytes] | None  # the API process (embedded: it runs the jobs)
    start_worker: Any = None  # real mode: () -> context manager yielding the worker process


def _npz(x: np.ndarray, y: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, X=x, y=y)
    return buffer.getvalue()


def mnist_like(copies: int = 1) -> tuple[bytes, str]:
    """MNIST t10k as NPZ (uint8 images, labels), ``copies`` times over, or random images of
    that shape."""
    from tests import mnist

    if mnist.available():
        images, labels = mnist.load_mnist_t10k()
        name = "mnist-t10k" if copies == 1 else f"mnist-t10k x{copies}"
        return _npz(np.concatenate([images] * copies), np.concatenate([labels] * copies)), name
    rng = np.random.default_rng(0)
    n = 10_000 * copies
    images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
    return _npz(images, rng.integers(0, 10, n).astype(np.uint8)), f"synthetic {n}x28x28"


def table(n: int, d: int, classes: int, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    x = rng.random((n, d), dtype=np.float32)
    return _npz(x, rng.integers(0, classes, n))


@dataclass(frozen=True)
class Case:
    name: str
    rows: int  # T
    mixture_degree: int
    epsilon: float


def cases(quick: bool) -> list[Case]:
    if quick:
        return [Case("walkthrough", 1_000, 64, 10.0), Case("million", 50_000, 16, 1.0)]
    return [
        Case("walkthrough", 10_000, 64, 10.0),
        Case("mnist60k", 60_000, 64, 10.0),
        Case("million", 1_000_000, 16, 1.0),
    ]


def _owner(stack: Stack) -> Client:
    admin = Client(base_url=stack.url, api_key=stack.admin_key)
    key = admin.create_api_key(name=f"bench-{uuid.uuid4().hex[:6]}", role="owner")["key"]
    admin.close()
    return Client(base_url=stack.url, api_key=key, timeout=600)


def release_once(stack: Stack, case: Case) -> dict[str, Any]:
    """Upload, release, wait, download: the client's seconds for each step."""
    if case.name in ("walkthrough", "mnist60k"):
        content, source = mnist_like(case.rows // 10_000 if case.name == "mnist60k" else 1)
        metadata: dict[str, Any] = {"feature_range": [0, 255], "classes": list(range(10))}
    else:
        content, source = table(20_000, 16, 2), "synthetic 20000x16, 2 classes"
        metadata = {"feature_range": [0, 1], "classes": [0, 1]}
    metadata |= {"name": case.name, "budget": {"epsilon": 10.0, "delta": 1e-5}}
    api = _owner(stack)
    try:
        times: dict[str, float] = {}
        start = time.perf_counter()
        dataset = api.upload_dataset(io.BytesIO(content), filename="data.npz", metadata=metadata)
        times["upload_s"] = time.perf_counter() - start
        body = {
            "dataset_id": dataset["id"],
            "mechanism": "dpmix",
            "params": {"mixture_degree": case.mixture_degree, "n_samples": case.rows},
            "epsilon": case.epsilon,
            "delta": 1e-5,
            "format": "npz",
        }
        start = time.perf_counter()
        release = api.create_release(body)
        times["admit_s"] = time.perf_counter() - start
        start = time.perf_counter()
        done = api.wait(release["id"], poll=POLL, max_poll=POLL, backoff=1.0, timeout=1800)
        times["run_s"] = time.perf_counter() - start
        start = time.perf_counter()
        data = api.download(release["id"])
        times["download_s"] = time.perf_counter() - start
    finally:
        api.close()
    times["total_s"] = sum(times.values())
    return {
        "case": case.name,
        "dataset": source,
        "upload_bytes": len(content),
        "mechanism": "dpmix",
        "mixture_degree": case.mixture_degree,
        "rows": case.rows,
        "epsilon": case.epsilon,
        "noise_sampler": "secure (the API's default)",
        "release_bytes": len(data) if isinstance(data, bytes) else None,
        **{k: round(v, 3) for k, v in times.items()},
        "server_timings": done.get("timings"),
    }


def e2e(mode: str, quick: bool) -> list[dict[str, Any]]:
    """Every case on ``mode``: embedded, a server per case; real, one stack and a worker per
    case (the process that runs the job is fresh, so its VmHWM is this case's peak)."""
    results = []
    read_gbs = None
    if any(case.name == "mnist60k" for case in cases(quick)):
        from bench.mixing import bandwidth

        read_gbs = bandwidth(1536)["read_gbs"]
    with contextlib.ExitStack() as shared:
        real = shared.enter_context(stack_for(mode)) if mode == "real" else None
        for case in cases(quick):
            log(f"e2e {mode}: {case.name} (T = {case.rows})")
            try:
                if real is None:
                    with stack_for(mode) as stack:
                        assert stack.server is not None
                        result = release_once(stack, case)
                        result["peak_rss_mib"] = vm_hwm_mib(stack.server.pid)
                        result["peak_rss_of"] = "the API process, which runs the job (VmHWM)"
                else:
                    with real.start_worker() as worker:
                        result = release_once(real, case)
                        result["peak_rss_mib"] = vm_hwm_mib(worker.pid)
                        result["peak_rss_of"] = "the Celery worker (solo pool) (VmHWM)"
            except Exception as exc:  # recorded; the next case still runs
                result = {"case": case.name, "error": f"{type(exc).__name__}: {exc}"[:2000]}
            if case.name == "mnist60k" and "run_s" in result and read_gbs is not None:
                effective = case.rows * case.mixture_degree * 784 * 4 / result["run_s"] / 1e9
                result["effective_gbs"] = round(effective, 3)
                result["read_gbs"] = round(read_gbs, 2)
                result["of_read_bw"] = round(effective / read_gbs, 4)
            results.append({"mode": mode, **result})
    return results


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _burst(
    url: str, key: str, path: str, body: dict[str, Any], clients: int, total: int, seconds: float
) -> dict[str, Any]:
    lock = threading.Lock()
    sent = [0]
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    deadline = time.monotonic() + seconds

    def client() -> None:
        with httpx.Client(timeout=120, headers={"Authorization": f"Bearer {key}"}) as http:
            while time.monotonic() < deadline:
                with lock:
                    if sent[0] >= total:
                        return
                    sent[0] += 1
                start = time.perf_counter()
                try:
                    status = str(http.post(f"{url}{path}", json=body).status_code)
                except httpx.HTTPError as exc:
                    status = type(exc).__name__
                took = time.perf_counter() - start
                with lock:
                    latencies.append(took)
                    statuses[status] = statuses.get(status, 0) + 1

    threads = [threading.Thread(target=client) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    ok = sum(n for s, n in statuses.items() if s in ("200", "201", "202"))
    ms = [1000 * x for x in latencies]
    return {
        "path": path,
        "clients": clients,
        "requests": len(latencies),
        "seconds": round(elapsed, 3),
        "accepted_per_s": round(ok / elapsed, 2),
        "p50_ms": round(statistics.median(ms), 1) if ms else None,
        "p99_ms": round(_percentile(ms, 0.99), 1) if ms else None,
        "max_ms": round(max(ms), 1) if ms else None,
        "statuses": statuses,
    }


def admission(mode: str, quick: bool) -> list[dict[str, Any]]:
    levels = (8,) if quick else (8, 32)
    total = 32 if quick else 256
    seconds = 30.0 if quick else 120.0
    results: list[dict[str, Any]] = []
    with stack_for(mode) as stack:
        worker = stack.start_worker() if stack.start_worker is not None else None
        if worker is not None:
            worker.__enter__()
        try:
            api = _owner(stack)
            metadata = {
                "name": "admission",
                "feature_range": [0, 1],
                "classes": [0, 1],
                "budget": {"epsilon": 1e4, "delta": 0.5},
            }
            data = table(2_000, 6, 2)
            dataset = api.upload_dataset(io.BytesIO(data), filename="t.npz", metadata=metadata)
            body = {
                "dataset_id": dataset["id"],
                "mechanism": "dpmix",
                "params": {"mixture_degree": 8, "n_samples": 50},
                "epsilon": 0.01,
                "delta": 1e-9,
                "format": "npz",
                "noise_sampler": "fast",
            }
            api.preview_release(body)  # the calibration is cached from here on
            key = api._headers["Authorization"].removeprefix("Bearer ")
            api.close()
            for path in ("/releases/preview", "/releases"):
                for clients in levels:
                    log(f"admission {mode}: {path} x {total} from {clients} clients")
                    result = _burst(stack.url, key, path, body, clients, total, seconds)
                    results.append({"mode": mode, **result})
        finally:
            if worker is not None:
                worker.__exit__(None, None, None)
    return results


# -- stacks ------------------------------------------------------------------------------


@contextmanager
def stack_for(mode: str) -> Iterator[Stack]:
    with tempfile.TemporaryDirectory(prefix="dprelease-bench-") as tmp:
        if mode == "embedded":
            home = Path(tmp) / "home"
            env = embedded_env(home, ROOT)
            with uvicorn_process(env, ROOT, Path(tmp) / "server.log") as (url, proc):
                yield Stack("embedded", url, (home / "admin.key").read_text().strip(), proc)
        elif mode == "real":
            with real_stack(Path(tmp)) as stack:
                yield stack
        else:
            raise ValueError(mode)


@contextmanager
def real_stack(tmp: Path) -> Iterator[Stack]:
    from service import bootstrap
    from service.config import Settings

    with warnings.catch_warnings():  # fastapi.testclient's deprecation of httpx
        warnings.simplefilter("ignore")
        from tests.conftest import (
            ADMIN_KEY,
            S3_ACCESS_KEY,
            S3_SECRET_KEY,
            free_port,
            scratch_database,
        )
    from tests.integration.servers import private_redis, settings_env, stop
    from tests.sigv4_s3 import SigV4S3Server

    if shutil.which("redis-server") is None:
        raise RuntimeError("redis-server is not installed (make services installs it)")
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's access log
    s3 = SigV4S3Server(free_port(), access_key=S3_ACCESS_KEY, secret_key=S3_SECRET_KEY)
    s3.start()
    queue = f"dprelease-bench-{uuid.uuid4().hex[:8]}"
    try:
        with (
            private_redis(tmp / "redis") as redis_url,
            scratch_database(BENCH_DATABASE_URL) as database_url,
        ):
            bootstrap.upgrade(database_url)
            settings = Settings(  # type: ignore[call-arg]
                home=tmp / "home",
                database_url=database_url,
                cpu_queue=f"{queue}-cpu",
                gpu_queue=f"{queue}-gpu",
                long_queue=f"{queue}-long",
                gpu_long_queue=f"{queue}-gpu-long",
                celery_broker_url=redis_url,
                s3_endpoint_url=s3.endpoint_url,
                s3_bucket=queue,
                s3_access_key_id=S3_ACCESS_KEY,
                s3_secret_access_key=S3_SECRET_KEY,  # type: ignore[arg-type]
                admin_key=ADMIN_KEY,  # type: ignore[arg-type]
            )
            env = settings_env(settings, RATE_LIMIT="")

            @contextmanager
            def worker() -> Iterator[subprocess.Popen[bytes]]:
                path = tmp / f"worker-{uuid.uuid4().hex[:6]}.log"
                command = [sys.executable, "-m", "celery", "-A", "worker.celery_app", "worker"]
                lanes = ",".join(f"{queue}-{lane}" for lane in ("cpu", "long", "gpu", "gpu-long"))
                command += ["--pool", "solo", "--queues", lanes]
                command += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
                command += ["--loglevel", "INFO"]
                with path.open("w") as out:
                    proc = subprocess.Popen(command, env=env, cwd=ROOT, stdout=out, stderr=out)
                try:
                    deadline = time.monotonic() + 60
                    while "ready." not in path.read_text():
                        if proc.poll() is not None or time.monotonic() > deadline:
                            raise RuntimeError(f"worker did not start: {path.read_text()[-2000:]}")
                        time.sleep(0.2)
                    yield proc
                finally:
                    stop(proc)

            with uvicorn_process(
                {**env, "DPRELEASE_RUN_MIGRATIONS": "false"}, ROOT, tmp / "server.log"
            ) as (url, proc):
                yield Stack("real", url, ADMIN_KEY, proc, worker)
    finally:
        s3.stop()


def run(section: str, modes: tuple[str, ...], quick: bool) -> dict[str, Any]:
    """The ``e2e`` or ``admission`` section over ``modes``; a mode that fails is recorded."""
    out: dict[str, Any] = {}
    for mode in modes:
        try:
            out[mode] = e2e(mode, quick) if section == "e2e" else admission(mode, quick)
        except Exception as exc:
            out[mode] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
    return out


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1], tuple(sys.argv[2:]) or ("embedded",), True), indent=1))
