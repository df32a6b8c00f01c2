"""Harnesses that run the real app in both modes.

- embedded: SQLite and a local object store under a temporary home, jobs run in-process;
- real: Postgres (``DPRELEASE_TEST_DATABASE_URL``) built from the migrations, a moto S3 server
  behind a SigV4-verifying front (tests/sigv4_s3.py: every request, presigned URLs included,
  must be signed with the configured credentials) on a free port reached over HTTP, and a
  Celery worker consuming from Redis (``DPRELEASE_TEST_REDIS_URL``).

Which mode a test runs in. ``harness`` and ``toy_harness`` run a test once per mode; that is
for tests whose subject the mode changes: the object store (S3 or local files, presigned
redirects or streamed downloads), the job path (Celery worker or in-process threads, retries,
shutdown, sharding), the database dialect (row locks, constraints and triggers, timestamps),
concurrency, the outbox and sweeper, idempotency, failure and crash handling, and settings
that differ by mode (rate-limit storage, readiness checks, metrics exporters). A test whose
subject does not depend on the mode (request validation, schemas, error mapping, permission
matrices, accounting shown through the API, guidance texts, mechanism outputs) runs once,
marked ``@pytest.mark.modes("real")`` (the production setup) or
``@pytest.mark.modes("embedded")`` where embedded behaviour is what it shows; the marker
applies to ``harness`` or ``toy_harness`` however the test reaches it (through another
fixture included); a test without it runs in both. A test that needs one mode's own objects
(its S3 server, its worker) asks for the ``real`` or ``embedded`` fixture directly.
"""

from __future__ import annotations

import atexit
import functools
import gc
import io
import json
import os
import shutil
import socket
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from service import bootstrap
from service.app import create_app
from service.config import Settings
from service.releases.status import TERMINAL
from service.runtime import Runtime, build_runtime
from worker.dispatch import default_dispatcher

TEST_DATABASE_URL = os.environ.get(
    "DPRELEASE_TEST_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/dprelease_test"
)
TEST_REDIS_URL = os.environ.get("DPRELEASE_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
ADMIN_KEY = "dpr_test-admin-key-" + "x" * 32
# The one identity the real mode's S3 server accepts (tests/sigv4_s3.py checks every signature).
S3_ACCESS_KEY = "DPRTESTACCESSKEY"
S3_SECRET_KEY = "dpr-test-s3-secret-" + "s" * 21
TESTS = Path(__file__).resolve().parent
# The tier of a test is its folder: marker `unit` (no services) or `integration`.
TIERS = {"unit": pytest.mark.unit, "integration": pytest.mark.integration}
MODES = ("embedded", "real")
HARNESSES = ("harness", "toy_harness")
TEST_RETRY_WINDOW_S = 2.0


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "modes(*names): run the test's harness or toy_harness in these modes only "
        "(embedded, real); without it, in both",
    )


# Net allocations of tracked objects between two young-generation collections of Python's
# cyclic garbage collector (700 by default), and the collections of each generation between
# two of the next.
GC_THRESHOLDS = (20_000, 20, 20)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Once the tests are collected, what the process holds (torch, scipy, pandas, the app,
    the collected items: millions of objects, alive to the end) is frozen out of the cyclic
    collector's walks, and young collections run less often: request-heavy tests allocate
    many short-lived objects, and the collector's passes took about a sixth of their CPU
    (docs/results/ci_time.md). This process only: the servers, workers and CLIs that tests
    start as processes of their own keep Python's defaults."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


@pytest.hookimpl(tryfirst=True)  # before pytest reads the parametrize markers
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``@pytest.mark.modes(...)``: the harness the test reaches, in those modes only (an
    indirect parametrize marker, which takes the place of the fixture's own params)."""
    marker = metafunc.definition.get_closest_marker("modes")
    if marker is None:
        return
    modes = list(marker.args)
    if not modes or not set(modes) <= set(MODES) or len(set(modes)) != len(modes):
        raise pytest.UsageError(
            f"{metafunc.definition.nodeid}: modes{tuple(modes)}: name modes of {MODES}"
        )
    used = [name for name in HARNESSES if name in metafunc.fixturenames]
    if len(used) != 1:
        raise pytest.UsageError(
            f"{metafunc.definition.nodeid}: modes() needs exactly one of {HARNESSES}"
        )
    metafunc.definition.add_marker(pytest.mark.parametrize(used[0], modes, indirect=True))


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(TESTS):
            marker = TIERS.get(item.path.relative_to(TESTS).parts[0])
            if marker is not None:
                item.add_marker(marker)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def npz_bytes(X: np.ndarray, y: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, X=X, y=y)
    return buffer.getvalue()


def toy_dataset(n: int = 200, d: int = 6, k: int = 3, seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, size=n)
    X = rng.uniform(0, 10, size=(n, d)) + y[:, None]
    return X, y


@dataclass
class Harness:
    mode: str
    client: TestClient
    runtime: Runtime
    admin_key: str
    keys: dict[str, str] = field(default_factory=dict)

    def headers(self, key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"}

    def new_key(self, role: str, name: str | None = None) -> tuple[str, str]:
        """A fresh principal with ``role``: (key, principal_id)."""
        r = self.client.post(
            "/api-keys",
            json={"name": name or f"{role}-{uuid.uuid4().hex[:6]}", "role": role},
            headers=self.headers(self.admin_key),
        )
        assert r.status_code == 201, r.text
        body = r.json()
        return body["key"], body["principal_id"]

    def upload(
        self,
        key: str,
        content: bytes,
        *,
        filename: str = "data.npz",
        metadata: dict[str, Any] | None = None,
        **overrides: Any,
    ) -> Any:
        meta = metadata or {
            "name": "toy",
            "feature_range": [0, 13],
            "classes": [0, 1, 2],  # toy_dataset's labels (releases need declared classes)
            "budget": {"epsilon": 5.0, "delta": 1e-5},
        }
        meta.update(overrides)
        return self.client.post(
            "/datasets",
            files={"file": (filename, content)},
            data={"metadata": json.dumps(meta)},
            headers=self.headers(key),
        )

    def release_body(self, dataset_id: str, **overrides: Any) -> dict[str, Any]:
        body: dict[str, Any] = {
            "dataset_id": dataset_id,
            "mechanism": "dpmix",
            "params": {"mixture_degree": 8, "n_samples": 300},
            "epsilon": 1.0,
            "format": "npz",
        }
        body.update(overrides)
        return body

    def cli(self, key: str, *args: str) -> Any:
        """Run ``dprelease`` with ``key`` against this app; its JSON output (exit code 0)."""
        from click.testing import CliRunner

        from dprelease_cli.main import CliState, cli

        result = CliRunner().invoke(
            cli,
            ["--url", "http://testserver", "--key", key, *args],
            obj=CliState(http=self.client),
            catch_exceptions=False,
        )
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    def wait_for(
        self,
        key: str,
        release_id: str,
        predicate: Callable[[dict[str, Any]], bool],
        timeout: float = 60.0,
    ) -> dict[str, Any]:
        """The release as soon as ``predicate`` holds of it (polled every 20 ms)."""
        deadline = time.monotonic() + timeout
        while True:
            r = self.client.get(f"/releases/{release_id}", headers=self.headers(key))
            assert r.status_code == 200, r.text
            body: dict[str, Any] = r.json()
            if predicate(body):
                return body
            if time.monotonic() > deadline:
                raise AssertionError(f"release {release_id}: {body}")
            time.sleep(0.02)

    def wait(self, key: str, release_id: str, timeout: float = 120.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            r = self.client.get(f"/releases/{release_id}", headers=self.headers(key))
            assert r.status_code == 200, r.text
            body: dict[str, Any] = r.json()
            if body["status"] in TERMINAL:
                return body
            if time.monotonic() > deadline:
                raise AssertionError(f"release {release_id} still {body['status']}")
            time.sleep(0.05)

    def download(
        self, key: str, release_id: str, artifact: str | None = None, fmt: str | None = None
    ) -> bytes:
        """The release's file (in ``fmt``, when given), or its further file named
        ``artifact`` ("raw": the owner's raw rows)."""
        path = "download" if artifact is None else f"artifacts/{artifact}"
        path = "raw" if artifact == "raw" else path
        path += f"?format={fmt}" if fmt is not None else ""
        r = self.client.get(
            f"/releases/{release_id}/{path}", headers=self.headers(key), follow_redirects=False
        )
        if r.status_code == 307:
            import httpx

            # Fetch the presigned URL as a browser would: without our API key.
            direct = httpx.get(r.headers["location"])
            assert direct.status_code == 200, direct.text
            return direct.content
        assert r.status_code == 200, r.text
        return r.content

    def as_drawn(self, key: str, release_id: str) -> bytes | None:
        """The owner's copy of the rows as drawn, where the release differs from them (None:
        the release is the rows as drawn)."""
        r = self.client.get(
            f"/releases/{release_id}/raw", headers=self.headers(key), follow_redirects=False
        )
        if r.status_code == 404 and "no separate raw copy" in r.text:
            return None
        return self.download(key, release_id, "raw")


@functools.cache
def _migrated_sqlite() -> Path:
    """A SQLite database built by the migrations, once per test process: an embedded home
    starts from a copy, which ``bootstrap.prepare`` then finds at head (migrating every home
    from scratch cost more than most tests; docs/results/ci_time.md)."""
    where = tempfile.mkdtemp(prefix="dprelease-template-")
    atexit.register(shutil.rmtree, where, ignore_errors=True)
    template = Path(where) / "template.db"
    bootstrap.upgrade(f"sqlite:///{template}")
    return template


def _start_from_migrated_copy(settings: Settings) -> None:
    """An embedded home's database as a copy of ``_migrated_sqlite``, unless the home has one
    already (a restarted runtime keeps its data) or migrations are off."""
    if not settings.run_migrations or settings.database_url:
        return
    database = Path(make_url(settings.effective_database_url).database or "")
    if database.exists():
        return
    database.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_migrated_sqlite(), database)


def _embedded_runtime(home: Path, **overrides: Any) -> Runtime:
    # One job thread unless a test asks for more: the lifecycle tests hold one release at the
    # toy's gate to keep the next one queued (tests/integration/test_bounded_jobs.py runs the
    # default pool of DPRELEASE_JOB_THREADS=2).
    # Retries wait TEST_RETRY_WINDOW_S in all, not a minute: tests that make a job retry
    # would otherwise wait for it (test_store_outage_retries.py sets the real default).
    settings = Settings(  # type: ignore[call-arg]
        home=home, **{"job_threads": 1, "task_retry_window_s": TEST_RETRY_WINDOW_S, **overrides}
    )
    _start_from_migrated_copy(settings)
    bootstrap.prepare(settings)
    return build_runtime(settings, default_dispatcher)


@contextmanager
def embedded_harness(
    home: Path, monkeypatch: pytest.MonkeyPatch, **overrides: Any
) -> Iterator[Harness]:
    """An embedded app on ``home`` (settings ``overrides`` on top), none of this process's
    DPRELEASE_ variables but the tests' own."""
    for var in [v for v in os.environ if v.startswith("DPRELEASE_") and "TEST" not in v]:
        monkeypatch.delenv(var)
    runtime = _embedded_runtime(home, **overrides)
    app = create_app(runtime=runtime)
    with TestClient(app) as client:
        admin = (home / "admin.key").read_text().strip()
        yield Harness("embedded", client, runtime, admin)
    runtime.dispatcher.shutdown()
    runtime.engine.dispose()


@pytest.fixture
def embedded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    with embedded_harness(tmp_path / "home", monkeypatch) as harness:
        yield harness


def reset_database(url: str) -> None:
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text("DROP SCHEMA public CASCADE"))
        conn.execute(text("CREATE SCHEMA public"))
    engine.dispose()


@contextmanager
def scratch_database(base_url: str) -> Iterator[str]:
    """A database of its own for this test session, so concurrent runs never share state."""
    server, _, base_name = base_url.rpartition("/")
    name = f"{base_name}_{uuid.uuid4().hex[:10]}"
    admin = create_engine(f"{server}/{base_name}", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield f"{server}/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(scope="session")
def real_services() -> Iterator[dict[str, Any]]:
    """Postgres migrated from scratch, a signature-checking S3 server (moto behind
    tests/sigv4_s3.py) and a Celery worker on Redis, all private to this session (own
    database, bucket and queues). The worker consumes both lanes of the CPU and the GPU
    pool, as a CPU-only deployment's single worker does. ``s3`` is the server:
    ``s3.verifier.offset`` moves its clock (restore it), ``s3.verifier.refusals`` lists what
    it refused."""
    from celery.contrib.testing.worker import start_worker

    from tests.sigv4_s3 import SigV4S3Server
    from worker import celery_app as celery_module

    port = free_port()
    s3 = SigV4S3Server(port, access_key=S3_ACCESS_KEY, secret_key=S3_SECRET_KEY)
    s3.start()
    queue = f"dprelease-test-{uuid.uuid4().hex[:8]}"
    with scratch_database(TEST_DATABASE_URL) as database_url:
        bootstrap.upgrade(database_url)
        settings = Settings(  # type: ignore[call-arg]
            database_url=database_url,
            cpu_queue=f"{queue}-cpu",
            gpu_queue=f"{queue}-gpu",
            long_queue=f"{queue}-long",
            gpu_long_queue=f"{queue}-gpu-long",
            celery_broker_url=TEST_REDIS_URL,
            s3_endpoint_url=s3.endpoint_url,
            s3_bucket=f"dprelease-test-{uuid.uuid4().hex[:8]}",
            s3_access_key_id=S3_ACCESS_KEY,
            s3_secret_access_key=S3_SECRET_KEY,  # type: ignore[arg-type]
            admin_key=ADMIN_KEY,  # type: ignore[arg-type]
            task_max_attempts=2,
            task_retry_window_s=TEST_RETRY_WINDOW_S,
        )
        worker_runtime = build_runtime(settings, default_dispatcher)
        celery_module.configure(worker_runtime)
        app = celery_module.celery_app
        app.conf.broker_url = TEST_REDIS_URL
        app.conf.task_default_queue = settings.cpu_queue
        # Every pool's two lanes: the worker of a CPU-only deployment that runs one worker.
        queues = [
            settings.cpu_queue,
            settings.long_queue,
            settings.gpu_queue,
            settings.gpu_long_queue,
        ]
        try:
            with start_worker(
                app, pool="solo", perform_ping_check=False, shutdown_timeout=30, queues=queues
            ):
                yield {"settings": settings, "worker_runtime": worker_runtime, "s3": s3}
        finally:
            celery_module.configure(None)
            worker_runtime.engine.dispose()
            s3.stop()


@pytest.fixture
def real(real_services: dict[str, Any]) -> Iterator[Harness]:
    runtime = build_runtime(real_services["settings"], default_dispatcher)
    app = create_app(runtime=runtime)
    with TestClient(app) as client:
        yield Harness("real", client, runtime, ADMIN_KEY)
    runtime.engine.dispose()


@pytest.fixture(params=MODES)
def harness(request: pytest.FixtureRequest) -> Harness:
    """Each test using this runs once per mode, through the same code path; with a ``modes``
    marker, in the modes it names only (the module's docstring says when)."""
    h: Harness = request.getfixturevalue(request.param)
    return h


@pytest.fixture(params=MODES)
def toy_harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    """``harness`` with the test-only mechanism (tests/toy_mechanism.py) registered before the
    app is built, so the API serves it. Its gate is open when the test starts and opened again
    when it ends, so a test that fails while holding a job never blocks the next one."""
    from dpcore.mechanisms import registry
    from tests import toy_mechanism as toy

    toy.GATE.set()
    with registry.registered(toy.SPEC):
        try:
            yield request.getfixturevalue(request.param)
        finally:
            toy.GATE.set()
