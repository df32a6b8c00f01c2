"""Failures after the private read are charged (docs/privacy.md, "Failures and
cancellations").

A job records, under the release row lock, that it begins reading its dataset's content
(``releases.private_read_at``) before it parses it. A release that then ends without
succeeding — a mechanism that raises after drawing its noise, a job that dies, a cancel, the
attempts running out — keeps its charge (committed, ``settled_because: private_data_read``),
shown on the release (``settlement``), in the ledger and in the audit trail; one that ends
before any read (its stored data unreadable or corrupt, a store that does not answer) is
refunded (``before_private_read``). The crash and cancel cases are in test_outbox.py (the
sweeper), test_release_lifecycle.py (cancel) and test_crash_safety.py (killed workers)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
import torch

from service.db import transaction
from service.models import Release
from service.releases import keys, lifecycle
from tests import toy_mechanism as toy
from tests.conftest import Harness, npz_bytes, toy_dataset
from worker import publishing, runner, writing

BUDGET = 5.0  # the harness's default upload budget
# What a mechanism raises after its noise was drawn (DP-CDA's wording, say).
LATE = "class 1 has fewer records than mixture_degree"


class Holding:
    """A dispatcher that only records: the test runs the job itself."""

    def enqueue(self, release_id: str, queue: Any) -> None:
        pass

    def shutdown(self) -> None:
        pass


def _dataset(h: Harness) -> tuple[str, str]:
    owner, _ = h.new_key("owner")
    r = h.upload(owner, npz_bytes(*toy_dataset()))
    assert r.status_code == 201, r.text
    return owner, r.json()["id"]


def _toy_release(h: Harness, owner: str, dataset_id: str) -> dict[str, Any]:
    body = {
        "dataset_id": dataset_id,
        "mechanism": toy.NAME,
        "params": {"rows": 40, "totals_noise": 20.0},
        "epsilon": 1.0,
    }
    r = h.client.post("/releases", json=body, headers=h.headers(owner))
    assert r.status_code == 202, r.text
    created: dict[str, Any] = r.json()
    return created


def _held_release(h: Harness, owner: str, dataset_id: str) -> str:
    """A queued toy release whose job is not run: the test runs it (``runner.run_release``)."""
    real, h.runtime.dispatcher = h.runtime.dispatcher, Holding()  # type: ignore[assignment]
    try:
        return str(_toy_release(h, owner, dataset_id)["id"])
    finally:
        h.runtime.dispatcher = real


def _entry(h: Harness, owner: str, dataset_id: str, release_id: str) -> dict[str, Any]:
    ledger = h.client.get(f"/budgets/{dataset_id}", headers=h.headers(owner)).json()
    (entry,) = [e for e in ledger["entries"] if e["release_id"] == release_id]
    return {**entry, "ledger_spent": ledger["spent"], "ledger_remaining": ledger["remaining"]}


def _events(h: Harness, release_id: str) -> list[dict[str, Any]]:
    r = h.client.get(
        "/audit",
        params={"object_type": "release", "object_id": release_id},
        headers=h.headers(h.admin_key),
    )
    assert r.status_code == 200, r.text
    items: list[dict[str, Any]] = r.json()["items"]
    return items


def _row(h: Harness, release_id: str) -> Release:
    with h.runtime.session_factory() as session:
        release = session.get(Release, release_id)
        assert release is not None
        session.expunge(release)
        return release


@pytest.fixture
def raises_after_noise(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every mechanism the runner builds yields its first chunk of noisy rows, then raises
    (as a mechanism whose failure depends on the data would, after drawing); counts the
    builds (each a fresh draw)."""
    builds: list[int] = []
    build = writing.build

    def failing_build(*args: Any, **kwargs: Any) -> Any:
        output = build(*args, **kwargs)
        builds.append(1)

        def chunks() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
            for chunk in output.chunks:
                yield chunk
                raise ValueError(LATE)

        return replace(output, chunks=chunks())

    monkeypatch.setattr(writing, "build", failing_build)
    return builds


def test_a_failure_after_noise_is_drawn_keeps_its_charge(
    toy_harness: Harness, raises_after_noise: list[int]
) -> None:
    """Failed, not retried (no fresh draw under the same charge), charged; the owner, a
    granted analyst, the ledger and the audit trail all show that the charge stands."""
    h = toy_harness
    owner, ds = _dataset(h)
    created = _toy_release(h, owner, ds)
    rid = created["id"]
    done = h.wait(owner, rid)
    assert done["status"] == "failed" and LATE in done["error"]
    assert done["artifact"] is None and done["attempts"] == 1
    assert done["settlement"] == {"state": "committed", "because": "private_data_read"}
    assert len(raises_after_noise) == 1  # one draw, never retried
    assert not h.runtime.store.exists(keys.artifact(rid, "npz"))

    entry = _entry(h, owner, ds, rid)
    assert entry["state"] == "committed" and entry["settled_because"] == "private_data_read"
    assert entry["settled_at"] is not None
    assert entry["ledger_spent"] == created["charge"]["consumed_epsilon"] > 0
    assert entry["ledger_remaining"] < BUDGET

    # A granted analyst sees that it failed (not why: the text may quote the data) and that
    # its charge stands.
    analyst, analyst_id = h.new_key("analyst")
    grant = h.client.post(
        f"/datasets/{ds}/grants", json={"principal_id": analyst_id}, headers=h.headers(owner)
    )
    assert grant.status_code == 201, grant.text
    seen = h.client.get(f"/releases/{rid}", headers=h.headers(analyst)).json()
    assert seen["error"] == "failed" and seen["settlement"] == done["settlement"]

    failed = [e for e in _events(h, rid) if e["action"] == "release.failed"]
    assert [e["detail"]["ledger"] for e in failed] == ["committed"]
    assert failed[0]["detail"]["settled_because"] == "private_data_read"
    assert LATE not in str(failed[0]["detail"])
    assert _row(h, rid).private_read_at is not None


def test_a_failure_before_the_private_read_is_refunded(harness: Harness) -> None:
    """The stored dataset does not match its recorded hash: the job fails before reading its
    content (nothing of it could influence the failure), refunded, and no read is recorded.
    Both stores: the local file mapped, the S3 object streamed into a scratch file first."""
    h = harness
    owner, ds = _dataset(h)
    key = f"datasets/{ds}/raw.npz"
    h.runtime.store.delete(key)
    h.runtime.store.put(key, b"not the dataset")
    rid = h.client.post("/releases", json=h.release_body(ds), headers=h.headers(owner)).json()["id"]
    done = h.wait(owner, rid)
    assert done["status"] == "failed" and "sha256" in done["error"]
    assert done["settlement"] == {"state": "refunded", "because": "before_private_read"}
    entry = _entry(h, owner, ds, rid)
    assert entry["state"] == "refunded" and entry["settled_because"] == "before_private_read"
    assert entry["ledger_spent"] == 0.0 and entry["ledger_remaining"] == BUDGET
    assert _row(h, rid).private_read_at is None


@pytest.mark.parametrize("failures", [1, 99], ids=["once", "always"])
def test_a_transient_error_after_the_read(
    embedded: Harness, monkeypatch: pytest.MonkeyPatch, failures: int
) -> None:
    """The database does not answer when the job, its rows drawn, claims the upload (an
    infrastructure error, retried). Once: the next attempt draws afresh (the first draw was
    never stored) and succeeds, charged once. On every attempt: the release ends failed, and
    its charge stands although no output was ever claimed."""
    h = embedded
    owner, ds = _dataset(h)
    rid = _held_release_of_dpmix(h, owner, ds)
    claim_upload = publishing.claim_upload
    left = [failures]

    def flaky(runtime: Any, job: Any, *args: Any) -> bool:
        if left[0] > 0:
            left[0] -= 1
            raise ConnectionError("the database did not answer")
        return claim_upload(runtime, job, *args)

    monkeypatch.setattr(publishing, "claim_upload", flaky)
    monkeypatch.setattr("worker.attempts.time.sleep", lambda _s: None)
    runner.run_release(h.runtime, rid)
    done = h.wait(owner, rid)
    attempts = h.runtime.settings.task_max_attempts
    entry = _entry(h, owner, ds, rid)
    assert entry["state"] == "committed"
    if failures == 1:
        assert done["status"] == "succeeded" and done["attempts"] == 2
        assert done["settlement"] == {"state": "committed", "because": "succeeded"}
    else:
        assert done["status"] == "failed" and f"gave up after {attempts}" in done["error"]
        assert done["attempts"] == attempts
        assert done["settlement"] == {"state": "committed", "because": "private_data_read"}
        assert _row(h, rid).artifact_key is None  # never claimed: charged for the read


def test_the_read_mark_is_fenced_and_monotone(embedded: Harness) -> None:
    """``lifecycle.mark_private_read``: only the running attempt may mark (a stale one must
    stop before reading); the first mark stays, through an uncounted requeue (shutdown) and a
    later attempt; a release cancelled after it stays charged."""
    h = embedded
    owner, ds = _dataset(h)
    rid = _held_release_of_dpmix(h, owner, ds)
    factory = h.runtime.session_factory
    with transaction(factory) as session:
        assert lifecycle.mark_private_read(session, rid, attempt=1) is False  # still queued
        assert lifecycle.start(session, rid, max_attempts=3) is not None
        assert lifecycle.mark_private_read(session, rid, attempt=2) is False  # not its attempt
        assert lifecycle.mark_private_read(session, rid, attempt=1) is True
    first = _row(h, rid).private_read_at
    assert first is not None
    with transaction(factory) as session:
        assert lifecycle.requeue(session, rid, reason="worker shutting down", attempt=1)
        assert lifecycle.start(session, rid, max_attempts=3) is not None
        assert lifecycle.mark_private_read(session, rid, attempt=1) is True
    assert _row(h, rid).private_read_at == first
    owner_id = h.client.get("/me", headers=h.headers(owner)).json()["principal_id"]
    with transaction(factory) as session:
        lifecycle.cancel(session, rid, actor=owner_id)
        assert lifecycle.mark_private_read(session, rid, attempt=1) is False  # cancelled
    done = h.client.get(f"/releases/{rid}", headers=h.headers(owner)).json()
    assert done["status"] == "cancelled"
    assert done["settlement"] == {"state": "committed", "because": "private_data_read"}


def _held_release_of_dpmix(h: Harness, owner: str, dataset_id: str) -> str:
    real, h.runtime.dispatcher = h.runtime.dispatcher, Holding()  # type: ignore[assignment]
    try:
        body = h.release_body(dataset_id, params={"mixture_degree": 4, "n_samples": 40})
        r = h.client.post("/releases", json=body, headers=h.headers(owner))
        assert r.status_code == 202, r.text
        return str(r.json()["id"])
    finally:
        h.runtime.dispatcher = real
