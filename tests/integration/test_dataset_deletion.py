"""Deleting a dataset erases its raw data from the object store; its ledger, grants and
releases stay, and it takes no new release."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from botocore.exceptions import ClientError

from service.budgets import repository as budget_repository
from service.models import Dataset, utcnow
from service.runtime import Dispatcher, Route
from service.storage import S3ObjectStore
from tests.conftest import Harness, npz_bytes, toy_dataset
from worker import runner


class HeldDispatcher:
    """Keeps jobs queued until ``run`` passes them on, so a test can act while they wait."""

    def __init__(self, inner: Dispatcher) -> None:
        self.inner = inner
        self.held: list[tuple[str, Route]] = []

    def enqueue(self, release_id: str, queue: Route) -> None:
        self.held.append((release_id, queue))

    def shutdown(self) -> None:
        self.inner.shutdown()

    def run(self) -> None:
        for release_id, queue in self.held:
            self.inner.enqueue(release_id, queue)


def stored(h: Harness, key: str) -> bool:
    """Asks the store itself: the file on disk, or HEAD on the S3 object (moto)."""
    store = h.runtime.store
    if isinstance(store, S3ObjectStore):
        try:
            store.client.head_object(Bucket=store.bucket, Key=key)
        except ClientError as exc:
            assert exc.response["ResponseMetadata"]["HTTPStatusCode"] == 404
            return False
        return True
    path = store.local_path(key)
    assert path is not None
    return path.exists()


def raw_key(h: Harness, dataset_id: str) -> str:
    with h.runtime.session_factory() as session:
        dataset = session.get(Dataset, dataset_id)
        assert dataset is not None
        return dataset.storage_key


def _release(h: Harness, key: str, dataset_id: str, **extra: Any) -> Any:
    body = h.release_body(dataset_id, params={"mixture_degree": 4, "n_samples": 200}, **extra)
    return h.client.post("/releases", json=body, headers=h.headers(key))


def _code(r: Any) -> tuple[int, str | None]:
    return r.status_code, (r.json().get("error") or {}).get("code")


def test_delete_erases_raw_data_and_keeps_releases(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = harness
    owner, _ = h.new_key("owner")
    analyst, analyst_id = h.new_key("analyst")
    metadata = {
        "name": "toy",
        "feature_range": [0, 13],
        "classes": [0, 1, 2],
        "budget": {"epsilon": 20.0, "delta": 1e-5},
    }
    upload = {
        "files": {"file": ("data.npz", npz_bytes(*toy_dataset()))},
        "data": {"metadata": json.dumps(metadata)},
        "headers": {**h.headers(owner), "Idempotency-Key": "upload-1"},
    }
    ds = h.client.post("/datasets", **upload)  # type: ignore[arg-type]
    ds_id = ds.json()["id"]
    held_out = h.upload(owner, npz_bytes(*toy_dataset(n=150, seed=1))).json()["id"]
    h.client.post(
        f"/datasets/{ds_id}/grants", json={"principal_id": analyst_id}, headers=h.headers(owner)
    )
    first = _release(h, owner, ds_id, report_test_dataset_id=held_out).json()["id"]
    assert h.wait(owner, first)["status"] == "succeeded"
    first_bytes = h.download(analyst, first)
    raw, report = raw_key(h, ds_id), f"releases/{first}/report.json"
    assert stored(h, raw) and stored(h, report)

    # A queued release will read the raw data: deletion is refused and erases nothing.
    held = HeldDispatcher(h.runtime.dispatcher)
    monkeypatch.setattr(h.runtime, "dispatcher", held)
    queued = _release(h, owner, ds_id).json()["id"]
    refused = h.client.delete(f"/datasets/{ds_id}", headers=h.headers(owner))
    assert _code(refused) == (409, "releases_pending")
    assert refused.json()["error"]["detail"]["release_ids"] == [queued]
    assert stored(h, raw)
    held.run()
    assert h.wait(owner, queued)["status"] == "succeeded"
    ledger = h.client.get(f"/budgets/{ds_id}", headers=h.headers(owner)).json()

    deleted = h.client.delete(f"/datasets/{ds_id}", headers=h.headers(owner))
    assert deleted.status_code == 200, deleted.text
    out = deleted.json()
    assert out["status"] == "deleted" and out["deleted_at"] is not None
    assert out["clipped_values"] is None and out["sha256"] == ds.json()["sha256"]
    assert not stored(h, raw)
    with h.runtime.session_factory() as session:
        row = session.get(Dataset, ds_id)
        assert row is not None and row.class_counts is None and row.clipped_values is None
    assert stored(h, report)  # computed on the held-out set, which still exists
    # Replaying the upload shows the dataset as it now is, erased statistics included.
    replay = h.client.post("/datasets", **upload)  # type: ignore[arg-type]
    assert replay.json() == out

    # No new release; everything already made stays, for the owner and the analyst.
    for path in ("/releases", "/releases/preview"):
        again = h.client.post(path, json=h.release_body(ds_id), headers=h.headers(owner))
        assert _code(again) == (409, "dataset_deleted"), path
    assert h.client.get(f"/budgets/{ds_id}", headers=h.headers(owner)).json() == ledger
    assert [e["state"] for e in ledger["entries"]] == ["committed", "committed"]
    seen = h.client.get(f"/datasets/{ds_id}", headers=h.headers(analyst)).json()
    assert seen["status"] == "deleted"
    assert h.download(analyst, first) == first_bytes
    assert len(h.download(analyst, queued)) > 0
    assert h.client.get(f"/releases/{first}/report", headers=h.headers(owner)).status_code == 200

    # Repeating it changes nothing.
    twice = h.client.delete(f"/datasets/{ds_id}", headers=h.headers(owner))
    assert twice.status_code == 200 and twice.json()["deleted_at"] == out["deleted_at"]

    # Deleting the held-out set erases the reports computed on it (not DP), and it can no
    # longer serve as one.
    assert h.client.delete(f"/datasets/{held_out}", headers=h.headers(owner)).status_code == 200
    assert not stored(h, report)
    assert not stored(h, raw_key(h, held_out))
    gone = h.client.get(f"/releases/{first}/report", headers=h.headers(owner))
    assert _code(gone) == (410, "erased")
    fresh = h.upload(owner, npz_bytes(*toy_dataset(seed=2))).json()["id"]
    with_report = _release(h, owner, fresh, report_test_dataset_id=held_out)
    assert _code(with_report) == (409, "dataset_deleted")


def test_admission_waits_for_a_deletion_in_progress(harness: Harness) -> None:
    """A release asked for while a deletion holds the dataset's budget row is refused once
    the deletion commits, never admitted against erased data."""
    h = harness
    owner, _ = h.new_key("owner")
    ds_id = h.upload(owner, npz_bytes(*toy_dataset())).json()["id"]
    answers: list[Any] = []
    request = threading.Thread(target=lambda: answers.append(_release(h, owner, ds_id)))
    with h.runtime.session_factory() as session, session.begin():
        budget_repository.lock_budgets(session, dataset_ids=[ds_id])
        dataset = session.get(Dataset, ds_id)
        assert dataset is not None
        dataset.deleted_at = utcnow()
        session.flush()
        request.start()
        time.sleep(0.5)
        assert request.is_alive()  # waiting for the lock
    request.join(timeout=30)
    assert _code(answers[0]) == (409, "dataset_deleted")


def test_a_job_whose_dataset_is_gone_fails_and_is_refunded(
    embedded: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Defence in depth: deletion waits for queued jobs, but a job that still meets an erased
    dataset (one run by hand, say) fails cleanly instead of reading anything."""
    h = embedded
    owner, _ = h.new_key("owner")
    ds_id = h.upload(owner, npz_bytes(*toy_dataset())).json()["id"]
    monkeypatch.setattr(h.runtime, "dispatcher", HeldDispatcher(h.runtime.dispatcher))
    rid = _release(h, owner, ds_id).json()["id"]
    with h.runtime.session_factory() as session, session.begin():
        dataset = session.get(Dataset, ds_id)
        assert dataset is not None
        dataset.deleted_at = utcnow()
    h.runtime.store.delete(raw_key(h, ds_id))
    runner.execute(h.runtime, rid)
    done = h.wait(owner, rid)
    assert done["status"] == "failed" and "deleted" in done["error"]
    ledger = h.client.get(f"/budgets/{ds_id}", headers=h.headers(owner)).json()
    assert [e["state"] for e in ledger["entries"]] == ["refunded"]
