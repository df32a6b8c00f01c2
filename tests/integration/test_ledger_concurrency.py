"""Admission under real concurrency: many POST /releases released at once by a barrier, each on
its own HTTP connection to uvicorn with several worker processes, near the budget boundary.
Exactly the k releases that dpcore's filter allows are admitted, whatever the order."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from sqlalchemy import create_engine, func, select
from sqlalchemy.orm import Session

from dpcore.accounting import Cost
from dpcore.accounting.filter import Spend, spend
from dpcore.mechanisms.local_perturbation.accounting import LocalPerturbationEvent
from service import bootstrap
from service.budgets.service import ROUNDING_SLACK, charge_of
from service.config import Settings
from service.models import LedgerEntry, Release
from service.runtime import build_runtime
from tests.conftest import ADMIN_KEY, npz_bytes, toy_dataset
from tests.integration.servers import private_redis, settings_env, uvicorn_server
from worker.dispatch import celery_dispatcher

pytestmark = pytest.mark.slow  # bursts of concurrent requests to uvicorn servers

N_ROWS = 40
SIGMA = 16.0  # local_perturbation with σ_x = σ_y = 16: μ = 0.125-GDP per release
DELTA = 1e-5
# A burst from one key is the point here, not the per-key rate limit (test_request_limits).
NO_RATE_LIMIT = ""


def admissible(one: Cost, *, budget: float, upto: int) -> int:
    """How many copies of ``one`` fit the budget, by dpcore's filter; the boundary is
    checked to be far from rounding (so the service's round-up cannot move it)."""
    state, totals = Spend(budget, DELTA), [0.0]
    for _ in range(upto + 1):
        _, state = state.choose(one.epsilon, one.delta, one.rdp, slack=ROUNDING_SLACK)
        assert state.delta <= DELTA  # δ never binds here: ε decides
        totals.append(state.epsilon)
    k = max(j for j in range(upto + 1) if totals[j] <= budget)
    assert totals[k] < budget * (1 - 1e-6) and totals[k + 1] > budget * (1 + 1e-6)
    return k


def _register_admin(settings: Settings) -> None:
    runtime = build_runtime(settings, celery_dispatcher)
    try:
        bootstrap.ensure_admin(runtime)
    finally:
        runtime.engine.dispose()


def race(url: str, database_url: str, *, budget: float, n_requests: int) -> dict[str, Any]:
    """One dataset with ``budget``; ``n_requests`` identical releases at once. Returns what
    was asked, admitted and seen."""
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    with httpx.Client(base_url=url, timeout=60) as c:
        r = c.post("/api-keys", json={"name": "racer", "role": "owner"}, headers=admin)
        assert r.status_code == 201, r.text
        auth = {"Authorization": f"Bearer {r.json()['key']}"}
        meta = (
            '{"name": "race", "feature_range": [0, 13], "classes": [0, 1, 2], '
            f'"budget": {{"epsilon": {budget}, "delta": {DELTA}}}}}'
        )
        r = c.post(
            "/datasets",
            files={"file": ("d.npz", npz_bytes(*toy_dataset(n=N_ROWS, d=4)))},
            data={"metadata": meta},
            headers=auth,
        )
        assert r.status_code == 201, r.text
        dataset_id = r.json()["id"]
        body = {
            "dataset_id": dataset_id,
            "mechanism": "local_perturbation",
            "noise": {"sigma_x": SIGMA},
            "delta": DELTA / 1000,  # the same cost for every request
            "format": "npz",
        }
        charge = c.post("/releases/preview", json=body, headers=auth).json()["charge"]
    event = LocalPerturbationEvent(N_ROWS, SIGMA, SIGMA)
    assert charge["epsilon"] >= event.epsilon(DELTA)  # rounded against the user
    one = Cost(epsilon=charge["epsilon"], delta=charge["delta"], mu=event.mu)
    k = admissible(one, budget=budget, upto=n_requests)
    assert 1 <= k < n_requests

    # One keep-alive connection per request, opened (and used once) before the race.
    address = urlsplit(url)
    connections = [
        http.client.HTTPConnection(address.hostname or "", address.port, timeout=120)
        for _ in range(n_requests)
    ]
    for conn in connections:
        conn.request("GET", "/health")
        assert conn.getresponse().read() == b'{"status":"ok"}'
    payload = json.dumps(body)
    headers = {**auth, "Content-Type": "application/json"}
    barrier = threading.Barrier(n_requests)
    answers: list[tuple[int, Any, float, float] | None] = [None] * n_requests

    def go(i: int) -> None:
        barrier.wait()
        start = time.monotonic()
        connections[i].request("POST", "/releases", body=payload, headers=headers)
        response = connections[i].getresponse()
        answers[i] = (response.status, json.loads(response.read()), start, time.monotonic())

    threads = [threading.Thread(target=go, args=(i,)) for i in range(n_requests)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for conn in connections:
        conn.close()
    assert all(a is not None for a in answers)
    done = [a for a in answers if a is not None]
    codes = [a[0] for a in done]
    assert set(codes) <= {202, 409}, [a for a in done if a[0] not in (202, 409)][:3]
    assert all(a[1]["error"]["code"] == "budget_exceeded" for a in done if a[0] == 409)
    # Requests in flight at once: the largest number whose intervals share an instant.
    overlap = max(sum(1 for a in done if a[2] <= b[2] < a[3]) for b in done)

    with httpx.Client(base_url=url, timeout=60, headers=auth) as c:
        ledger = c.get(f"/budgets/{dataset_id}").json()
    engine = create_engine(database_url)
    with Session(engine) as session:
        entries = list(
            session.scalars(select(LedgerEntry).where(LedgerEntry.dataset_id == dataset_id))
        )
        releases = session.scalar(
            select(func.count()).select_from(Release).where(Release.dataset_id == dataset_id)
        )
    engine.dispose()
    holding = [e for e in entries if e.state in ("reserved", "committed")]
    return {
        "k": k,
        "accepted": codes.count(202),
        "refused": codes.count(409),
        "overlap": overlap,
        "ledger": ledger,
        "entries": len(entries),
        "releases": releases,
        "composed": spend(budget, DELTA, [charge_of(e) for e in holding]).epsilon,
        "budget": budget,
    }


def check(outcome: dict[str, Any], n_requests: int) -> None:
    assert outcome["accepted"] == outcome["k"], outcome
    assert outcome["refused"] == n_requests - outcome["k"]
    # Refused requests leave nothing behind: no release row, no ledger entry.
    assert outcome["entries"] == outcome["releases"] == outcome["k"]
    assert len(outcome["ledger"]["entries"]) == outcome["k"]
    assert outcome["composed"] <= outcome["budget"]
    assert outcome["composed"] <= outcome["ledger"]["reserved"] <= outcome["budget"]
    assert outcome["overlap"] > 1  # the requests really were in flight together


@pytest.fixture
def real_server(real_services: dict[str, Any], tmp_path: Path) -> Iterator[tuple[str, str]]:
    """The API under uvicorn (2 processes) on the session's Postgres and S3; jobs go to a
    private Redis that no worker reads (the race is about admission)."""
    with private_redis(tmp_path / "redis") as broker:
        settings: Settings = real_services["settings"].model_copy(
            update={"celery_broker_url": broker}
        )
        _register_admin(settings)
        assert settings.database_url is not None
        env = settings_env(settings, RATE_LIMIT=NO_RATE_LIMIT)
        with uvicorn_server(env, workers=2, log=tmp_path / "uvicorn.log") as url:
            yield url, settings.database_url


def test_concurrent_releases_postgres(real_server: tuple[str, str]) -> None:
    url, database_url = real_server
    n_requests = 100
    outcomes = [
        race(url, database_url, budget=budget, n_requests=n_requests) for budget in (1.0, 2.0, 2.75)
    ]
    for outcome in outcomes:
        check(outcome, n_requests)
    print(
        "postgres races:",
        [(o["budget"], n_requests, o["accepted"], o["overlap"]) for o in outcomes],
    )


def test_concurrent_releases_sqlite(tmp_path: Path) -> None:
    """Embedded mode: SQLite's BEGIN IMMEDIATE stands for the row lock, across processes."""
    settings = Settings(home=tmp_path / "home", admin_key=ADMIN_KEY)  # type: ignore[call-arg,arg-type]
    bootstrap.prepare(settings)
    _register_admin(settings)
    n_requests = 50
    env = settings_env(settings, RATE_LIMIT=NO_RATE_LIMIT)
    with uvicorn_server(env, workers=1, log=tmp_path / "uvicorn.log") as url:
        outcome = race(url, settings.effective_database_url, budget=2.0, n_requests=n_requests)
    check(outcome, n_requests)
    print("sqlite race:", (outcome["budget"], n_requests, outcome["accepted"], outcome["overlap"]))
