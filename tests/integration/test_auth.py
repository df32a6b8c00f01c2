"""Who may do what: keys, roles, tenants and grants."""

from __future__ import annotations

import pytest

from tests.conftest import Harness, npz_bytes, toy_dataset


def _setup(h: Harness) -> dict[str, str]:
    owner, owner_id = h.new_key("owner")
    other, _ = h.new_key("owner")
    analyst, analyst_id = h.new_key("analyst")
    stranger, _ = h.new_key("analyst")
    X, y = toy_dataset()
    ds = h.upload(owner, npz_bytes(X, y)).json()
    rel = h.client.post(
        "/releases",
        json=h.release_body(ds["id"], params={"mixture_degree": 4, "n_samples": 20}),
        headers=h.headers(owner),
    ).json()
    h.wait(owner, rel["id"])
    return {
        "owner": owner,
        "owner_id": owner_id,
        "other": other,
        "analyst": analyst,
        "analyst_id": analyst_id,
        "stranger": stranger,
        "dataset": ds["id"],
        "release": rel["id"],
    }


def test_missing_or_wrong_key_is_401(embedded: Harness) -> None:
    h = embedded
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic abc"}):
        r = h.client.get("/datasets", headers=headers)
        assert r.status_code == 401, headers
        assert r.json()["error"]["code"] == "not_authenticated"
        assert r.headers["www-authenticate"] == "Bearer"


def test_key_creation_is_admin_only_and_keys_are_hashed(embedded: Harness) -> None:
    h = embedded
    owner, owner_id = h.new_key("owner", name="alice")
    me = h.client.get("/me", headers=h.headers(owner)).json()
    assert me == {"principal_id": owner_id, "name": "alice", "role": "owner"}
    r = h.client.post("/api-keys", json={"name": "x", "role": "admin"}, headers=h.headers(owner))
    assert r.status_code == 403
    from sqlalchemy import select

    from service.models import ApiKey

    with h.runtime.session_factory() as session:
        stored = list(session.scalars(select(ApiKey.key_hash)))
    assert owner not in stored and all(len(s) == 64 for s in stored)


@pytest.mark.modes("real")
def test_tenants_and_grants(harness: Harness) -> None:
    h = harness
    s = _setup(h)
    ds, rel = s["dataset"], s["release"]

    def status(key: str, method: str, url: str, **kw: object) -> int:
        return h.client.request(method, url, headers=h.headers(key), **kw).status_code  # type: ignore[arg-type]

    # Another owner sees nothing of it: 404 everywhere, as for a missing id.
    assert status(s["other"], "GET", f"/datasets/{ds}") == 404
    assert status(s["other"], "GET", f"/releases/{rel}") == 404
    assert status(s["other"], "GET", f"/releases/{rel}/download") == 404
    assert status(s["other"], "GET", f"/budgets/{ds}") == 404
    assert ds not in [
        d["id"] for d in h.client.get("/datasets", headers=h.headers(s["other"])).json()["items"]
    ]
    body = h.release_body(ds)
    assert status(s["other"], "POST", "/releases", json=body) == 404
    assert (
        status(s["other"], "POST", f"/datasets/{ds}/grants", json={"principal_id": s["analyst_id"]})
        == 404
    )

    # Analysts: nothing before a grant, read and download after.
    assert status(s["analyst"], "GET", f"/releases/{rel}") == 404
    assert h.client.get("/releases", headers=h.headers(s["analyst"])).json()["items"] == []
    assert status(s["analyst"], "POST", "/releases", json=body) == 403
    assert status(s["analyst"], "GET", "/budgets") == 403
    grant = h.client.post(
        f"/datasets/{ds}/grants",
        json={"principal_id": s["analyst_id"]},
        headers=h.headers(s["owner"]),
    )
    assert grant.status_code == 201, grant.text
    assert status(s["analyst"], "GET", f"/releases/{rel}") == 200
    assert [
        r["id"] for r in h.client.get("/releases", headers=h.headers(s["analyst"])).json()["items"]
    ] == [rel]
    assert len(h.download(s["analyst"], rel)) > 0
    assert status(s["stranger"], "GET", f"/releases/{rel}") == 404
    # Statistics of the raw data are the owner's alone.
    seen = {
        who: h.client.get(f"/datasets/{ds}", headers=h.headers(s[who])).json()
        for who in ("owner", "analyst")
    }
    assert seen["owner"]["sha256"] and seen["owner"]["clipped_values"] == 0
    assert seen["analyst"]["sha256"] is None and seen["analyst"]["clipped_values"] is None
    # Grants go to analysts only.
    bad = h.client.post(
        f"/datasets/{ds}/grants",
        json={"principal_id": s["owner_id"]},
        headers=h.headers(s["owner"]),
    )
    assert bad.status_code == 422

    # Admins read every dataset, release and budget, but do not release.
    admin = h.admin_key
    assert status(admin, "GET", f"/datasets/{ds}") == 200
    admin_view = h.client.get(f"/datasets/{ds}", headers=h.headers(admin)).json()
    assert admin_view["sha256"] is None and admin_view["clipped_values"] is None
    assert status(admin, "GET", f"/budgets/{ds}") == 200
    assert ds in [
        b["dataset_id"] for b in h.client.get("/budgets", headers=h.headers(admin)).json()["items"]
    ]
    assert status(admin, "POST", "/releases", json=body) == 403


@pytest.mark.parametrize("path", ["/datasets", "/releases", "/budgets", "/me"])
def test_every_read_endpoint_needs_a_key(embedded: Harness, path: str) -> None:
    assert embedded.client.get(path).status_code == 401


def test_grants_are_listed_and_revocable(embedded: Harness) -> None:
    h = embedded
    s = _setup(h)
    ds, rel = s["dataset"], s["release"]
    grant = h.client.post(
        f"/datasets/{ds}/grants",
        json={"principal_id": s["analyst_id"]},
        headers=h.headers(s["owner"]),
    ).json()
    for key in (s["owner"], h.admin_key):
        listed = h.client.get(f"/datasets/{ds}/grants", headers=h.headers(key)).json()["items"]
        assert [(g["id"], g["principal_id"]) for g in listed] == [(grant["id"], s["analyst_id"])]
    assert h.client.get(f"/releases/{rel}", headers=h.headers(s["analyst"])).status_code == 200
    url = f"/datasets/{ds}/grants/{grant['id']}"
    assert h.client.delete(url, headers=h.headers(s["owner"])).status_code == 204
    # Revoked: the analyst sees nothing again, and the grant is gone.
    assert h.client.get(f"/releases/{rel}", headers=h.headers(s["analyst"])).status_code == 404
    assert h.client.get("/releases", headers=h.headers(s["analyst"])).json()["items"] == []
    assert h.client.get(f"/datasets/{ds}/grants", headers=h.headers(s["owner"])).json() == {
        "items": []
    }
    assert h.client.delete(url, headers=h.headers(s["owner"])).status_code == 404
