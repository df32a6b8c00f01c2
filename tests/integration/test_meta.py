"""Liveness, readiness and metrics (issue 14, item 6): /health answers with every worker
thread busy, /ready names the dependency that is down (database, broker, store) in bounded
time without leaking its error text, and /metrics (admin only) counts requests by route
template, ledger decisions, job durations, releases by status and queue depth."""

from __future__ import annotations

import concurrent.futures
import re
import threading
import time

import anyio.to_thread
import pytest
from sqlalchemy import create_engine

from service.storage import S3ObjectStore
from tests.conftest import Harness, free_port, npz_bytes, toy_dataset


def _sample(text: str, name: str, **labels: str) -> float:
    """The value of one sample of the exposition (0 when absent)."""
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name + "{"):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line[: line.rindex("}") + 1]))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _metrics(h: Harness) -> str:
    r = h.client.get("/metrics", headers=h.headers(h.admin_key))
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    return r.text


def test_health_answers_while_every_worker_thread_is_busy(embedded: Harness) -> None:
    """A burst (or an upload being parsed) can take every thread of the pool that runs sync
    endpoints; liveness must not wait for one. The check that a sync endpoint does wait shows
    that the threads really are taken."""
    h = embedded
    portal = h.client.portal  # type: ignore[attr-defined]
    assert portal is not None
    limiter = portal.call(anyio.to_thread.current_default_thread_limiter)
    holders = [object() for _ in range(int(limiter.total_tokens))]
    for holder in holders:
        portal.call(limiter.acquire_on_behalf_of, holder)

    def release() -> None:
        while holders:
            portal.call(limiter.release_on_behalf_of, holders.pop())

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        try:
            health = pool.submit(h.client.get, "/health")
            assert health.result(timeout=10).json() == {"status": "ok"}
            blocked = pool.submit(h.client.get, "/mechanisms", headers=h.headers(h.admin_key))
            time.sleep(0.5)
            assert not blocked.done(), "the pool was not full: this test shows nothing"
            release()
            assert blocked.result(timeout=10).status_code == 200
        finally:
            release()  # before the executor waits for its requests


def test_ready_when_every_dependency_answers(harness: Harness) -> None:
    r = harness.client.get("/ready")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "ready"
    assert set(body["checks"]) == {"database", "broker", "store"}
    assert all(c["ok"] and c["error"] is None for c in body["checks"].values())


def _dead(h: Harness, dependency: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Point ``dependency`` of the app's runtime at a port where nothing listens; the URL."""
    port = free_port()
    runtime = h.runtime
    if dependency == "database":
        url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/nothing"
        monkeypatch.setattr(runtime, "engine", create_engine(url))
    elif dependency == "broker":
        url = f"redis://127.0.0.1:{port}/0"
        settings = runtime.settings.model_copy(update={"celery_broker_url": url})
        monkeypatch.setattr(runtime, "settings", settings)
    else:
        url = f"http://127.0.0.1:{port}"
        settings = runtime.settings.model_copy(update={"s3_endpoint_url": url})
        monkeypatch.setattr(runtime, "store", S3ObjectStore(settings))
    return url


@pytest.mark.parametrize("dependency", ["database", "broker", "store"])
def test_ready_names_the_dependency_that_is_down(
    real: Harness, dependency: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = _dead(real, dependency, monkeypatch)
    r = real.client.get("/ready")
    assert r.status_code == 503, r.text
    body = r.json()
    assert body["status"] == "unavailable"
    failed = {name for name, c in body["checks"].items() if not c["ok"]}
    assert failed == {dependency}
    assert body["checks"][dependency]["error"]
    # The driver's text (hosts, ports, URLs) stays in the log.
    port = url.rsplit(":", 1)[1].split("/")[0]
    assert port not in r.text and "127.0.0.1" not in r.text


@pytest.mark.slow  # a wall-time assertion: kept out of make test-fast
def test_ready_times_out_a_hanging_dependency(
    real: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    from service.meta import readiness

    monkeypatch.setattr(
        real.runtime, "settings", real.runtime.settings.model_copy(update={"ready_timeout_s": 0.2})
    )
    # The check hangs until the test lets it go (at most 3 s), after /ready has answered:
    # the test does not wait out the hung check's thread.
    hung = threading.Event()
    monkeypatch.setitem(readiness.CHECKS, "store", lambda runtime: hung.wait(3))
    start = time.monotonic()
    try:
        r = real.client.get("/ready")
        assert time.monotonic() - start < 2.5
    finally:
        hung.set()
    assert r.status_code == 503
    assert r.json()["checks"]["store"] == {
        "ok": False,
        "seconds": pytest.approx(0.2, abs=0.5),
        "error": "Timeout",
    }


def test_ready_embedded_store_directory_gone(embedded: Harness) -> None:
    root = embedded.runtime.store.root  # type: ignore[attr-defined]
    root.rename(root.with_name("moved"))
    r = embedded.client.get("/ready")
    assert r.status_code == 503
    assert {n for n, c in r.json()["checks"].items() if not c["ok"]} == {"store"}


@pytest.mark.modes("real")
def test_metrics_are_for_admins_only(harness: Harness) -> None:
    owner, _ = harness.new_key("owner")
    assert harness.client.get("/metrics").status_code == 401
    assert harness.client.get("/metrics", headers=harness.headers(owner)).status_code == 403


def test_metrics_count_requests_ledger_jobs_and_releases(harness: Harness) -> None:
    h = harness
    before = _metrics(h)
    owner, _ = h.new_key("owner")
    X, y = toy_dataset()
    dataset = h.upload(owner, npz_bytes(X, y), budget={"epsilon": 2.0, "delta": 1e-5})
    assert dataset.status_code == 201, dataset.text
    dataset_id = dataset.json()["id"]
    assert h.client.get(f"/datasets/{dataset_id}", headers=h.headers(owner)).status_code == 200
    admitted = h.client.post("/releases", json=h.release_body(dataset_id), headers=h.headers(owner))
    assert admitted.status_code == 202, admitted.text
    refused = h.client.post(
        "/releases", json=h.release_body(dataset_id, epsilon=1.5), headers=h.headers(owner)
    )
    assert refused.status_code == 409, refused.text
    done = h.wait(owner, admitted.json()["id"])
    assert done["status"] == "succeeded"
    after = _metrics(h)

    def grew(name: str, **labels: str) -> float:
        return _sample(after, name, **labels) - _sample(before, name, **labels)

    # Route templates, never raw ids.
    route = "/datasets/{dataset_id}"
    assert (
        grew(
            "dprelease_http_request_duration_seconds_count", method="GET", route=route, status="200"
        )
        == 1
    )
    assert dataset_id not in after
    assert grew("dprelease_ledger_decisions_total", decision="admitted") == 1
    assert grew("dprelease_ledger_decisions_total", decision="refused") == 1
    assert grew("dprelease_releases", status="succeeded") == 1
    if h.mode == "embedded":  # in real mode the job ran in the worker (its own exporter)
        assert (
            grew("dprelease_job_duration_seconds_count", mechanism="dpmix", outcome="succeeded")
            == 1
        )
    else:
        settings = h.runtime.settings
        for queue in (settings.cpu_queue, settings.gpu_queue):
            assert f'dprelease_queue_depth{{queue="{queue}"}}' in after
