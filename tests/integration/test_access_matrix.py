"""Every operation of the OpenAPI schema that takes ids, called by every kind of caller.

The operations are read from ``app.openapi()``, not listed here: a new operation with a path
id fails this test until POLICY says who may call it. Each one is called on real objects (a
dataset with a grant, a succeeded release with an owner report and a further file, a queued
release to cancel) as their owner, another owner, an analyst granted the dataset, one not
granted it, an admin and an anonymous caller, and every answer is compared with POLICY. Every
refusal must also be indistinguishable from the answer for an id that does not exist (status,
error code and message, ids aside), and an owner naming another tenant's object in any id gets
that same answer.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from service.runtime import Route
from tests import toy_mechanism as toy
from tests.conftest import Harness, npz_bytes, toy_dataset

OWNER, OTHER, GRANTED, UNGRANTED, ADMIN, ANON = (
    "owner",
    "other owner",
    "granted analyst",
    "ungranted analyst",
    "admin",
    "anonymous",
)
ROLE = {OWNER: "owner", OTHER: "owner", GRANTED: "analyst", UNGRANTED: "analyst", ADMIN: "admin"}
DOWNLOAD = (200, 307)  # the file (local store) or a redirect to a presigned URL (S3)

# Expected status per operationId and caller (anonymous callers always get 401).
POLICY: dict[str, dict[str, int | tuple[int, ...]]] = {
    "get_dataset": {OWNER: 200, OTHER: 404, GRANTED: 200, UNGRANTED: 404, ADMIN: 200},
    "delete_dataset": {OWNER: 200, OTHER: 404, GRANTED: 403, UNGRANTED: 403, ADMIN: 403},
    "create_grant": {OWNER: 201, OTHER: 404, GRANTED: 403, UNGRANTED: 403, ADMIN: 403},
    "list_grants": {OWNER: 200, OTHER: 404, GRANTED: 403, UNGRANTED: 403, ADMIN: 200},
    "revoke_grant": {OWNER: 204, OTHER: 404, GRANTED: 403, UNGRANTED: 403, ADMIN: 403},
    "get_release": {OWNER: 200, OTHER: 404, GRANTED: 200, UNGRANTED: 404, ADMIN: 200},
    "download_release": {
        OWNER: DOWNLOAD,
        OTHER: 404,
        GRANTED: DOWNLOAD,
        UNGRANTED: 404,
        ADMIN: DOWNLOAD,
    },
    # Post-processing of the download: its readers.
    "summarise_release": {OWNER: 200, OTHER: 404, GRANTED: 200, UNGRANTED: 404, ADMIN: 200},
    # Computed on the owner's raw data: the requesting owner only, admins included out.
    "download_release_artifact": {
        OWNER: DOWNLOAD,
        OTHER: 404,
        GRANTED: DOWNLOAD,
        UNGRANTED: 404,
        ADMIN: DOWNLOAD,
    },
    # The rows as drawn before post-processing: the requesting owner only (other roles are
    # refused by role, for any id alike).
    "download_raw_release": {OWNER: DOWNLOAD, OTHER: 404, GRANTED: 403, UNGRANTED: 403, ADMIN: 403},
    "get_report": {OWNER: 200, OTHER: 404, GRANTED: 403, UNGRANTED: 403, ADMIN: 403},
    "get_ledger": {OWNER: 200, OTHER: 404, GRANTED: 403, UNGRANTED: 403, ADMIN: 200},
    # Owners act on their datasets' releases; admins audit, they do not act on tenants' data.
    "cancel_release": {OWNER: 200, OTHER: 404, GRANTED: 403, UNGRANTED: 403, ADMIN: 403},
    # Admins revoke any key, owners and analysts their own (a revoked key revoked again: 204
    # again); the owner's key is another principal's to an analyst: a missing one.
    "revoke_api_key": {OWNER: 204, OTHER: 404, GRANTED: 404, UNGRANTED: 404, ADMIN: 204},
}

# Operations that destroy their object (or end it: a cancel) act on a disposable one (per path
# parameter), so the others still find theirs.
DISPOSABLE = {
    "delete_dataset": {"dataset_id"},
    "revoke_grant": {"grant_id"},
    "cancel_release": {"release_id"},
    "revoke_api_key": {"key_id"},
}


@dataclass
class World:
    keys: dict[str, str]
    ids: dict[str, str]  # path parameter → the owner's object (or name, for "name")
    disposable: dict[str, str]  # path parameter → a second object of the owner's
    foreign: dict[str, str]  # path parameter → the other owner's object
    granted_id: str


BODIES: dict[str, Callable[[World], dict[str, Any]]] = {
    # Granting again what exists changes nothing.
    "create_grant": lambda w: {"principal_id": w.granted_id},
}


def _grant(h: Harness, owner: str, dataset_id: str, analyst_id: str) -> str:
    r = h.client.post(
        f"/datasets/{dataset_id}/grants",
        json={"principal_id": analyst_id},
        headers=h.headers(owner),
    )
    assert r.status_code == 201, r.text
    grant_id: str = r.json()["id"]
    return grant_id


def _release(h: Harness, owner: str, dataset_id: str, **extra: Any) -> str:
    body = h.release_body(dataset_id, **{"params": {"mixture_degree": 4, "n_samples": 20}, **extra})
    r = h.client.post("/releases", json=body, headers=h.headers(owner))
    assert r.status_code == 202, r.text
    release_id: str = r.json()["id"]
    return release_id


class Held:
    """A dispatcher that queues nothing: a release admitted through it stays queued."""

    def enqueue(self, release_id: str, queue: Route) -> None:
        pass

    def shutdown(self) -> None:
        pass


def _queued_release(h: Harness, owner: str, dataset_id: str) -> str:
    dispatcher = h.runtime.dispatcher
    h.runtime.dispatcher = Held()
    try:
        release_id = _release(h, owner, dataset_id)
    finally:
        h.runtime.dispatcher = dispatcher
    return release_id


def _spare_key(h: Harness, principal_id: str) -> str:
    r = h.client.post(
        "/api-keys", json={"principal_id": principal_id}, headers=h.headers(h.admin_key)
    )
    assert r.status_code == 201, r.text
    key_id: str = r.json()["key_id"]
    return key_id


def _key_of(h: Harness, principal_id: str) -> str:
    items = h.client.get("/api-keys", headers=h.headers(h.admin_key)).json()["items"]
    key_id: str = next(k["id"] for k in items if k["principal_id"] == principal_id)
    return key_id


def build_world(h: Harness) -> World:
    owner, owner_id = h.new_key("owner")
    other, other_id = h.new_key("owner")
    granted, granted_id = h.new_key("analyst")
    ungranted, _ = h.new_key("analyst")
    _, spare_id = h.new_key("analyst")
    data = npz_bytes(*toy_dataset())
    ds, held_out, spare_ds, theirs = (
        h.upload(key, data).json()["id"] for key in (owner, owner, owner, other)
    )
    grant = _grant(h, owner, ds, granted_id)
    spare_grant = _grant(h, owner, ds, spare_id)
    _grant(h, owner, spare_ds, granted_id)
    their_grant = _grant(h, other, theirs, granted_id)
    # The test-only mechanism, for a release with a further file (weights.json).
    toy_body = {
        "mechanism": toy.NAME,
        "params": {
            "rows": 20,
            "totals_noise": 20.0,
            "with_weights": True,
            "postprocess": "denoise",
        },
    }
    rel = _release(h, owner, ds, report_test_dataset_id=held_out, **toy_body)
    their_rel = _release(h, other, theirs, **toy_body)
    for key, rid in ((owner, rel), (other, their_rel)):
        assert h.wait(key, rid)["status"] == "succeeded"
    queued = _queued_release(h, owner, ds)  # for the cancel
    # A second key of the owner's, to revoke; the other owner's key, to fail to.
    spare_key = _spare_key(h, owner_id)
    their_key = _key_of(h, other_id)
    return World(
        keys={OWNER: owner, OTHER: other, GRANTED: granted, UNGRANTED: ungranted},
        ids={"dataset_id": ds, "release_id": rel, "grant_id": grant, "name": toy.WEIGHTS},
        disposable={
            "dataset_id": spare_ds,
            "grant_id": spare_grant,
            "release_id": queued,
            "key_id": spare_key,
        },
        foreign={
            "dataset_id": theirs,
            "release_id": their_rel,
            "grant_id": their_grant,
            "key_id": their_key,
        },
        granted_id=granted_id,
    )


def id_operations(schema: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(method, path, operation) of every operation whose path names an id."""
    return [
        (method, path, op)
        for path, methods in schema["paths"].items()
        if "{" in path
        for method, op in methods.items()
    ]


_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _shape(r: Any) -> tuple[int, str, str]:
    """What a refusal tells the caller, ids aside."""
    error: dict[str, str] = {}
    if r.status_code >= 400 and r.headers.get("content-type") == "application/json":
        error = r.json().get("error") or {}
    return r.status_code, error.get("code", ""), _UUID.sub("<id>", error.get("message", ""))


@pytest.mark.modes("real")
def test_every_id_operation_against_every_caller(
    toy_harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = toy_harness
    # Hundreds of calls with one key, as fast as the machine goes: the per-key rate limit
    # (tested in test_request_limits.py) would answer some of them 429 on a fast machine.
    monkeypatch.setattr(h.runtime.settings, "rate_limit", "")
    schema = h.client.app.openapi()  # type: ignore[attr-defined]
    operations = id_operations(schema)
    op_ids = [op["operationId"] for _, _, op in operations]
    assert len(op_ids) == len(set(op_ids))
    assert set(op_ids) == set(POLICY), "POLICY must cover exactly the id-bearing operations"
    # The roles each operation declares (read from what it enforces) agree with POLICY.
    for _, _, op in operations:
        access, expected = op["x-access"], POLICY[op["operationId"]]
        assert access["authenticated"] and access["objects"], op["operationId"]
        for caller, status in expected.items():
            assert (status == 403) == (ROLE[caller] not in access["roles"]), (
                op["operationId"],
                caller,
            )
    for method, _, op in operations:
        if method == "delete":
            assert op["operationId"] in DISPOSABLE, op["operationId"]

    w = build_world(h)
    failures: list[str] = []

    def call(method: str, path: str, op: dict[str, Any], key: str | None, ids: dict[str, str]):  # type: ignore[no-untyped-def]
        body = BODIES[op["operationId"]](w) if "requestBody" in op else None
        return h.client.request(
            method,
            path.format(**ids),
            json=body,
            headers=h.headers(key) if key else {},
            follow_redirects=False,
        )

    # Destructive operations last; within one, the owner (who succeeds) last.
    operations.sort(key=lambda o: o[0] == "delete")
    for method, path, op in operations:
        op_id = op["operationId"]
        assert "requestBody" not in op or op_id in BODIES, f"{op_id}: add a body to BODIES"
        params = re.findall(r"{(\w+)}", path)
        ids = {p: (w.disposable if p in DISPOSABLE.get(op_id, ()) else w.ids)[p] for p in params}

        anonymous = call(method, path, op, None, ids)
        if anonymous.status_code != 401 or anonymous.headers.get("www-authenticate") != "Bearer":
            failures.append(f"{op_id} {ANON}: {anonymous.status_code}, expected 401")

        for caller in (OTHER, GRANTED, UNGRANTED, ADMIN, OWNER):
            key = h.admin_key if caller == ADMIN else w.keys[caller]
            # The same call with each id replaced by one that does not exist, first.
            missing = [
                _shape(call(method, path, op, key, {**ids, p: str(uuid.uuid4())})) for p in params
            ]
            if caller == OWNER:
                # Another tenant's object in any id: the answer of a missing one. (A name
                # within an object, an artifact's, belongs to no tenant: the id before it does.)
                for p, nothing in zip(params, missing, strict=True):
                    if p not in w.foreign:
                        continue
                    theirs = _shape(call(method, path, op, key, {**ids, p: w.foreign[p]}))
                    if theirs != nothing:
                        failures.append(f"{op_id} {caller} with another's {p}: {theirs}")
            r = call(method, path, op, key, ids)
            expected = POLICY[op_id][caller]
            allowed = expected if isinstance(expected, tuple) else (expected,)
            if r.status_code not in allowed:
                failures.append(f"{op_id} {caller}: {r.status_code}, expected {expected}")
            elif r.status_code < 400:
                # Allowed here, so a missing id must be what refuses the call.
                failures += [
                    f"{op_id} {caller} missing {p}: {shape}"
                    for p, shape in zip(params, missing, strict=True)
                    if shape[:2] != (404, "not_found")
                ]
            elif any(shape[:2] != _shape(r)[:2] for shape in missing):
                failures.append(f"{op_id} {caller}: {_shape(r)} but missing ids {missing}")
            elif caller in (OTHER, UNGRANTED) and any(shape != _shape(r) for shape in missing):
                # Callers that may not see the object at all get the very same message.
                failures.append(f"{op_id} {caller}: {_shape(r)} leaks; missing ids {missing}")

    assert not failures, "\n".join(failures)


@pytest.mark.modes("embedded")
def test_ids_in_bodies_and_queries(toy_harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ids outside the path are checked alike: another tenant's is a missing one."""
    h = toy_harness
    monkeypatch.setattr(h.runtime.settings, "rate_limit", "")  # as above
    w = build_world(h)
    owner, theirs = w.keys[OWNER], w.foreign["dataset_id"]
    ds, nothing = w.ids["dataset_id"], str(uuid.uuid4())

    def post(path: str, body: dict[str, Any]) -> tuple[int, str, str]:
        return _shape(h.client.post(path, json=body, headers=h.headers(owner)))

    for path in ("/releases", "/releases/preview"):
        mine, other = (post(path, h.release_body(x)) for x in (theirs, nothing))
        assert mine == other and mine[0] == 404, (path, mine)
    report = [
        post("/releases", h.release_body(ds, report_test_dataset_id=x)) for x in (theirs, nothing)
    ]
    assert report[0] == report[1] and report[0][0] == 404
    for caller, status in (
        (OWNER, 200),
        (ADMIN, 200),
        (GRANTED, 200),
        (OTHER, 404),
        (UNGRANTED, 404),
    ):
        key = h.admin_key if caller == ADMIN else w.keys[caller]
        seen = h.client.get("/releases", params={"dataset_id": ds}, headers=h.headers(key))
        assert seen.status_code == status, caller
        if status == 404:
            missing = h.client.get(
                "/releases", params={"dataset_id": nothing}, headers=h.headers(key)
            )
            assert _shape(seen) == _shape(missing), caller
        else:
            listed = [r["id"] for r in seen.json()["items"]]
            assert listed == [w.ids["release_id"], w.disposable["release_id"]], caller


def test_every_operation_declares_who_may_call_it(embedded: Harness) -> None:
    """Every operation of the schema declares its roles (and, with ids, its object rule); all
    but the probes (/health, /ready) need a key, and answer 401 without one."""
    h = embedded
    schema = h.client.app.openapi()  # type: ignore[attr-defined]
    public = set()
    for path, methods in schema["paths"].items():
        for method, op in methods.items():
            access = op["x-access"]
            if not access["authenticated"]:
                public.add(op["operationId"])
                continue
            assert op["security"] == [{"ApiKey": []}] and access["roles"], op["operationId"]
            assert ("{" in path) == ("objects" in access), op["operationId"]
            r = h.client.request(method, re.sub(r"{\w+}", str(uuid.uuid4()), path))
            assert r.status_code == 401, (method, path, r.status_code)
    assert public == {"health", "ready"}
