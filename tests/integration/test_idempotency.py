"""Idempotency-Key: repeats (serial or concurrent) give one charge and the same response."""

from __future__ import annotations

import threading

from sqlalchemy import func, select

from service.models import Dataset
from tests.conftest import Harness, npz_bytes, toy_dataset


def _post_release(h: Harness, key: str, body: dict, idem: str):  # type: ignore[no-untyped-def,type-arg]
    headers = {**h.headers(key), "Idempotency-Key": idem}
    return h.client.post("/releases", json=body, headers=headers)


def test_serial_replay_and_mismatch(harness: Harness) -> None:
    h = harness
    owner, _ = h.new_key("owner")
    ds = h.upload(owner, npz_bytes(*toy_dataset())).json()
    body = h.release_body(ds["id"], epsilon=1.0)
    first = _post_release(h, owner, body, "k-1")
    again = _post_release(h, owner, body, "k-1")
    assert first.status_code == again.status_code == 202
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["charge"] == first.json()["charge"]
    ledger = h.client.get(f"/budgets/{ds['id']}", headers=h.headers(owner)).json()
    assert len(ledger["entries"]) == 1

    other_body = h.release_body(ds["id"], epsilon=0.5)
    mismatch = _post_release(h, owner, other_body, "k-1")
    assert mismatch.status_code == 422
    assert "different request" in mismatch.json()["error"]["message"]
    # Keys belong to their principal: another owner's "k-1" is unrelated.
    other, _ = h.new_key("owner")
    ds2 = h.upload(other, npz_bytes(*toy_dataset())).json()
    theirs = _post_release(h, other, h.release_body(ds2["id"], epsilon=1.0), "k-1")
    assert theirs.status_code == 202 and theirs.json()["id"] != first.json()["id"]
    # A refused request leaves the key free (its record rolled back with it).
    big = h.release_body(ds["id"], epsilon=5.0)
    assert _post_release(h, owner, big, "k-2").status_code == 409
    assert _post_release(h, owner, h.release_body(ds["id"], epsilon=0.2), "k-2").status_code == 202


def test_concurrent_duplicates_charge_once(real: Harness) -> None:
    h = real
    owner, _ = h.new_key("owner")
    ds = h.upload(owner, npz_bytes(*toy_dataset())).json()
    body = h.release_body(ds["id"], epsilon=1.0)
    barrier = threading.Barrier(8)
    answers: list[tuple[int, str | None]] = []

    def go() -> None:
        barrier.wait()
        r = _post_release(h, owner, body, "same-key")
        answers.append((r.status_code, r.json().get("id")))

    threads = [threading.Thread(target=go) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {status for status, _ in answers} <= {202, 409}
    ids = {rid for status, rid in answers if status == 202}
    assert len(ids) == 1, answers
    ledger = h.client.get(f"/budgets/{ds['id']}", headers=h.headers(owner)).json()
    assert len(ledger["entries"]) == 1


def test_upload_replay_stores_one_dataset(harness: Harness) -> None:
    h = harness
    owner, _ = h.new_key("owner")
    content = npz_bytes(*toy_dataset())
    meta = {"name": "t", "feature_range": [0, 13], "budget": {"epsilon": 1, "delta": 1e-5}}
    import json

    def post(data: bytes):  # type: ignore[no-untyped-def]
        return h.client.post(
            "/datasets",
            files={"file": ("d.npz", data)},
            data={"metadata": json.dumps(meta)},
            headers={**h.headers(owner), "Idempotency-Key": "upload-1"},
        )

    with h.runtime.session_factory() as session:
        before = session.scalar(select(func.count()).select_from(Dataset))
    first, again = post(content), post(content)
    assert first.status_code == again.status_code == 201
    assert first.json()["id"] == again.json()["id"]
    with h.runtime.session_factory() as session:
        assert session.scalar(select(func.count()).select_from(Dataset)) == (before or 0) + 1
    assert post(npz_bytes(*toy_dataset(seed=3))).status_code == 422
