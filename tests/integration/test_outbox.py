"""No release left in limbo (issue 14, item 1): the committed queued release is the outbox.

- A broker that is down when a release is admitted: the answer is still 202 with the id (the
  release and its reservation are committed), and the sweeper hands the release over once the
  broker is back; nothing is reserved twice. Any unhandled error answers JSON.
- An object store that is down on a job's last attempt: the release ends failed, settled from
  its recorded upload claim (refunded without one, charged with one) without a call to the
  store; and a release left running past its last attempt is ended by the sweeper.
- The sweeper's lease: of two sweepers at once, one sweeps.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from botocore.exceptions import EndpointConnectionError
from fastapi.testclient import TestClient
from sqlalchemy import delete, select, update

from service.db import transaction
from service.models import LedgerEntry, Release, SweeperLease, utcnow
from service.releases import lifecycle
from service.releases import service as release_service
from service.releases.mechanisms import worker_queue
from service.releases.status import ReleaseStatus
from service.releases.sweeper import Sweeper
from service.runtime import Dispatcher, Route, Runtime
from service.storage import S3ObjectStore
from tests.conftest import Harness, free_port, npz_bytes, toy_dataset
from worker import runner


class Broker:
    """A dispatcher double: down (every enqueue raises, as Celery does when Redis does not
    answer) until brought up, then hands jobs to ``inner`` (none: only records them, for
    ``deliver`` to hand over later)."""

    def __init__(self, inner: Dispatcher | None = None, *, down: bool = True) -> None:
        self.inner, self.down = inner, down
        self.tried: list[str] = []
        self.sent: list[str] = []
        self._queues: list[Route] = []
        self._lock = threading.Lock()

    def enqueue(self, release_id: str, queue: Route) -> None:
        with self._lock:
            self.tried.append(release_id)
            if self.down:
                raise ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
            self.sent.append(release_id)
            self._queues.append(queue)
        if self.inner is not None:
            self.inner.enqueue(release_id, queue)

    def deliver(self, to: Dispatcher) -> None:
        """Hand every job this broker took over to ``to``, to the queue it was sent to."""
        for release_id, queue in zip(self.sent, self._queues, strict=True):
            to.enqueue(release_id, queue)

    def shutdown(self) -> None:
        if self.inner is not None:
            self.inner.shutdown()


class DeadStore:
    """An object store that does not answer; counts the calls made to it."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Callable[..., Any]:
        def unreachable(*_args: Any, **_kwargs: Any) -> Any:
            self.calls.append(name)
            raise EndpointConnectionError(endpoint_url="http://127.0.0.1:1")

        return unreachable


@pytest.fixture
def broker(harness: Harness) -> Any:
    """The harness's dispatcher behind a broker that starts down; restored afterwards."""
    real = harness.runtime.dispatcher
    double = Broker(real)
    harness.runtime.dispatcher = double
    try:
        yield double
    finally:
        harness.runtime.dispatcher = real


def _free_lease(runtime: Runtime) -> None:
    # Real mode shares one database across the session: start from no lease.
    with transaction(runtime.session_factory) as session:
        session.execute(delete(SweeperLease))


def _park_other_queued(runtime: Runtime, release_id: str) -> None:
    """Real mode shares one database across the session: releases other tests left queued
    (older, so first in a pass, which stops at the first failed hand-over) are made not due,
    so a pass here sees this test's release only."""
    with transaction(runtime.session_factory) as session:
        session.execute(
            update(Release)
            .where(Release.status == ReleaseStatus.queued, Release.id != release_id)
            .values(touched_at=datetime(9999, 1, 1, tzinfo=UTC))
            .execution_options(synchronize_session=False)
        )


def _later(seconds: float) -> Callable[[], datetime]:
    return lambda: utcnow() + timedelta(seconds=seconds)


def _dataset(h: Harness) -> tuple[str, str]:
    owner, _ = h.new_key("owner")
    ds = h.upload(owner, npz_bytes(*toy_dataset())).json()
    return owner, ds["id"]


def _audit_actions(h: Harness, release_id: str) -> list[str]:
    """The audit trail's actions on the release, oldest first."""
    events = h.client.get(
        "/audit", params={"object_id": release_id}, headers=h.headers(h.admin_key)
    ).json()
    return [e["action"] for e in events["items"]]


def _entries(h: Harness, release_id: str) -> list[str]:
    with h.runtime.session_factory() as session:
        stmt = select(LedgerEntry.state).where(LedgerEntry.release_id == release_id)
        return list(session.scalars(stmt))


def _release(h: Harness, release_id: str) -> Release:
    with h.runtime.session_factory() as session:
        release = session.get(Release, release_id)
        assert release is not None
        session.expunge(release)
        return release


def test_broker_down_at_admission_answers_202_and_the_sweeper_resends(
    harness: Harness, broker: Broker
) -> None:
    h = harness
    owner, dataset_id = _dataset(h)
    body = h.release_body(dataset_id, params={"mixture_degree": 4, "n_samples": 40})
    r = h.client.post("/releases", json=body, headers=h.headers(owner))
    # Committed with its reservation: 202 with the id, JSON, as when the broker is up.
    assert r.status_code == 202, r.text
    assert r.headers["content-type"].startswith("application/json")
    release_id = r.json()["id"]
    assert r.json()["status"] == "queued"
    assert broker.tried == [release_id] and broker.sent == []
    assert _entries(h, release_id) == ["reserved"]

    _free_lease(h.runtime)
    _park_other_queued(h.runtime, release_id)
    settings = h.runtime.settings
    # Not due yet: nothing is sent before the threshold.
    fresh = Sweeper(h.runtime, holder="test-sweeper").sweep()
    assert fresh is not None and release_id not in fresh.resent
    # Due, but the broker is still down: it stays queued, due again at the next pass.
    due = _later(settings.sweep_queued_after_s + 1)
    first = Sweeper(h.runtime, holder="test-sweeper", clock=due).sweep()
    assert first is not None and release_id not in first.resent
    assert _release(h, release_id).status == "queued"
    assert broker.tried.count(release_id) == 2

    broker.down = False
    second = Sweeper(
        h.runtime, holder="test-sweeper", clock=_later(2 + settings.sweep_queued_after_s)
    ).sweep()
    assert second is not None and release_id in second.resent
    assert broker.sent.count(release_id) == 1
    done = h.wait(owner, release_id)
    assert done["status"] == "succeeded"
    # One reservation, committed once; the dataset's budget shows this one release only.
    assert _entries(h, release_id) == ["committed"]
    budget = h.client.get(f"/budgets/{dataset_id}", headers=h.headers(owner)).json()
    assert [e["state"] for e in budget["entries"]] == ["committed"]
    # Handed over again only while queued: a finished release is never sent again.
    third = Sweeper(
        h.runtime, holder="test-sweeper", clock=_later(3 + 2 * settings.sweep_queued_after_s)
    ).sweep()
    assert third is not None and release_id not in third.resent


def test_unhandled_errors_answer_json(embedded: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    h = embedded
    owner, _ = h.new_key("owner")

    def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("private detail that must not be shown")

    monkeypatch.setattr(release_service, "get", broken)
    client = TestClient(h.client.app, raise_server_exceptions=False)
    r = client.get("/releases/some-id", headers=h.headers(owner))
    assert r.status_code == 500
    assert r.headers["content-type"].startswith("application/json")
    assert r.json() == {
        "error": {"code": "internal_error", "message": "internal server error", "detail": {}}
    }


def _held(h: Harness) -> tuple[str, str, Broker]:
    """A queued release whose job is not run (the dispatcher only records it)."""
    held = Broker(down=False)
    real, h.runtime.dispatcher = h.runtime.dispatcher, held
    try:
        owner, dataset_id = _dataset(h)
        body = h.release_body(dataset_id, params={"mixture_degree": 4, "n_samples": 40})
        r = h.client.post("/releases", json=body, headers=h.headers(owner))
        assert r.status_code == 202, r.text
    finally:
        h.runtime.dispatcher = real
    return owner, r.json()["id"], held


def _run_to_last_attempt(h: Harness, release_id: str, *, claim: bool, read: bool = False) -> None:
    """Start every attempt of the release (as deliveries that died would), marking the
    private read on the first when ``read`` (a job that died after it) and claiming the
    upload on the last when ``claim``."""
    attempts = h.runtime.settings.task_max_attempts
    for attempt in range(1, attempts + 1):
        with transaction(h.runtime.session_factory) as session:
            assert lifecycle.start(session, release_id, max_attempts=attempts) is not None
            if read and attempt == 1:
                assert lifecycle.mark_private_read(session, release_id, attempt=attempt)
    if claim:
        with transaction(h.runtime.session_factory) as session:
            assert lifecycle.claim_upload(session, release_id, artifact_key=f"{release_id}/x")


@pytest.mark.parametrize(("claim", "settled_as"), [(False, "refunded"), (True, "committed")])
def test_store_down_on_last_attempt_settles_from_the_claim(
    embedded: Harness, monkeypatch: pytest.MonkeyPatch, claim: bool, settled_as: str
) -> None:
    h = embedded
    owner, release_id, _ = _held(h)
    _run_to_last_attempt(h, release_id, claim=claim)
    dead = DeadStore()
    monkeypatch.setattr(h.runtime, "store", dead)
    runner.fail(h.runtime, release_id, "gave up after 3 attempts: EndpointConnectionError")
    done = h.wait(owner, release_id)
    assert done["status"] == "failed"
    assert _entries(h, release_id) == [settled_as]
    assert dead.calls == []


def test_store_down_through_every_attempt_ends_refunded(
    embedded: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole job, embedded: every attempt meets a store that does not answer."""
    h = embedded
    owner, release_id, _ = _held(h)
    dead = DeadStore()
    monkeypatch.setattr(h.runtime, "store", dead)
    monkeypatch.setattr("worker.attempts.time.sleep", lambda _s: None)
    runner.run_release(h.runtime, release_id)
    done = h.wait(owner, release_id)
    assert done["status"] == "failed" and "gave up after 3 attempts" in done["error"]
    assert done["attempts"] == 3
    assert _entries(h, release_id) == ["refunded"]
    assert set(dead.calls) == {"exists"}  # the attempts' own calls; none to settle


def test_store_down_on_last_attempt_real_mode(
    real: Harness, real_services: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real mode: the Celery worker's store points at a dead port for the whole job."""
    h = real
    worker: Runtime = real_services["worker_runtime"]
    dead_url = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setattr(
        worker,
        "store",
        S3ObjectStore(worker.settings.model_copy(update={"s3_endpoint_url": dead_url})),
    )
    owner, dataset_id = _dataset(h)
    body = h.release_body(dataset_id, params={"mixture_degree": 4, "n_samples": 40})
    r = h.client.post("/releases", json=body, headers=h.headers(owner))
    assert r.status_code == 202, r.text
    release_id = r.json()["id"]
    done = h.wait(owner, release_id, timeout=180)
    assert done["status"] == "failed"
    assert done["attempts"] == worker.settings.task_max_attempts
    assert _entries(h, release_id) == ["refunded"]


@pytest.mark.parametrize(
    ("claim", "read", "settled_as", "because"),
    [
        (False, False, "refunded", "before_private_read"),
        # A job that died after it began reading the private data: charged on recovery.
        (False, True, "committed", "private_data_read"),
        (True, False, "committed", "upload_claimed"),
    ],
)
def test_sweeper_ends_a_release_left_running_past_its_last_attempt(
    embedded: Harness,
    monkeypatch: pytest.MonkeyPatch,
    claim: bool,
    read: bool,
    settled_as: str,
    because: str,
) -> None:
    h = embedded
    settings = h.runtime.settings
    owner, stuck, _ = _held(h)
    _run_to_last_attempt(h, stuck, claim=claim, read=read)
    _, not_last, _ = _held(h)  # running, with attempts left: its job may still retry
    with transaction(h.runtime.session_factory) as session:
        lifecycle.start(session, not_last, max_attempts=settings.task_max_attempts)
    dead = DeadStore()
    monkeypatch.setattr(h.runtime, "store", dead)
    monkeypatch.setattr(h.runtime, "dispatcher", Broker(down=False))  # records, runs nothing
    _free_lease(h.runtime)

    # Within the threshold a last attempt may still be alive: left alone.
    early = Sweeper(h.runtime, holder="t", clock=_later(settings.sweep_running_after_s - 60))
    result = early.sweep()
    assert result is not None and result.settled == () and result.requeued == ()
    assert _release(h, stuck).status == "running"

    late = Sweeper(h.runtime, holder="t", clock=_later(settings.sweep_running_after_s + 1))
    result = late.sweep()
    assert result is not None and result.settled == (stuck,)
    done = h.wait(owner, stuck)
    assert done["status"] == "failed" and "abandoned" in done["error"]
    assert _entries(h, stuck) == [settled_as]
    assert done["settlement"] == {"state": settled_as, "because": because}
    # With attempts left it is queued again and handed over instead (the test below).
    assert result.requeued == (not_last,) and not_last in result.resent
    assert _release(h, not_last).status == "queued"
    assert dead.calls == []


@pytest.mark.parametrize("claim", [False, True])
def test_sweeper_hands_over_a_running_release_whose_retry_was_lost(
    harness: Harness, claim: bool
) -> None:
    """An attempt that failed with attempts left, whose retry message was lost: the release
    stays ``running`` with no sign of life. The sweeper queues it again (audited; the attempt
    stays counted, nothing is settled) and hands it over; the old attempt, were it alive, can
    no longer write progress, claim the upload, fail or requeue it; a fresh delivery runs the
    next attempt to the end, charged once."""
    h = harness
    settings = h.runtime.settings
    owner, release_id, _ = _held(h)
    with transaction(h.runtime.session_factory) as session:
        assert lifecycle.start(session, release_id, max_attempts=settings.task_max_attempts)
        if claim:  # the lost attempt had claimed its upload (and stored nothing)
            assert lifecycle.claim_upload(session, release_id, artifact_key=f"{release_id}/x")
    _free_lease(h.runtime)
    _park_other_queued(h.runtime, release_id)
    recorder = Broker(down=False)
    real, h.runtime.dispatcher = h.runtime.dispatcher, recorder
    try:
        early = Sweeper(h.runtime, holder="t", clock=_later(settings.sweep_running_after_s - 60))
        result = early.sweep()
        assert result is not None and release_id not in result.requeued
        assert _release(h, release_id).status == "running"

        late = Sweeper(h.runtime, holder="t", clock=_later(settings.sweep_running_after_s + 1))
        result = late.sweep()
        assert result is not None and release_id in result.requeued
        assert recorder.sent.count(release_id) == 1  # handed over once
    finally:
        h.runtime.dispatcher = real
    queued = _release(h, release_id)
    assert queued.status == "queued" and queued.attempts == 1
    assert _entries(h, release_id) == ["reserved"]  # nothing settled

    # The old attempt (1), should it be alive, is fenced off: queued now, then superseded.
    def old_attempt_refused() -> None:
        with transaction(h.runtime.session_factory) as session:
            assert not lifecycle.report_progress(
                session, release_id, progress=0.5, phase=None, attempt=1
            )
            assert not lifecycle.claim_upload(
                session, release_id, artifact_key=f"{release_id}/y", attempt=1
            )
            assert not lifecycle.fail(session, release_id, "old attempt's error", attempt=1)
            assert not lifecycle.requeue(session, release_id, reason="old", attempt=1)

    old_attempt_refused()

    # The re-sent message, delivered: its attempt (counted after the lost one) runs to the end.
    h.runtime.dispatcher.enqueue(release_id, Route(worker_queue("dpmix")))
    done = h.wait(owner, release_id)
    assert done["status"] == "succeeded", done
    assert done["attempts"] == 2
    assert _entries(h, release_id) == ["committed"]
    actions = _audit_actions(h, release_id)
    assert actions.count("release.requeued") == 1 and actions.count("release.succeeded") == 1


def test_one_of_two_sweepers_sweeps(harness: Harness) -> None:
    h = harness
    _, release_id, _ = _held(h)
    _free_lease(h.runtime)
    _park_other_queued(h.runtime, release_id)
    broker = Broker(down=False)
    real, h.runtime.dispatcher = h.runtime.dispatcher, broker
    try:
        due = _later(h.runtime.settings.sweep_queued_after_s + 1)
        sweepers = [Sweeper(h.runtime, holder=f"api-{i}", clock=due) for i in range(2)]
        start = threading.Barrier(2)
        results: list[Any] = [None, None]

        def sweep(i: int) -> None:
            start.wait()
            results[i] = sweepers[i].sweep()

        threads = [threading.Thread(target=sweep, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        swept = [r for r in results if r is not None]
        assert len(swept) == 1, results
        assert release_id in swept[0].resent
        assert broker.sent.count(release_id) == 1
        # The holder renews its lease; the other waits until it expires.
        winner = sweepers[results.index(swept[0])]
        loser = sweepers[1 - results.index(swept[0])]
        assert winner.acquire() and not loser.acquire()
        loser.clock = _later(
            h.runtime.settings.sweep_queued_after_s + h.runtime.settings.sweep_lease_s + 2
        )
        assert loser.acquire()
    finally:
        h.runtime.dispatcher = real


def test_a_stalled_job_still_alive_stops_once_handed_over(toy_harness: Harness) -> None:
    """The sweeper presumed the job dead (no sign of life for ``sweep_running_after_s``), but it
    was only slow: once the release is queued again and handed over, the old attempt stores
    nothing (its progress write or upload claim is refused) and the fresh delivery's attempt
    publishes the release, charged once; never two attempts publishing."""
    from tests import toy_mechanism as toy

    h = toy_harness
    settings = h.runtime.settings
    owner, dataset_id = _dataset(h)
    toy.GATE.clear()
    try:
        body = {
            "dataset_id": dataset_id,
            "mechanism": toy.NAME,
            "params": {"rows": toy.CHUNK * 50, "totals_noise": 20.0},
            "epsilon": 0.5,
        }
        r = h.client.post("/releases", json=body, headers=h.headers(owner))
        assert r.status_code == 202, r.text
        release_id = r.json()["id"]
        deadline = utcnow() + timedelta(seconds=60)
        while _release(h, release_id).status != "running":  # attempt 1 waits at the gate
            assert utcnow() < deadline, "the job never started"
            threading.Event().wait(0.02)
        _free_lease(h.runtime)
        # The pass's clock is ahead of the jobs': a fresh attempt started during the pass
        # would look stalled on its last attempt to the same pass. The hand-over is recorded
        # and sent once the pass has returned, as a broker that delivers late would.
        recorder = Broker(down=False)
        real, h.runtime.dispatcher = h.runtime.dispatcher, recorder
        try:
            late = Sweeper(h.runtime, holder="t", clock=_later(settings.sweep_running_after_s + 1))
            result = late.sweep()
        finally:
            h.runtime.dispatcher = real
        assert result is not None and release_id in result.requeued
        assert release_id in result.resent
        assert recorder.sent.count(release_id) == 1
        recorder.deliver(real)  # with any other test's queued release the pass handed over
    finally:
        toy.GATE.set()  # the old attempt goes on: it must find itself superseded
    done = h.wait(owner, release_id)
    assert done["status"] == "succeeded", done
    assert done["attempts"] == 2
    assert _entries(h, release_id) == ["committed"]
    actions = _audit_actions(h, release_id)
    assert actions.count("release.requeued") == 1, actions
    assert actions.count("release.running") == 2 and actions.count("release.succeeded") == 1
