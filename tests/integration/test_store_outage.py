"""An object store that does not answer: requests that need it answer 503 with Retry-After
(not a 500), and nothing is recorded."""

from __future__ import annotations

import pytest

from service.storage import S3ObjectStore
from tests.conftest import Harness, free_port, npz_bytes, toy_dataset


@pytest.mark.modes("real")
def test_upload_and_summary_answer_503_while_the_store_is_down(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = harness
    owner, _ = h.new_key("owner")
    X, y = toy_dataset()
    meta = {"name": "toy", "feature_range": [0, 13], "classes": [0, 1, 2]}
    meta["budget"] = {"epsilon": 5, "delta": 1e-5}
    r = h.upload(owner, npz_bytes(X, y), metadata=meta)
    assert r.status_code == 201, r.text
    body = h.release_body(r.json()["id"], params={"mixture_degree": 4, "n_samples": 40})
    created = h.client.post("/releases", json=body, headers=h.headers(owner))
    release = h.wait(owner, created.json()["id"])
    assert release["status"] == "succeeded", release
    before = h.client.get("/datasets", headers=h.headers(owner)).json()["items"]

    dead = f"http://127.0.0.1:{free_port()}"
    settings = h.runtime.settings.model_copy(update={"s3_endpoint_url": dead})
    monkeypatch.setattr(h.runtime, "store", S3ObjectStore(settings))
    monkeypatch.setattr(h.runtime.settings, "download_mode", "stream")
    for method, path, kwargs in [
        ("POST", "/datasets", {"upload": True}),
        ("GET", f"/releases/{release['id']}/summary", {}),
        ("GET", f"/releases/{release['id']}/download", {}),
    ]:
        if kwargs:
            r = h.upload(owner, npz_bytes(X, y), metadata=meta)
        else:
            r = h.client.request(method, path, headers=h.headers(owner))
        assert r.status_code == 503, (path, r.text)
        assert r.json()["error"]["code"] == "store_unavailable", r.text
        assert int(r.headers["Retry-After"]) >= 1
    # The refused upload left no dataset behind.
    after = h.client.get("/datasets", headers=h.headers(owner)).json()["items"]
    assert [d["id"] for d in after] == [d["id"] for d in before]
