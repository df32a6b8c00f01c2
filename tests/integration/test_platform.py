"""Storage, migrations, OpenAPI drift, settings, worker idempotency and concurrent admission."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from pydantic import ValidationError
from sqlalchemy import select

from dpcore.accounting.filter import Spend
from dpcore.mechanisms.dpmix.accounting import DPMixEvent
from service import bootstrap, openapi_export
from service.budgets.service import round_up
from service.config import Settings
from service.models import LedgerEntry, Release
from service.storage import LocalObjectStore, ObjectExists
from tests.conftest import (
    TEST_DATABASE_URL,
    Harness,
    npz_bytes,
    scratch_database,
    toy_dataset,
)
from worker import production, runner

ROOT = Path(__file__).resolve().parents[2]


def test_object_stores_are_create_only(harness: Harness) -> None:
    store = harness.runtime.store
    store.put("probe/a", b"one")
    with pytest.raises(ObjectExists):
        store.put("probe/a", b"two")
    assert store.get("probe/a") == b"one" and store.exists("probe/a")
    store.delete("probe/a")
    assert not store.exists("probe/a")


def test_local_store_rejects_escaping_keys(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    with pytest.raises(ValueError, match="escapes"):
        store.put("../outside", b"x")


def _upgrade_check_downgrade(url: str) -> None:
    config = bootstrap.alembic_config(url)
    command.upgrade(config, "head")
    command.check(config)  # raises if the models and the migrations disagree
    command.downgrade(config, "base")
    command.upgrade(config, "head")


def test_migrations_sqlite(tmp_path: Path) -> None:
    _upgrade_check_downgrade(f"sqlite:///{tmp_path / 'm.db'}")


def test_migrations_postgres() -> None:
    with scratch_database(TEST_DATABASE_URL) as url:
        _upgrade_check_downgrade(url)


def test_upgrade_runs_alembic_only_below_head(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'h.db'}"
    assert not bootstrap.at_head(url)
    bootstrap.upgrade(url)
    assert bootstrap.at_head(url)
    ran: list[str] = []
    monkeypatch.setattr(command, "upgrade", lambda config, target: ran.append(target))
    bootstrap.upgrade(url)
    assert ran == []  # at head: left untouched
    command.downgrade(bootstrap.alembic_config(url), "-1")
    assert not bootstrap.at_head(url)
    bootstrap.upgrade(url)
    assert ran == ["head"]


def test_openapi_is_committed_and_current() -> None:
    committed = (ROOT / "openapi" / "openapi.json").read_text()
    assert committed == openapi_export.render(), "run `make openapi` and commit the result"
    schema = json.loads(committed)
    # Every operation declares its error statuses with the shared error body.
    for path, methods in schema["paths"].items():
        for method, op in methods.items():
            if path in {"/health", "/ready"}:  # the probes: no key
                continue
            assert "401" in op["responses"], (method, path)
            assert "ErrorResponse" in json.dumps(op["responses"]["401"]), (method, path)


def test_real_mode_refuses_unsafe_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("DPRELEASE_ADMIN_KEY", "DPRELEASE_S3_BUCKET", "DPRELEASE_CELERY_BROKER_URL"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValidationError, match="DPRELEASE_ADMIN_KEY must be set"):
        Settings(database_url="postgresql+psycopg://x/y")  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="at least 32"):
        Settings(database_url="postgresql+psycopg://x/y", admin_key="short")  # type: ignore[call-arg,arg-type]
    ok = Settings(  # type: ignore[call-arg]
        database_url="postgresql+psycopg://x/y",
        admin_key="k" * 32,  # type: ignore[arg-type]
        s3_bucket="b",
        celery_broker_url="redis://localhost",
    )
    assert not ok.embedded
    assert Settings().embedded  # type: ignore[call-arg]


def _queued_release(h: Harness) -> tuple[str, str]:
    owner, _ = h.new_key("owner")
    ds = h.upload(owner, npz_bytes(*toy_dataset())).json()
    r = h.client.post(
        "/releases",
        json=h.release_body(ds["id"], params={"mixture_degree": 4, "n_samples": 40}),
        headers=h.headers(owner),
    )
    assert r.status_code == 202
    return owner, r.json()["id"]


def test_job_is_idempotent_and_never_redraws_noise(embedded: Harness) -> None:
    h = embedded
    owner, rid = _queued_release(h)
    done = h.wait(owner, rid)
    first = h.download(owner, rid)
    # Re-running a finished job changes nothing.
    runner.execute(h.runtime, rid)
    assert h.wait(owner, rid) == done
    # A job whose artifact was stored but not recorded finishes from the stored bytes.
    with h.runtime.session_factory() as session, session.begin():
        release = session.get(Release, rid)
        assert release is not None
        release.status, release.artifact_sha256 = "running", None
        entry = session.scalars(select(LedgerEntry).where(LedgerEntry.release_id == rid)).one()
        entry.state = "reserved"
    runner.execute(h.runtime, rid)
    again = h.wait(owner, rid)
    assert again["status"] == "succeeded"
    assert h.download(owner, rid) == first
    assert again["artifact"]["sha256"] == done["artifact"]["sha256"]
    ledger = h.client.get(f"/budgets/{done['dataset_id']}", headers=h.headers(owner)).json()
    assert [e["state"] for e in ledger["entries"]] == ["committed"]


def test_attempts_are_bounded(embedded: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    h = embedded
    calls: list[str] = []

    def flaky(*_args: Any, **_kwargs: Any) -> None:
        calls.append("x")
        raise ConnectionError("object store unreachable")

    monkeypatch.setattr(production, "produce", flaky)
    monkeypatch.setattr("worker.attempts.time.sleep", lambda _s: None)
    owner, rid = _queued_release(h)
    done = h.wait(owner, rid)
    assert done["status"] == "failed" and "gave up after 3 attempts" in done["error"]
    assert len(calls) == 3 and done["attempts"] == 3
    ledger = h.client.get(f"/budgets/{done['dataset_id']}", headers=h.headers(owner)).json()
    assert [e["state"] for e in ledger["entries"]] == ["refunded"]


def test_concurrent_admissions_never_overspend(real: Harness) -> None:
    """Many requests at once near the boundary: the locked budget row admits exactly those
    that fit (issue 5 repeats this at a larger scale)."""
    h = real
    owner, _ = h.new_key("owner")
    ds = h.upload(
        owner,
        npz_bytes(*toy_dataset()),
        budget={"epsilon": 1.0, "delta": 1e-5},
    ).json()
    body = h.release_body(
        ds["id"], noise={"sigma_x": 1.0}, params={"mixture_degree": 8, "n_samples": 20}
    )
    del body["epsilon"]
    body["delta"] = 1e-6  # the same cost for every request, whatever was admitted before
    cost = h.client.post("/releases/preview", json=body, headers=h.headers(owner)).json()
    event = DPMixEvent(200, 8, 20, 1.0, 1.0)
    # The ledger's filter, run by dpcore alone on the same sequence of identical costs.
    state, admissible = Spend(1.0, 1e-5), 0
    while admissible < 12:
        _, state = state.choose(cost["charge"]["epsilon"], 1e-6, event.rdp(), slack=1e-9)
        if not (round_up(state.epsilon) <= 1.0 and state.delta <= 1e-5):
            break
        admissible += 1
    assert 1 < admissible < 12
    barrier = threading.Barrier(12)
    codes: list[int] = []

    def go() -> None:
        barrier.wait()
        r = h.client.post("/releases", json=body, headers=h.headers(owner))
        codes.append(r.status_code)

    threads = [threading.Thread(target=go) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    accepted = codes.count(202)
    assert set(codes) <= {202, 409} and accepted == admissible
    ledger = h.client.get(f"/budgets/{ds['id']}", headers=h.headers(owner)).json()
    assert len(ledger["entries"]) == accepted
    assert ledger["reserved"] <= 1.0
    # One more would not have fitted: the admitted number is exactly the admissible one.
    extra = h.client.post("/releases/preview", json=body, headers=h.headers(owner)).json()
    assert extra["budget"]["admissible"] is False
