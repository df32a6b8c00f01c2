"""A job outlasts a short object-store outage: its retries wait, with a doubling back-off,
``DPRELEASE_TASK_RETRY_WINDOW_S`` in all (a minute by default) before the release settles as
failed and, the dataset never read, refunded. The back-off's sleeps are counted on a fake
clock, so the test waits for nothing."""

from __future__ import annotations

from itertools import pairwise
from types import SimpleNamespace
from typing import Any

import pytest
from botocore.exceptions import EndpointConnectionError

from tests.conftest import Harness, npz_bytes, toy_dataset
from worker import attempts, runner, tasks


class Holding:
    """A dispatcher that only records: the test runs the job itself, in this thread."""

    def enqueue(self, release_id: str, queue: Any) -> None:
        pass

    def shutdown(self) -> None:
        pass


def test_retry_delays_double_and_fill_the_window() -> None:
    for n in range(2, 7):
        waits = [attempts.retry_delay(k, attempts=n, window_s=60.0) for k in range(1, n)]
        assert sum(waits) == pytest.approx(60.0)
        assert all(b == pytest.approx(2 * a) for a, b in pairwise(waits))
    assert attempts.retry_delay(1, attempts=1, window_s=60.0) == 0.0
    assert attempts.retry_delay(1, attempts=3, window_s=0.0) == 0.0


def test_celery_retries_wait_the_same_back_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Celery task wrapper schedules its retry with the same delays (its countdown)."""
    settings = SimpleNamespace(task_max_attempts=3, task_retry_window_s=60.0)
    monkeypatch.setattr(tasks, "worker_runtime", lambda: SimpleNamespace(settings=settings))
    countdowns: list[float] = []

    class Task:
        request = SimpleNamespace(retries=0)

        def retry(self, *, exc: BaseException, countdown: float) -> Exception:
            countdowns.append(countdown)
            return RuntimeError("retry scheduled")

    def down() -> None:
        raise runner.TransientError("the object store did not answer")

    for retries in (0, 1):
        Task.request.retries = retries
        with pytest.raises(RuntimeError, match="retry scheduled"):
            tasks._run(Task(), "rel", down)
    assert countdowns == [pytest.approx(20.0), pytest.approx(40.0)]


@pytest.mark.parametrize(("outage_s", "outcome"), [(50.0, "succeeded"), (75.0, "failed")])
def test_a_job_outlasts_a_short_store_outage(
    embedded: Harness, monkeypatch: pytest.MonkeyPatch, outage_s: float, outcome: str
) -> None:
    h = embedded
    owner, _ = h.new_key("owner")
    r = h.upload(owner, npz_bytes(*toy_dataset()))
    assert r.status_code == 201, r.text
    ds = r.json()["id"]
    real, h.runtime.dispatcher = h.runtime.dispatcher, Holding()  # type: ignore[assignment]
    try:
        created = h.client.post("/releases", json=h.release_body(ds), headers=h.headers(owner))
    finally:
        h.runtime.dispatcher = real
    assert created.status_code == 202, created.text
    rid = created.json()["id"]

    monkeypatch.setattr(h.runtime.settings, "task_retry_window_s", 60.0)  # the default
    clock = [0.0]  # seconds the job's back-off slept
    monkeypatch.setattr(attempts.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    store = h.runtime.store
    open_mapped = store.open_mapped

    def down_for_a_while(key: str, **kwargs: Any) -> Any:
        if key.startswith(f"datasets/{ds}/") and clock[0] < outage_s:
            raise EndpointConnectionError(endpoint_url="http://store.invalid")
        return open_mapped(key, **kwargs)

    monkeypatch.setattr(store, "open_mapped", down_for_a_while)
    runner.run_release(h.runtime, rid)
    done = h.client.get(f"/releases/{rid}", headers=h.headers(owner)).json()
    window = h.runtime.settings.task_retry_window_s
    assert done["status"] == outcome, done
    assert done["attempts"] == h.runtime.settings.task_max_attempts
    assert clock[0] == pytest.approx(window, abs=attempts.BACKOFF_SLICE_S * 4)
    if outcome == "failed":
        # The dataset was never read: refunded.
        assert done["settlement"] == {"state": "refunded", "because": "before_private_read"}
