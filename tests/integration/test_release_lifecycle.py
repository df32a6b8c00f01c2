"""The life of a release after admission, in both modes, with the test-only mechanism
(tests/toy_mechanism.py) held at its gate: progress in rows or in the generator's own units,
with a phase; cancellation while queued, while running, and racing the upload claim.

Both modes run one job at a time (embedded: one job thread; real: a solo Celery worker in this
process), so a toy release held at the gate keeps the next one queued, and a release that
succeeds tells that every job queued before it has ended."""

from __future__ import annotations

import time
from typing import Any

import pytest

from service.db import transaction
from service.releases import keys, lifecycle
from tests import toy_mechanism as toy
from tests.conftest import Harness, npz_bytes, toy_dataset
from worker import publishing, runner

BUDGET = 5.0  # the harness's default upload budget


def _dataset(h: Harness) -> tuple[str, str]:
    owner, _ = h.new_key("owner")
    r = h.upload(owner, npz_bytes(*toy_dataset()))
    assert r.status_code == 201, r.text
    assert r.json()["budget"]["epsilon"] == BUDGET
    return owner, r.json()["id"]


def _toy_release(h: Harness, owner: str, dataset_id: str, **params: Any) -> dict[str, Any]:
    body = {
        "dataset_id": dataset_id,
        "mechanism": toy.NAME,
        "params": {"rows": 40, "totals_noise": 20.0, **params},
        "epsilon": 1.0,
    }
    r = h.client.post("/releases", json=body, headers=h.headers(owner))
    assert r.status_code == 202, r.text
    created: dict[str, Any] = r.json()
    return created


@pytest.mark.parametrize("own", [False, True], ids=["rows", "own"])
def test_progress_has_the_generators_phase(toy_harness: Harness, own: bool) -> None:
    """Rows counted by the worker show phase "rows"; a generator reporting its own progress
    shows its word ("means"). Both are written at once, then at most twice a second."""
    h = toy_harness
    owner, ds = _dataset(h)
    toy.GATE.clear()  # the generator waits before its first chunk
    rid = _toy_release(h, owner, ds, own_progress=own)["id"]
    held = h.wait_for(owner, rid, lambda r: r["phase"] is not None)
    assert held["status"] == "running" and held["progress"] == 0.0
    assert held["phase"] == (toy.OWN_PHASE if own else "rows")
    toy.GATE.set()
    done = h.wait(owner, rid)
    assert done["status"] == "succeeded", done
    assert done["progress"] == 1.0 and done["phase"] == held["phase"]


def _cancel(h: Harness, key: str, release_id: str) -> Any:
    return h.client.post(f"/releases/{release_id}/cancel", headers=h.headers(key))


def _ledger(h: Harness, owner: str, dataset_id: str) -> dict[str, Any]:
    r = h.client.get(f"/budgets/{dataset_id}", headers=h.headers(owner))
    assert r.status_code == 200, r.text
    ledger: dict[str, Any] = r.json()
    return ledger


def _entry_state(ledger: dict[str, Any], release_id: str) -> str:
    (entry,) = [e for e in ledger["entries"] if e["release_id"] == release_id]
    state: str = entry["state"]
    return state


def _stored(h: Harness, release_id: str) -> set[str]:
    """Which of the release's objects the store holds."""
    names = {
        "artifact": keys.artifact(release_id, "npz"),
        "metadata": keys.metadata(release_id),
    }
    return {name for name, key in names.items() if h.runtime.store.exists(key)}


def _drain(h: Harness, owner: str, dataset_id: str) -> None:
    """Wait until every job queued so far has ended: one more release, run after them."""
    rid = _toy_release(h, owner, dataset_id, rows=1)["id"]
    assert h.wait(owner, rid)["status"] == "succeeded"


def _cancel_events(h: Harness, release_id: str) -> list[dict[str, Any]]:
    r = h.client.get(
        "/audit",
        params={"object_type": "release", "object_id": release_id},
        headers=h.headers(h.admin_key),
    )
    assert r.status_code == 200, r.text
    return [e for e in r.json()["items"] if e["action"] == "release.cancelled"]


def test_cancel_a_queued_release(toy_harness: Harness) -> None:
    h = toy_harness
    owner, ds = _dataset(h)
    toy.GATE.clear()
    held = _toy_release(h, owner, ds)["id"]
    h.wait_for(owner, held, lambda r: r["phase"] is not None)  # holds the one job slot
    queued = _toy_release(h, owner, ds)["id"]
    assert h.wait_for(owner, queued, lambda r: True)["status"] == "queued"
    assert _entry_state(_ledger(h, owner, ds), queued) == "reserved"
    # Before confirming, the owner reads what a cancel would do: no job read the data yet.
    before = h.client.get(f"/releases/{queued}", headers=h.headers(owner)).json()
    assert before["if_cancelled"] == "refunded"
    admin = h.client.get(f"/releases/{queued}", headers=h.headers(h.admin_key)).json()
    assert admin["if_cancelled"] is None  # the owner's alone, who alone may cancel

    r = _cancel(h, owner, queued)
    assert r.status_code == 200, r.text
    cancelled = r.json()
    assert cancelled["status"] == "cancelled" and cancelled["finished_at"] is not None
    assert cancelled["artifact"] is None and cancelled["if_cancelled"] is None
    assert _entry_state(_ledger(h, owner, ds), queued) == "refunded"
    # Again: the same answer, nothing changes (one audit event).
    again = _cancel(h, owner, queued)
    assert again.status_code == 200 and again.json() == cancelled
    events = _cancel_events(h, queued)
    assert len(events) == 1
    assert events[0]["detail"] == {
        "dataset_id": ds,
        "was": "queued",
        "ledger": "refunded",
        "settled_because": "before_private_read",
    }
    assert cancelled["settlement"] == {"state": "refunded", "because": "before_private_read"}
    assert events[0]["actor"] != "worker"

    toy.GATE.set()
    assert h.wait(owner, held)["status"] == "succeeded"
    _drain(h, owner, ds)
    # Its job came and went without running it.
    after = h.client.get(f"/releases/{queued}", headers=h.headers(owner)).json()
    assert after == cancelled and after["attempts"] == 0 and after["started_at"] is None
    assert _stored(h, queued) == set()
    download = h.client.get(f"/releases/{queued}/download", headers=h.headers(owner))
    assert download.status_code == 409 and "cancelled" in download.json()["error"]["message"]

    # A finished release cannot be cancelled.
    finished = _cancel(h, owner, held)
    assert finished.status_code == 409, finished.text
    assert finished.json()["error"]["code"] == "release_finished"
    assert finished.json()["error"]["detail"] == {"status": "succeeded"}
    assert _entry_state(_ledger(h, owner, ds), held) == "committed"


@pytest.mark.parametrize("own", [False, True], ids=["rows", "own"])
def test_cancel_a_running_release(
    toy_harness: Harness, monkeypatch: pytest.MonkeyPatch, own: bool
) -> None:
    """Held at the gate, cancelled, released: the job notices at its next progress write and
    stops before claiming the upload; nothing is stored. Whether the runner counts rows or the
    generator reports its own progress. Its job had read the private data (it was drawing), so
    its charge stands: when the cancel lands, and so whether it refunds, may depend on the data
    (docs/privacy.md, "Failures and cancellations")."""
    h = toy_harness
    owner, ds = _dataset(h)
    claimed: list[str] = []
    claim_upload = publishing.claim_upload

    def spy(runtime: Any, job: Any, *args: Any) -> bool:
        claimed.append(job.release_id)
        return claim_upload(runtime, job, *args)

    monkeypatch.setattr(publishing, "claim_upload", spy)
    toy.GATE.clear()
    rid = _toy_release(h, owner, ds, own_progress=own)["id"]
    running = h.wait_for(owner, rid, lambda r: r["phase"] is not None)
    assert running["status"] == "running"
    assert running["if_cancelled"] == "committed"  # its job is reading: stated beforehand
    assert _ledger(h, owner, ds)["remaining"] < BUDGET

    reserved = _ledger(h, owner, ds)["reserved"]
    r = _cancel(h, owner, rid)
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "cancelled"
    assert r.json()["settlement"] == {"state": "committed", "because": "private_data_read"}
    ledger = _ledger(h, owner, ds)
    assert _entry_state(ledger, rid) == "committed"
    assert ledger["remaining"] < BUDGET and ledger["spent"] == reserved
    (entry,) = [e for e in ledger["entries"] if e["release_id"] == rid]
    assert entry["settled_because"] == "private_data_read"
    event = _cancel_events(h, rid)[0]["detail"]
    assert event["was"] == "running" and event["settled_because"] == "private_data_read"
    # Past the progress interval, so the first chunk's progress write reads the status.
    time.sleep(runner.PROGRESS_EVERY_S)
    toy.GATE.set()
    _drain(h, owner, ds)

    assert rid not in claimed  # stopped between chunks, before the claim
    final = h.client.get(f"/releases/{rid}", headers=h.headers(owner)).json()
    assert final["status"] == "cancelled" and final["artifact"] is None
    assert _stored(h, rid) == set()
    assert _entry_state(_ledger(h, owner, ds), rid) == "committed"


@pytest.mark.parametrize("order", ["before", "after"])
def test_cancel_racing_the_upload_claim(
    toy_harness: Harness, monkeypatch: pytest.MonkeyPatch, order: str
) -> None:
    """A cancel that lands just before the job claims the upload: nothing is published, and
    the charge stands as the job has read the private data; one just after it commits the
    charge as output may exist. Nothing is served either way."""
    h = toy_harness
    owner, ds = _dataset(h)
    owner_id = h.client.get("/me", headers=h.headers(owner)).json()["principal_id"]
    claim_upload = publishing.claim_upload
    outcome: list[bool] = []

    def cancel(release_id: str) -> None:
        # What the endpoint does once it checked access, in a transaction of its own.
        with transaction(h.runtime.session_factory) as session:
            lifecycle.cancel(session, release_id, actor=owner_id)

    def racing(runtime: Any, job: Any, *args: Any) -> bool:
        if order == "before":
            cancel(job.release_id)
        claimed = claim_upload(runtime, job, *args)
        outcome.append(claimed)
        if order == "after":
            cancel(job.release_id)
        return claimed

    monkeypatch.setattr(publishing, "claim_upload", racing)
    rid = _toy_release(h, owner, ds)["id"]
    h.wait_for(owner, rid, lambda r: r["status"] == "cancelled")
    monkeypatch.setattr(publishing, "claim_upload", claim_upload)
    _drain(h, owner, ds)

    final = h.client.get(f"/releases/{rid}", headers=h.headers(owner)).json()
    assert final["status"] == "cancelled" and final["artifact"] is None
    download = h.client.get(f"/releases/{rid}/download", headers=h.headers(owner))
    assert download.status_code == 409, download.text
    assert download.json()["error"]["code"] == "not_ready"
    state = _entry_state(_ledger(h, owner, ds), rid)
    assert state == "committed"
    if order == "before":
        assert outcome == [False]
        assert final["settlement"]["because"] == "private_data_read"
        assert _stored(h, rid) == set()
    else:
        assert outcome == [True]
        assert final["settlement"]["because"] == "upload_claimed"
        # The claimed job went on storing (it may have been past any check): never served.
        assert _stored(h, rid) == {"artifact", "metadata"}
    assert _cancel_events(h, rid)[0]["detail"]["ledger"] == state
