"""No side channels in the API: what the raw file alone determines, and no privacy charge
covers, reaches its owner only (issue 10, item 4).

- the upload's size in bytes (neighbouring CSV files differ in length);
- the labels found in a file whose owner declared no classes (a rare label is one record's
  value), in dataset views and in release files: such a dataset takes no release;
- a failed job's error text, which may quote the raw data: analysts *and admins* see that it
  failed, not why.
"""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
import pandas as pd
import pytest

from service.models import Dataset
from service.releases import keys
from tests.conftest import Harness, npz_bytes, toy_dataset
from tests.integration.test_access_matrix import Held
from worker import runner

SECRET = "HIV-positive"


def _csv(n: int = 60, *, rare: str | None = None, seed: int = 0) -> bytes:
    """Labels "a"/"b", and one record labelled ``rare`` when given."""
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame(rng.uniform(0, 1, size=(n, 3)), columns=["f0", "f1", "f2"])
    frame["label"] = ["a", "b"] * (n // 2)
    if rare is not None:
        frame.loc[0, "label"] = rare
    buffer = io.StringIO()
    frame.to_csv(buffer, index=False)
    return buffer.getvalue().encode()


def _meta(**overrides: Any) -> dict[str, Any]:
    return {
        "name": "survey",
        "label_column": "label",
        "feature_range": [0, 1],
        "budget": {"epsilon": 5.0, "delta": 1e-5},
        **overrides,
    }


def _readers(h: Harness, owner: str, dataset_id: str) -> dict[str, str]:
    """The owner, an analyst granted the dataset, and the admin."""
    analyst, analyst_id = h.new_key("analyst")
    r = h.client.post(
        f"/datasets/{dataset_id}/grants",
        json={"principal_id": analyst_id},
        headers=h.headers(owner),
    )
    assert r.status_code == 201, r.text
    return {"owner": owner, "analyst": analyst, "admin": h.admin_key}


def _views(h: Harness, key: str, dataset_id: str) -> list[dict[str, Any]]:
    """The dataset as ``key`` sees it, alone and in the listing."""
    one = h.client.get(f"/datasets/{dataset_id}", headers=h.headers(key))
    assert one.status_code == 200, one.text
    listed = h.client.get("/datasets", headers=h.headers(key)).json()["items"]
    return [one.json(), *[d for d in listed if d["id"] == dataset_id]]


@pytest.mark.modes("real")
def test_size_bytes_is_the_owners_only(harness: Harness) -> None:
    h = harness
    owner, _ = h.new_key("owner")
    content = _csv()
    ds = h.upload(owner, content, filename="d.csv", metadata=_meta(classes=["a", "b"])).json()
    assert ds["size_bytes"] == len(content)
    keys = _readers(h, owner, ds["id"])
    for role, key in keys.items():
        views = _views(h, key, ds["id"])
        assert len(views) == 2
        for view in views:
            assert view["size_bytes"] == (len(content) if role == "owner" else None), role
            if role != "owner":
                assert str(len(content)) not in json.dumps(view)


@pytest.mark.modes("real")
def test_undeclared_classes_are_the_owners_only_and_take_no_release(harness: Harness) -> None:
    h = harness
    owner, _ = h.new_key("owner")
    r = h.upload(owner, _csv(rare=SECRET), filename="d.csv", metadata=_meta())
    assert r.status_code == 201, r.text
    ds = r.json()
    # The owner sees what was found in their file (and that it was not declared).
    assert ds["classes"] == [SECRET, "a", "b"] and ds["classes_declared_by_owner"] is False
    keys = _readers(h, owner, ds["id"])
    for role in ("analyst", "admin"):
        for view in _views(h, keys[role], ds["id"]):
            assert view["classes"] is None and view["classes_declared_by_owner"] is False
            assert SECRET not in json.dumps(view)
    owner_view = _views(h, owner, ds["id"])[0]
    assert owner_view["classes"] == [SECRET, "a", "b"]

    # No mechanism may publish them: every release and preview is refused, nothing charged.
    body = h.release_body(ds["id"])
    for path in ("/releases", "/releases/preview"):
        refused = h.client.post(path, json=body, headers=h.headers(owner))
        assert refused.status_code == 409, refused.text
        error = refused.json()["error"]
        assert error["code"] == "classes_undeclared" and "classes" in error["message"]
        assert SECRET not in refused.text
    ledger = h.client.get(f"/budgets/{ds['id']}", headers=h.headers(owner)).json()
    assert ledger["entries"] == [] and ledger["reserved"] == 0
    assert h.client.get("/releases", headers=h.headers(owner)).json()["items"] == []
    # Nor does anything in the audit trail name them.
    audit = h.client.get("/audit", params={"limit": 500}, headers=h.headers(h.admin_key))
    assert audit.status_code == 200 and SECRET not in audit.text


@pytest.mark.modes("real")
def test_release_files_name_the_declared_classes_only(harness: Harness) -> None:
    """Labels come from the declaration, absent classes included, whatever the file holds."""
    h = harness
    owner, _ = h.new_key("owner")
    declared = ["a", "b", "c"]  # "c" is in no record
    ds = h.upload(owner, _csv(), filename="d.csv", metadata=_meta(classes=declared)).json()
    keys = _readers(h, owner, ds["id"])
    for key in keys.values():
        assert all(view["classes"] == declared for view in _views(h, key, ds["id"]))
    body = h.release_body(ds["id"], params={"mixture_degree": 4, "n_samples": 40})
    created = h.client.post("/releases", json=body, headers=h.headers(owner))
    assert created.status_code == 202, created.text
    done = h.wait(owner, created.json()["id"])
    assert done["status"] == "succeeded", done["error"]
    with np.load(io.BytesIO(h.download(keys["analyst"], done["id"]))) as npz:
        metadata = json.loads(str(npz["metadata"]))
        assert npz["y"].shape == (40, 3)
    assert metadata["classes"] == declared


@pytest.fixture
def failing_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """Jobs fail with a text quoting the raw data, as a parser's or a mechanism's might."""

    def build(*args: Any, **kwargs: Any) -> Any:
        raise ValueError(f"cannot mix record 17, label {SECRET!r}, value 0.7531")

    monkeypatch.setattr("worker.writing.build", build)


def test_error_texts_are_the_owners_only(embedded: Harness, failing_job: None) -> None:
    h = embedded
    owner, _ = h.new_key("owner")
    ds = h.upload(owner, npz_bytes(*toy_dataset())).json()
    keys = _readers(h, owner, ds["id"])
    created = h.client.post("/releases", json=h.release_body(ds["id"]), headers=h.headers(owner))
    assert created.status_code == 202, created.text
    release_id = created.json()["id"]
    assert h.wait(owner, release_id)["status"] == "failed"

    for role, key in keys.items():
        one = h.client.get(f"/releases/{release_id}", headers=h.headers(key)).json()
        for path in ("/releases", f"/releases?dataset_id={ds['id']}"):
            listed = h.client.get(path, headers=h.headers(key)).json()["items"]
            assert [r["error"] for r in listed if r["id"] == release_id] == [one["error"]]
        assert one["status"] == "failed"
        if role == "owner":
            assert SECRET in one["error"]
        else:
            assert one["error"] == "failed", role
    # Nowhere else either: the ledger, the budgets and the audit trail (admin's views).
    for path in (f"/budgets/{ds['id']}", "/budgets", "/audit?limit=500"):
        r = h.client.get(path, headers=h.headers(h.admin_key))
        assert r.status_code == 200, r.text
        assert SECRET not in r.text and "0.7531" not in r.text


def test_a_queued_release_of_an_undeclared_dataset_publishes_nothing(embedded: Harness) -> None:
    """A release admitted before admission checked the declaration (a dataset whose classes
    were recorded as found) fails before its job reads the data: refunded, nothing stored."""
    h = embedded
    owner, _ = h.new_key("owner")
    ds = h.upload(owner, npz_bytes(*toy_dataset())).json()
    dispatcher, h.runtime.dispatcher = h.runtime.dispatcher, Held()
    try:
        created = h.client.post(
            "/releases", json=h.release_body(ds["id"]), headers=h.headers(owner)
        )
    finally:
        h.runtime.dispatcher = dispatcher
    assert created.status_code == 202, created.text
    release_id = created.json()["id"]
    with h.runtime.session_factory() as session, session.begin():
        dataset = session.get(Dataset, ds["id"])
        assert dataset is not None
        dataset.classes_declared = False  # as uploads without `classes` were recorded
        raw_key = dataset.storage_key
    read: list[str] = []
    store = h.runtime.store
    get, open_mapped = store.get, store.open_mapped

    def recorded_get(key: str) -> bytes:
        read.append(key)
        return get(key)

    def recorded_open_mapped(key: str, **kwargs: Any) -> Any:
        read.append(key)
        return open_mapped(key, **kwargs)

    store.get = recorded_get  # type: ignore[method-assign]
    store.open_mapped = recorded_open_mapped  # type: ignore[method-assign]
    try:
        runner.execute(h.runtime, release_id)
    finally:
        store.get, store.open_mapped = get, open_mapped  # type: ignore[method-assign]
    done = h.client.get(f"/releases/{release_id}", headers=h.headers(owner)).json()
    assert done["status"] == "failed" and "declared classes" in done["error"]
    assert raw_key not in read
    assert not h.runtime.store.exists(keys.artifact(release_id, "npz"))
    entries = h.client.get(f"/budgets/{ds['id']}", headers=h.headers(owner)).json()["entries"]
    assert [e["state"] for e in entries] == ["refunded"]
