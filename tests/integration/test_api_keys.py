"""API keys: listing without secrets, revocation, expiry, and rotation of the start-up admin
key (issue 14, item 4)."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from fastapi.testclient import TestClient
from sqlalchemy import select, update

from service import bootstrap
from service.app import create_app
from service.auth.service import hash_key
from service.config import Settings
from service.models import ApiKey, AuditEvent
from service.runtime import Runtime, build_runtime
from tests.conftest import TEST_DATABASE_URL, Harness, scratch_database
from worker.dispatch import default_dispatcher


def _key_id(h: Harness, key: str) -> str:
    """The id of ``key``: the one active key of its principal."""
    items = h.client.get("/api-keys", headers=h.headers(key)).json()["items"]
    active = [k["id"] for k in items if k["active"]]
    assert len(active) == 1, items
    return active[0]


def _refused(h: Harness, key: str) -> dict[str, object]:
    r = h.client.get("/me", headers=h.headers(key))
    assert r.status_code == 401, r.text
    assert r.headers["www-authenticate"] == "Bearer"
    error: dict[str, object] = r.json()["error"]
    assert error["code"] == "not_authenticated"
    return error


@pytest.mark.modes("real")
def test_listing_never_shows_secrets(harness: Harness) -> None:
    h = harness
    owner, owner_id = h.new_key("owner", name="alice")
    other, _ = h.new_key("owner")
    mine = h.client.get("/api-keys", headers=h.headers(owner))
    assert mine.status_code == 200
    items = mine.json()["items"]
    assert [k["principal_id"] for k in items] == [owner_id]
    assert items[0]["name"] == "alice" and items[0]["role"] == "owner"
    assert items[0]["active"] and items[0]["revoked_at"] is None and not items[0]["bootstrap"]
    everything = h.client.get("/api-keys", headers=h.headers(h.admin_key))
    assert everything.status_code == 200
    listed = everything.json()["items"]
    assert {owner_id} <= {k["principal_id"] for k in listed}
    assert any(k["bootstrap"] and k["role"] == "admin" for k in listed)
    with h.runtime.session_factory() as session:
        hashes = list(session.scalars(select(ApiKey.key_hash)))
        prefixes = list(session.scalars(select(ApiKey.prefix)))
    text = mine.text + everything.text
    for secret in [owner, other, h.admin_key, *hashes, *prefixes]:
        assert secret not in text
    assert set(items[0]) == {
        "id",
        "principal_id",
        "name",
        "role",
        "created_at",
        "expires_at",
        "revoked_at",
        "bootstrap",
        "active",
    }
    # An analyst lists its own principal's keys, as an owner does.
    analyst, analyst_id = h.new_key("analyst")
    theirs = h.client.get("/api-keys", headers=h.headers(analyst))
    assert theirs.status_code == 200, theirs.text
    assert [k["principal_id"] for k in theirs.json()["items"]] == [analyst_id]
    assert analyst not in theirs.text


@pytest.mark.modes("real")
def test_revoked_key_is_refused_on_its_next_request(harness: Harness) -> None:
    h = harness
    owner, owner_id = h.new_key("owner")
    assert h.client.get("/datasets", headers=h.headers(owner)).status_code == 200
    key_id = _key_id(h, owner)
    r = h.client.delete(f"/api-keys/{key_id}", headers=h.headers(h.admin_key))
    assert r.status_code == 204, r.text
    assert _refused(h, owner)["message"] == "revoked API key"
    assert h.client.get("/datasets", headers=h.headers(owner)).status_code == 401
    # Listed as revoked; revoking again changes nothing.
    listed = h.client.get("/api-keys", headers=h.headers(h.admin_key)).json()["items"]
    row = next(k for k in listed if k["id"] == key_id)
    assert row["revoked_at"] is not None and not row["active"]
    again = h.client.delete(f"/api-keys/{key_id}", headers=h.headers(h.admin_key))
    assert again.status_code == 204
    # Audited once, with who revoked it and whose key it was, never the key.
    with h.runtime.session_factory() as session:
        events = list(
            session.scalars(
                select(AuditEvent).where(
                    AuditEvent.object_id == key_id, AuditEvent.action == "api_key.revoked"
                )
            )
        )
    assert len(events) == 1
    assert events[0].detail == {"principal_id": owner_id, "reason": "revoked"}
    assert owner not in json.dumps(events[0].detail)


@pytest.mark.modes("real")
def test_owner_revokes_own_key_only(harness: Harness) -> None:
    h = harness
    owner, owner_id = h.new_key("owner")
    other, _ = h.new_key("owner")
    analyst, analyst_id = h.new_key("analyst")
    admin_key_id = next(
        k["id"]
        for k in h.client.get("/api-keys", headers=h.headers(h.admin_key)).json()["items"]
        if k["bootstrap"] and k["active"]
    )
    other_id = _id_of(h, other)
    missing = h.client.delete(
        "/api-keys/00000000-0000-0000-0000-000000000000", headers=h.headers(owner)
    )
    assert missing.status_code == 404
    for theirs in (other_id, admin_key_id):
        r = h.client.delete(f"/api-keys/{theirs}", headers=h.headers(owner))
        # Another tenant's key (or an admin's) is a missing one: 404, same code and message.
        assert r.status_code == 404, r.text
        assert r.json()["error"]["code"] == missing.json()["error"]["code"]
        assert r.json()["error"]["message"] == missing.json()["error"]["message"].replace(
            "00000000-0000-0000-0000-000000000000", theirs
        )
    assert h.client.get("/me", headers=h.headers(other)).status_code == 200
    assert h.client.get("/me", headers=h.headers(h.admin_key)).status_code == 200
    # An analyst revokes its own key (one it suspects leaked), not an owner's: a missing one.
    analyst_key_id = _key_id(h, analyst)
    r = h.client.delete(f"/api-keys/{_key_id(h, owner)}", headers=h.headers(analyst))
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", r.text
    assert h.client.get("/me", headers=h.headers(owner)).status_code == 200
    r = h.client.delete(f"/api-keys/{analyst_key_id}", headers=h.headers(analyst))
    assert r.status_code == 204, r.text
    _refused(h, analyst)
    revoked = next(
        k
        for k in h.client.get("/api-keys", headers=h.headers(h.admin_key)).json()["items"]
        if k["id"] == analyst_key_id
    )
    assert revoked["principal_id"] == analyst_id and not revoked["active"]
    # Rotation of a tenant's key: an admin issues a successor for the same principal, the
    # owner revokes the old one and keeps their datasets.
    successor = h.client.post(
        "/api-keys", json={"principal_id": owner_id}, headers=h.headers(h.admin_key)
    )
    assert successor.status_code == 201, successor.text
    new_key = successor.json()["key"]
    assert successor.json()["principal_id"] == owner_id
    old_id = next(
        k["id"]
        for k in h.client.get("/api-keys", headers=h.headers(owner)).json()["items"]
        if k["id"] != successor.json()["key_id"]
    )
    assert h.client.delete(f"/api-keys/{old_id}", headers=h.headers(owner)).status_code == 204
    _refused(h, owner)
    me = h.client.get("/me", headers=h.headers(new_key))
    assert me.status_code == 200 and me.json()["principal_id"] == owner_id


def _id_of(h: Harness, key: str) -> str:
    """The id of ``key`` (an admin's listing shows every key: found by its hash)."""
    with h.runtime.session_factory() as session:
        found = session.scalar(select(ApiKey.id).where(ApiKey.key_hash == hash_key(key)))
    assert found is not None
    return found


def _active_admin_keys(h: Harness) -> list[dict[str, object]]:
    items = h.client.get("/api-keys", headers=h.headers(h.admin_key)).json()["items"]
    return [k for k in items if k["role"] == "admin" and k["active"]]


def test_the_last_active_admin_key_cannot_be_revoked(harness: Harness) -> None:
    """Revoking the last active admin key would lock every admin out (nobody could create a
    key or audit until a new start-up key is configured and the API restarted): 409, typed,
    nothing changed. With another active admin key it can be revoked."""
    h = harness
    mine = _id_of(h, h.admin_key)
    # Real mode shares its database: other tests' admin keys are revoked (expired ones do not
    # count), so the start-up key is the one active admin key.
    soon = h.client.post(
        "/api-keys",
        json={"name": "brief", "role": "admin", "expires_in": 1},
        headers=h.headers(h.admin_key),
    )
    assert soon.status_code == 201, soon.text
    for key in _active_admin_keys(h):
        if key["id"] not in (mine, soon.json()["key_id"]):
            r = h.client.delete(f"/api-keys/{key['id']}", headers=h.headers(h.admin_key))
            assert r.status_code == 204, r.text
    with h.runtime.session_factory.begin() as session:  # the brief admin key has expired
        session.execute(
            update(ApiKey)
            .where(ApiKey.id == soon.json()["key_id"])
            .values(expires_at=datetime.now(UTC) - timedelta(seconds=1))
        )
    assert [k["id"] for k in _active_admin_keys(h)] == [mine]

    r = h.client.delete(f"/api-keys/{mine}", headers=h.headers(h.admin_key))
    assert r.status_code == 409, r.text
    error = r.json()["error"]
    assert error["code"] == "last_admin_key"
    assert "last active admin key" in error["message"]
    assert h.client.get("/me", headers=h.headers(h.admin_key)).status_code == 200
    with h.runtime.session_factory() as session:
        revoked = session.scalars(
            select(AuditEvent).where(
                AuditEvent.action == "api_key.revoked", AuditEvent.object_id == mine
            )
        ).all()
    assert revoked == []

    # Another admin key exists: either may now be revoked, but not both.
    other, _ = h.new_key("admin")
    other_id = _id_of(h, other)
    if h.mode == "embedded":  # real mode's start-up key serves the rest of the session
        r = h.client.delete(f"/api-keys/{mine}", headers=h.headers(other))
        assert r.status_code == 204, r.text
        _refused(h, h.admin_key)
        r = h.client.delete(f"/api-keys/{other_id}", headers=h.headers(other))
        assert r.status_code == 409 and r.json()["error"]["code"] == "last_admin_key"
    else:
        r = h.client.delete(f"/api-keys/{other_id}", headers=h.headers(h.admin_key))
        assert r.status_code == 204, r.text
        r = h.client.delete(f"/api-keys/{mine}", headers=h.headers(h.admin_key))
        assert r.status_code == 409 and r.json()["error"]["code"] == "last_admin_key"
    survivor = other if h.mode == "embedded" else h.admin_key
    assert h.client.get("/me", headers=h.headers(survivor)).status_code == 200


def test_create_key_input(embedded: Harness) -> None:
    h = embedded
    admin = h.headers(h.admin_key)
    for body in (
        {},
        {"name": "x"},
        {"role": "owner"},
        {"name": "x", "role": "owner", "principal_id": "p"},
        {"name": "x", "role": "owner", "expires_in": 0},
        {"name": "x", "role": "owner", "expires_in": "60"},
        {"name": "x", "role": "owner", "expires_in": True},
        {"name": "x", "role": "owner", "expires_in": 1.5},
        {"principal_id": None},
    ):
        r = h.client.post("/api-keys", json=body, headers=admin)
        assert r.status_code == 422, (body, r.text)
    r = h.client.post("/api-keys", json={"principal_id": "nobody"}, headers=admin)
    assert r.status_code == 404


def test_expired_key_is_refused(harness: Harness) -> None:
    h = harness
    before = datetime.now(UTC)
    r = h.client.post(
        "/api-keys",
        json={"name": "temp", "role": "analyst", "expires_in": 3600},
        headers=h.headers(h.admin_key),
    )
    assert r.status_code == 201, r.text
    key, key_id = r.json()["key"], r.json()["key_id"]
    expires = datetime.fromisoformat(r.json()["expires_at"])
    assert timedelta(hours=1) <= expires - before < timedelta(hours=1, minutes=1)
    assert h.client.get("/me", headers=h.headers(key)).status_code == 200
    # An hour later (the row's expiry moved, rather than the clock).
    with h.runtime.session_factory() as session:
        session.execute(
            update(ApiKey)
            .where(ApiKey.id == key_id)
            .values(expires_at=datetime.now(UTC) - timedelta(seconds=1))
        )
        session.commit()
    assert _refused(h, key)["message"] == "expired API key"
    listed = h.client.get("/api-keys", headers=h.headers(h.admin_key)).json()["items"]
    assert not next(k for k in listed if k["id"] == key_id)["active"]


def _serve(home: Path, admin_key: str) -> tuple[TestClient, Runtime]:
    settings = Settings(home=home, admin_key=admin_key)  # type: ignore[call-arg,arg-type]
    bootstrap.prepare(settings)
    runtime = build_runtime(settings, default_dispatcher)
    return TestClient(create_app(runtime=runtime)), runtime


def test_changing_the_admin_key_setting_rotates_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in [v for v in os.environ if v.startswith("DPRELEASE_") and "TEST" not in v]:
        monkeypatch.delenv(var)
    home = tmp_path / "home"
    old, new = "dpr_old-admin-" + "a" * 32, "dpr_new-admin-" + "b" * 32

    def me(client: TestClient, key: str) -> int:
        return client.get("/me", headers={"Authorization": f"Bearer {key}"}).status_code

    client, runtime = _serve(home, old)
    with client:
        assert me(client, old) == 200
        admin_id = client.get("/me", headers={"Authorization": f"Bearer {old}"}).json()[
            "principal_id"
        ]
        owner = client.post(
            "/api-keys",
            json={"name": "o", "role": "owner"},
            headers={"Authorization": f"Bearer {old}"},
        ).json()["key"]
    runtime.engine.dispose()

    # Restarting with the same key changes nothing.
    client, runtime = _serve(home, old)
    with client:
        assert me(client, old) == 200
    runtime.engine.dispose()

    # Restarting with a new key: the old one is refused, the new one works (same admin).
    client, runtime = _serve(home, new)
    with client:
        assert me(client, old) == 401
        r = client.get("/me", headers={"Authorization": f"Bearer {new}"})
        assert r.status_code == 200 and r.json()["principal_id"] == admin_id
        assert me(client, owner) == 200  # other keys are untouched
        keys = client.get("/api-keys", headers={"Authorization": f"Bearer {new}"}).json()
        boot = [k for k in keys["items"] if k["bootstrap"]]
        assert [k["active"] for k in boot] == [False, True]
    runtime.engine.dispose()

    # Going back to the old key does not bring it back: it stays revoked.
    client, runtime = _serve(home, old)
    with client:
        assert me(client, old) == 401
        assert me(client, new) == 200
    runtime.engine.dispose()


def _upgrade_marks_the_start_up_key(url: str) -> None:
    """Migration 0015 flags a deployment's existing start-up admin key as ``bootstrap`` (so that
    changing DPRELEASE_ADMIN_KEY after the upgrade revokes it), and nothing else."""
    config = bootstrap.alembic_config(url)
    command.upgrade(config, "0014")
    engine = sa.create_engine(url)
    rows = [  # key id, principal name, role, creating actor (None: no audit event)
        ("k-boot", "admin", "admin", "system"),
        ("k-legacy", "admin", "admin", None),  # from before the audit trail
        ("k-api-admin", "admin", "admin", "p-k-boot"),  # an admin named admin, made by API
        ("k-owner", "o", "owner", "p-k-boot"),
    ]
    with engine.begin() as conn:
        for key_id, name, role, actor in rows:
            conn.execute(
                sa.text(
                    "INSERT INTO principals (id, name, role, created_at) "
                    "VALUES (:p, :name, :role, CURRENT_TIMESTAMP)"
                ),
                {"p": f"p-{key_id}", "name": name, "role": role},
            )
            conn.execute(
                sa.text(
                    "INSERT INTO api_keys (id, principal_id, key_hash, prefix, created_at) "
                    "VALUES (:id, :p, :h, 'dpr_', CURRENT_TIMESTAMP)"
                ),
                {"id": key_id, "p": f"p-{key_id}", "h": key_id.ljust(64, "0")},
            )
            if actor is not None:
                conn.execute(
                    sa.text(
                        "INSERT INTO audit_events (at, actor, action, object_type, object_id, "
                        "detail) VALUES (CURRENT_TIMESTAMP, :actor, 'api_key.created', "
                        "'api_key', :id, '{}')"
                    ),
                    {"actor": actor, "id": key_id},
                )
    command.upgrade(config, "head")
    with engine.connect() as conn:
        flagged: dict[str, object] = {
            k: v for k, v in conn.execute(sa.text("SELECT id, bootstrap FROM api_keys")).all()
        }
        expires = set(conn.execute(sa.text("SELECT expires_at FROM api_keys")).scalars())
    assert {k: bool(v) for k, v in flagged.items()} == {
        "k-boot": True,
        "k-legacy": True,
        "k-api-admin": False,
        "k-owner": False,
    }
    assert expires == {None}
    command.downgrade(config, "0014")
    engine.dispose()


def test_upgrade_marks_the_start_up_key_sqlite(tmp_path: Path) -> None:
    _upgrade_marks_the_start_up_key(f"sqlite:///{tmp_path / 'keys.db'}")


def test_upgrade_marks_the_start_up_key_postgres() -> None:
    with scratch_database(TEST_DATABASE_URL) as url:
        _upgrade_marks_the_start_up_key(url)


def test_embedded_admin_key_file_rotation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Embedded mode without DPRELEASE_ADMIN_KEY: deleting admin.key generates a new key at
    the next start, and the old one is refused."""
    for var in [v for v in os.environ if v.startswith("DPRELEASE_") and "TEST" not in v]:
        monkeypatch.delenv(var)
    home = tmp_path / "home"

    def start() -> tuple[TestClient, Runtime]:
        settings = Settings(home=home)  # type: ignore[call-arg]
        bootstrap.prepare(settings)
        runtime = build_runtime(settings, default_dispatcher)
        return TestClient(create_app(runtime=runtime)), runtime

    client, runtime = start()
    with client:
        old = (home / "admin.key").read_text().strip()
        assert client.get("/me", headers={"Authorization": f"Bearer {old}"}).status_code == 200
    runtime.engine.dispose()
    (home / "admin.key").unlink()
    client, runtime = start()
    with client:
        new = (home / "admin.key").read_text().strip()
        assert new != old
        assert client.get("/me", headers={"Authorization": f"Bearer {old}"}).status_code == 401
        assert client.get("/me", headers={"Authorization": f"Bearer {new}"}).status_code == 200
    runtime.engine.dispose()
