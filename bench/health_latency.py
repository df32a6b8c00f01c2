"""Latency of ``GET /health`` while the API is busy (issue 14, item 2a).

Starts the embedded server under uvicorn (a temporary ``DPRELEASE_HOME``, one process), then
runs each scenario: a background load (or none) while ``/health`` is polled for a few seconds,
and prints p50 / p95 / max of its latency. Scenarios:

- ``idle``: nothing else;
- ``parquet_bomb``: uploads of the issue's Parquet bomb (40 M rows of zeros, zstd, ~364 KB),
  sent back to back by two clients (the default upload cap) for the whole window;
- ``release_burst``: 400 ``POST /releases`` (DPMix, ε = 1, on a 2,000-row dataset with
  budget ε = 10) sent by 50 clients at once; the ledger admits 10 (whose jobs then run in the
  server) and refuses the rest; ``/health`` is polled until the last answer (at least the
  window).

``--repo PATH`` serves the API from another checkout (e.g. an older commit in a git worktree)
with the same scenarios, for a before/after comparison in one run.

A scenario is a function ``(url, owner_key, stop) -> None`` run in background threads until
``stop`` is set; add one to ``SCENARIOS`` (e.g. a burst of POSTs). Runs in well under two
minutes on 2 cores::

    OMP_NUM_THREADS=1 .venv/bin/python bench/health_latency.py [--seconds 8] [--scenario NAME]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
Load = Callable[[str, str, threading.Event], None]


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def embedded_env(home: Path, repo: Path = ROOT, **extra: str) -> dict[str, str]:
    """Our environment without any DPRELEASE_ setting, then embedded mode under ``home``, no
    rate limit, and ``extra`` (named without the DPRELEASE_ prefix)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPRELEASE_")}
    env |= {"DPRELEASE_HOME": str(home), "PYTHONPATH": str(repo), "DPRELEASE_RATE_LIMIT": ""}
    return env | {f"DPRELEASE_{k}": v for k, v in extra.items()}


@contextmanager
def uvicorn_process(
    env: dict[str, str], repo: Path, log_path: Path
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``uvicorn service.run:app_factory --factory`` (one process) with ``env``; yields its
    URL and process once ``/health`` answers."""
    port = _free_port()
    log = log_path.open("w")
    command = [sys.executable, "-m", "uvicorn", "service.run:app_factory", "--factory"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--no-access-log"]
    proc = subprocess.Popen(
        command,
        env=env,
        cwd=repo,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(log_path.read_text()[-3000:])
            time.sleep(0.2)
        yield url, proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


@contextmanager
def embedded_server(home: Path, repo: Path = ROOT) -> Iterator[str]:
    """``uvicorn service.run:app_factory --factory`` in embedded mode; yields its URL."""
    # The scenarios' load comes from one key: let it fill both upload slots, as two tenants
    # could (one principal alone holds one by default).
    env = embedded_env(home, repo, MAX_CONCURRENT_UPLOADS_PER_PRINCIPAL="2")
    with uvicorn_process(env, repo, home.parent / "server.log") as (url, _):
        yield url


def parquet_bomb(rows: int = 40_000_000) -> bytes:
    zeros = pa.array(np.zeros(rows, dtype=np.int64))
    buffer = io.BytesIO()
    pq.write_table(pa.table({"x": zeros, "y": zeros}), buffer, compression="zstd")
    return buffer.getvalue()


def _idle(url: str, key: str, stop: threading.Event) -> None:
    stop.wait()


def _parquet_bomb_uploads(url: str, key: str, stop: threading.Event) -> None:
    content = parquet_bomb()
    meta = {
        "name": "bomb",
        "label_column": "y",
        "feature_range": [0, 1],
        "classes": [0, 1],
        "budget": {"epsilon": 1, "delta": 1e-5},
    }
    with httpx.Client(timeout=120) as client:
        while not stop.is_set():
            r = client.post(
                f"{url}/datasets",
                files={"file": ("bomb.parquet", content)},
                data={"metadata": json.dumps(meta)},
                headers={"Authorization": f"Bearer {key}"},
            )
            with _LOCK:
                _STATUSES[r.status_code] = _STATUSES.get(r.status_code, 0) + 1


BURST = 400
_burst_sent = 0
_burst_done = threading.Event()


def _toy_dataset(url: str, key: str) -> str:
    rng = np.random.default_rng(0)
    buffer = io.BytesIO()
    np.savez(
        buffer, X=rng.integers(0, 14, (2000, 6)).astype(np.float32), y=rng.integers(0, 3, 2000)
    )
    meta = {
        "name": "burst",
        "feature_range": [0, 13],
        "classes": [0, 1, 2],
        "budget": {"epsilon": 10.0, "delta": 1e-5},
    }
    r = httpx.post(
        f"{url}/datasets",
        files={"file": ("toy.npz", buffer.getvalue())},
        data={"metadata": json.dumps(meta)},
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


_dataset: dict[str, str] = {}


def _release_burst(url: str, key: str, stop: threading.Event) -> None:
    global _burst_sent
    with _LOCK:
        if "id" not in _dataset:
            _dataset["id"] = _toy_dataset(url, key)
    body = {
        "dataset_id": _dataset["id"],
        "mechanism": "dpmix",
        "params": {"mixture_degree": 8, "n_samples": 300},
        "epsilon": 1.0,
        "format": "npz",
    }
    with httpx.Client(timeout=300) as client:
        while True:
            with _LOCK:
                if _burst_sent >= BURST:
                    break
                _burst_sent += 1
            r = client.post(
                f"{url}/releases", json=body, headers={"Authorization": f"Bearer {key}"}
            )
            with _LOCK:
                _STATUSES[r.status_code] = _STATUSES.get(r.status_code, 0) + 1
                if sum(_STATUSES.values()) >= BURST:
                    _burst_done.set()
    stop.wait()


_LOCK = threading.Lock()
_STATUSES: dict[int, int] = {}  # answers to the load's uploads, by status
# name -> (load, background threads)
SCENARIOS: dict[str, tuple[Load, int]] = {
    "idle": (_idle, 1),
    "parquet_bomb": (_parquet_bomb_uploads, 2),
    "release_burst": (_release_burst, 50),
}


@dataclass
class Result:
    scenario: str
    samples: list[float]
    uploads: dict[int, int]

    def row(self) -> str:
        ms = sorted(s * 1000 for s in self.samples)
        p95 = ms[min(len(ms) - 1, int(0.95 * len(ms)))]
        return (
            f"| {self.scenario:<13} | {len(ms):>5} | {statistics.median(ms):>8.2f} | "
            f"{p95:>8.2f} | {ms[-1]:>8.2f} | "
            f"{', '.join(f'{n} x {code}' for code, n in sorted(self.uploads.items())) or '-'} |"
        )


def run(url: str, key: str, name: str, seconds: float) -> Result:
    load, threads = SCENARIOS[name]
    stop = threading.Event()
    _STATUSES.clear()
    workers = [threading.Thread(target=load, args=(url, key, stop)) for _ in range(threads)]
    for w in workers:
        w.start()
    time.sleep(1.0)  # let the load start (the bomb is built in each thread first)
    samples: list[float] = []
    with httpx.Client(timeout=120) as client:
        end = time.monotonic() + seconds
        burst = name == "release_burst"
        while time.monotonic() < end or (burst and not _burst_done.is_set()):
            start = time.perf_counter()
            assert client.get(f"{url}/health").status_code == 200
            samples.append(time.perf_counter() - start)
            time.sleep(0.01)
    stop.set()
    for w in workers:
        w.join()
    return Result(name, samples, dict(_STATUSES))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="polling window per scenario")
    parser.add_argument("--scenario", action="append", choices=sorted(SCENARIOS))
    parser.add_argument("--repo", type=Path, default=ROOT, help="checkout that serves the API")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dprelease-bench-") as tmp:
        home = Path(tmp) / "home"
        with embedded_server(home, args.repo.resolve()) as url:
            admin = (home / "admin.key").read_text().strip()
            r = httpx.post(
                f"{url}/api-keys",
                json={"name": "bench-owner", "role": "owner"},
                headers={"Authorization": f"Bearer {admin}"},
            )
            owner = r.json()["key"]
            results = [run(url, owner, name, args.seconds) for name in args.scenario or SCENARIOS]
    print(f"server: {args.repo.resolve()}")
    print("| scenario      |     n | p50 (ms) | p95 (ms) | max (ms) | load's answers |")
    print("|---------------|-------|----------|----------|----------|----------------|")
    for result in results:
        print(result.row())


if __name__ == "__main__":
    main()
