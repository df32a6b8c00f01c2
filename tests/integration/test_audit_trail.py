"""The audit trail: every state change recorded append-only with its actor, admins only, no
secrets anywhere."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from service.auth.service import hash_key
from service.models import ApiKey, AuditEvent, Dataset
from tests.conftest import Harness, npz_bytes, toy_dataset


def _audit(h: Harness, **params: Any) -> dict[str, Any]:
    r = h.client.get("/audit", params=params, headers=h.headers(h.admin_key))
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def _actions(h: Harness, object_type: str, object_id: str) -> list[tuple[str, str]]:
    items = _audit(h, object_type=object_type, object_id=object_id, limit=500)["items"]
    return [(e["action"], e["actor"]) for e in items]


def test_every_state_change_is_recorded_with_its_actor(harness: Harness) -> None:
    h = harness
    start = datetime.now(UTC) - timedelta(seconds=1)
    admin_id = h.client.get("/me", headers=h.headers(h.admin_key)).json()["principal_id"]
    owner, owner_id = h.new_key("owner")
    r = h.client.post(
        "/api-keys", json={"name": "bob", "role": "analyst"}, headers=h.headers(h.admin_key)
    )
    analyst = r.json()
    # Keys: who created them, for whom, with which role.
    created = _audit(h, object_type="api_key", object_id=analyst["key_id"])["items"]
    assert [(e["action"], e["actor"]) for e in created] == [("api_key.created", admin_id)]
    assert created[0]["detail"] == {
        "principal_id": analyst["principal_id"],
        "name": "bob",
        "role": "analyst",
    }

    ds = h.upload(owner, npz_bytes(*toy_dataset()), budget={"epsilon": 2.0, "delta": 1e-5}).json()
    assert _actions(h, "dataset", ds["id"]) == [("dataset.created", owner_id)]
    event = _audit(h, object_type="dataset", object_id=ds["id"])["items"][0]
    assert event["detail"]["budget"] == {"epsilon": 2.0, "delta": 1e-5}

    grant = h.client.post(
        f"/datasets/{ds['id']}/grants",
        json={"principal_id": analyst["principal_id"]},
        headers=h.headers(owner),
    ).json()
    # Granting again changes nothing and records nothing.
    h.client.post(
        f"/datasets/{ds['id']}/grants",
        json={"principal_id": analyst["principal_id"]},
        headers=h.headers(owner),
    )
    assert _actions(h, "grant", grant["id"]) == [("grant.created", owner_id)]

    body = h.release_body(ds["id"], epsilon=1.9, params={"mixture_degree": 4, "n_samples": 20})
    rel = h.client.post("/releases", json=body, headers=h.headers(owner)).json()
    assert h.wait(owner, rel["id"])["status"] == "succeeded"
    assert _actions(h, "release", rel["id"]) == [
        ("release.admitted", owner_id),
        ("release.running", "worker"),
        ("release.succeeded", "worker"),
    ]
    admitted, _, succeeded = _audit(h, object_type="release", object_id=rel["id"])["items"]
    assert admitted["detail"]["reserved"] == rel["charge"]
    assert succeeded["detail"]["ledger"] == "committed"

    # A refusal rolls the request back, yet it is recorded (on the dataset: no release exists).
    refused = h.client.post("/releases", json=body, headers=h.headers(owner))
    assert refused.status_code == 409
    assert _actions(h, "dataset", ds["id"])[-1] == ("release.refused", owner_id)

    # A job that fails before any output is refunded, and says so.
    broken = h.upload(owner, npz_bytes(*toy_dataset(seed=1))).json()
    with h.runtime.session_factory() as session:
        dataset = session.get(Dataset, broken["id"])
        assert dataset is not None
        h.runtime.store.delete(dataset.storage_key)
    failed = h.client.post("/releases", json=h.release_body(broken["id"]), headers=h.headers(owner))
    assert h.wait(owner, failed.json()["id"])["status"] == "failed"
    events = _audit(h, object_type="release", object_id=failed.json()["id"])["items"]
    assert [e["action"] for e in events][-1] == "release.failed"
    assert events[-1]["detail"]["ledger"] == "refunded" and "error" not in events[-1]["detail"]

    # Filters: by actor and by time.
    mine = _audit(h, actor=owner_id, limit=500)["items"]
    assert {e["actor"] for e in mine} == {owner_id} and len(mine) >= 6
    assert _audit(h, since=(datetime.now(UTC) + timedelta(hours=1)).isoformat())["items"] == []
    recent = _audit(h, since=start.isoformat(), limit=500)["items"]
    assert all(datetime.fromisoformat(e["at"]) >= start for e in recent)


@pytest.mark.modes("real")
def test_revocation_and_deletion_are_recorded(harness: Harness) -> None:
    h = harness
    owner, owner_id = h.new_key("owner")
    _, analyst_id = h.new_key("analyst")
    ds = h.upload(owner, npz_bytes(*toy_dataset())).json()
    url = f"/datasets/{ds['id']}"
    grant = h.client.post(
        f"{url}/grants", json={"principal_id": analyst_id}, headers=h.headers(owner)
    ).json()
    revoked = h.client.delete(f"{url}/grants/{grant['id']}", headers=h.headers(owner))
    assert revoked.status_code < 300, revoked.text
    assert _actions(h, "grant", grant["id"]) == [
        ("grant.created", owner_id),
        ("grant.revoked", owner_id),
    ]
    last = _audit(h, object_type="grant", object_id=grant["id"])["items"][-1]
    assert last["detail"] == {"dataset_id": ds["id"], "principal_id": analyst_id}
    for _ in range(2):  # deleting again changes nothing and records nothing
        assert h.client.delete(url, headers=h.headers(owner)).status_code == 200
    assert _actions(h, "dataset", ds["id"]) == [
        ("dataset.created", owner_id),
        ("dataset.deleted", owner_id),
    ]


def test_pagination_walks_every_event_once(embedded: Harness) -> None:
    h = embedded
    for _ in range(5):
        h.new_key("analyst")
    everything = _audit(h, limit=500)["items"]
    assert len(everything) >= 6  # the bootstrap admin key, by "system", and these five
    assert everything[0]["actor"] == "system"
    seen: list[int] = []
    cursor = None
    while True:
        page = _audit(h, limit=2, **({"cursor": cursor} if cursor else {}))
        seen += [e["id"] for e in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == [e["id"] for e in everything] == sorted(seen)
    bad = h.client.get("/audit", params={"cursor": "x1"}, headers=h.headers(h.admin_key))
    assert bad.status_code == 422


def test_audit_is_for_admins_only(embedded: Harness) -> None:
    h = embedded
    owner, _ = h.new_key("owner")
    analyst, _ = h.new_key("analyst")
    assert h.client.get("/audit").status_code == 401
    for key in (owner, analyst):
        r = h.client.get("/audit", headers=h.headers(key))
        assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"


def test_a_rolled_back_change_leaves_no_record(
    embedded: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = embedded
    owner, owner_id = h.new_key("owner")

    def store_down(*_args: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(h.runtime.store, "put", store_down)
    with pytest.raises(OSError, match="disk full"):
        h.upload(owner, npz_bytes(*toy_dataset()))
    with h.runtime.session_factory() as session:
        assert session.query(Dataset).count() == 0
        assert session.query(AuditEvent).filter_by(action="dataset.created").count() == 0
    assert _audit(h, actor=owner_id)["items"] == []


def test_the_table_refuses_updates_and_deletes(harness: Harness) -> None:
    h = harness
    h.new_key("owner")
    statements = [
        "UPDATE audit_events SET actor = 'someone else'",
        "DELETE FROM audit_events",
    ]
    if h.mode == "real":
        statements.append("TRUNCATE audit_events")
    for statement in statements:
        with pytest.raises(DBAPIError, match="append-only"), h.runtime.engine.begin() as conn:
            conn.execute(text(statement))
    with h.runtime.session_factory() as session:
        actors = {e.actor for e in session.query(AuditEvent)}
    assert "someone else" not in actors and len(actors) >= 2


def test_secrets_never_reach_the_audit_trail_or_the_logs(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    h = harness
    caplog.set_level(logging.DEBUG)
    owner, _ = h.new_key("owner")
    analyst, analyst_id = h.new_key("analyst")
    ds = h.upload(owner, npz_bytes(*toy_dataset())).json()
    h.client.post(
        f"/datasets/{ds['id']}/grants",
        json={"principal_id": analyst_id},
        headers=h.headers(owner),
    )
    rel = h.client.post(
        "/releases",
        json=h.release_body(ds["id"], params={"mixture_degree": 4, "n_samples": 20}),
        headers=h.headers(owner),
    ).json()
    h.wait(owner, rel["id"])
    h.client.get("/me", headers=h.headers(analyst))
    h.client.get("/me", headers=h.headers(owner + "x"))  # a wrong key: 401

    keys = [h.admin_key, owner, analyst]
    with h.runtime.session_factory() as session:
        hashes = [row.key_hash for row in session.query(ApiKey)]
        prefixes = [row.prefix for row in session.query(ApiKey)]
        trail = " ".join(
            f"{e.actor} {e.action} {e.object_type} {e.object_id} {e.detail}"
            for e in session.query(AuditEvent)
        )
    assert hash_key(owner) in hashes
    raw_sha256 = h.client.get(f"/datasets/{ds['id']}", headers=h.headers(owner)).json()["sha256"]
    for secret in [*keys, *hashes, *prefixes]:
        assert secret not in trail
        assert secret not in caplog.text
    # The upload's hash is the owner's; at DEBUG botocore itself logs the S3 content hash of
    # whatever it stores, so only our own loggers are checked for it.
    ours = [r.getMessage() for r in caplog.records if r.name.startswith(("service", "worker"))]
    assert raw_sha256 not in trail and not any(raw_sha256 in m for m in ours)
    assert "dataset.created" in trail and "release.succeeded" in trail
