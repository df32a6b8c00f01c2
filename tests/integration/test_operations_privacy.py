"""Operations data free of private signals: /metrics never times uploads (their time tracks
the file's size) nor release requests and previews (refused from private data with 422/409,
or admitted), queue depth counts no research release's job, and a release's job times
(started_at, finished_at, timings) are shown to its dataset's owner only."""

from __future__ import annotations

import io
import json
import types
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
from celery import Celery

from service.meta.metrics import DeploymentCollector, release_of_message
from tests.conftest import TEST_REDIS_URL, Harness, embedded_harness, npz_bytes, toy_dataset
from tests.integration.test_research_privacy import _body
from worker.broker import RUN_RELEASE


def _metrics(h: Harness) -> str:
    r = h.client.get("/metrics", headers=h.headers(h.admin_key))
    assert r.status_code == 200, r.text
    return r.text


def _series(text: str, method: str, route: str) -> list[str]:
    """The request-duration samples of one route template."""
    label = f'method="{method}",route="{route}"'
    return [
        line
        for line in text.splitlines()
        if line.startswith("dprelease_http_request_duration_seconds") and label in line
    ]


@pytest.mark.modes("real")
def test_metrics_time_no_upload_nor_release_request(harness: Harness) -> None:
    h = harness
    owner, _ = h.new_key("owner")
    r = h.upload(owner, npz_bytes(*toy_dataset()), budget={"epsilon": 2.0, "delta": 1e-5})
    assert r.status_code == 201, r.text
    dataset_id = r.json()["id"]
    too_big = h.upload(owner, b"x" * 10, filename="data.csv")  # refused while parsing
    assert too_big.status_code in (413, 422), too_big.text
    body = h.release_body(dataset_id)
    statuses = [
        h.client.post("/releases/preview", json=body, headers=h.headers(owner)).status_code,
        h.client.post(
            "/releases/preview",
            json=h.release_body(dataset_id, params={"n_samples": 10**12}),
            headers=h.headers(owner),
        ).status_code,
        h.client.post("/releases", json=body, headers=h.headers(owner)).status_code,
        h.client.post(
            "/releases", json=h.release_body(dataset_id, epsilon=1.5), headers=h.headers(owner)
        ).status_code,
    ]
    assert statuses == [200, 422, 202, 409]
    # A deletion refused while the release is queued or running, or done once it ended.
    h.client.delete(f"/datasets/{dataset_id}", headers=h.headers(owner))
    assert h.client.get(f"/datasets/{dataset_id}", headers=h.headers(owner)).status_code == 200
    text = _metrics(h)
    for method, route in (
        ("POST", "/datasets"),
        ("POST", "/releases"),
        ("POST", "/releases/preview"),
        ("DELETE", "/datasets/{dataset_id}"),
    ):
        assert _series(text, method, route) == [], (method, route)
    # Other routes are timed as ever, with their status.
    assert any('status="200"' in s for s in _series(text, "GET", "/datasets/{dataset_id}"))


def test_job_times_are_the_owners_only(harness: Harness) -> None:
    h = harness
    owner, _ = h.new_key("owner")
    analyst, analyst_id = h.new_key("analyst")
    r = h.upload(owner, npz_bytes(*toy_dataset()), budget={"epsilon": 2.0, "delta": 1e-5})
    dataset_id = r.json()["id"]
    h.client.post(
        f"/datasets/{dataset_id}/grants",
        json={"principal_id": analyst_id},
        headers=h.headers(owner),
    )
    created = h.client.post(
        "/releases", json=h.release_body(dataset_id), headers=h.headers(owner)
    ).json()
    own = h.wait(owner, created["id"])
    assert own["status"] == "succeeded"
    assert own["started_at"] and own["finished_at"]
    assert own["timings"]["run_seconds"] is not None
    assert own["timings"]["queued_seconds"] is not None
    for key in (analyst, h.admin_key):
        seen = [
            h.client.get(f"/releases/{created['id']}", headers=h.headers(key)).json(),
            *[
                x
                for x in h.client.get("/releases", headers=h.headers(key)).json()["items"]
                if x["id"] == created["id"]
            ],
        ]
        assert len(seen) == 2
        for release in seen:
            assert release["status"] == "succeeded" and release["created_at"] == own["created_at"]
            assert release["started_at"] is None and release["finished_at"] is None
            assert release["timings"] == {"queued_seconds": None, "run_seconds": None}
        # The file's metadata is dated by the request, not by the job's end.
        npz = np.load(io.BytesIO(h.download(key, created["id"])))
        written = json.loads(str(npz["metadata"]))["created_at"]
        assert _when(written) == _when(own["created_at"])


def _when(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _release(h: Harness, owner: str, dataset_id: str, *, research: bool) -> str:
    body = _body(dataset_id, research=research)
    r = h.client.post("/releases", json=body, headers=h.headers(owner))
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def test_queue_depth_counts_no_research_job(embedded: Harness) -> None:
    """Messages as Celery writes them on Redis, for an ordinary and a research release, plus
    one that cannot be read (counted): the depth counts the ordinary one and the unreadable."""
    h = embedded
    owner, _ = h.new_key("owner")
    r = h.upload(owner, npz_bytes(*toy_dataset()), budget={"epsilon": 50.0, "delta": 1e-5})
    dataset_id = r.json()["id"]
    ordinary = _release(h, owner, dataset_id, research=False)
    research = _release(h, owner, dataset_id, research=True)
    prefix = f"depth-{uuid.uuid4().hex[:8]}"
    cpu, gpu, long, gpu_long = (f"{prefix}-{lane}" for lane in ("cpu", "gpu", "long", "gpu-long"))
    sender = Celery("depth-test", broker=TEST_REDIS_URL)
    client = redis.Redis.from_url(TEST_REDIS_URL)
    try:
        for release_id in (ordinary, research, research):
            sender.send_task(RUN_RELEASE, args=[release_id], queue=cpu)
        sender.send_task(RUN_RELEASE, args=[research], queue=gpu)
        # The long lanes' queues are counted the same way.
        sender.send_task(RUN_RELEASE, args=[ordinary], queue=long)
        sender.send_task(RUN_RELEASE, args=[research], queue=gpu_long)
        client.lpush(cpu, b"not a kombu message")
        raw = client.lrange(cpu, 0, -1)
        assert sorted(str(release_of_message(m)) for m in raw) == sorted(
            ["None", ordinary, research, research]
        )
        settings = h.runtime.settings.model_copy(
            update={
                "celery_broker_url": TEST_REDIS_URL,
                "cpu_queue": cpu,
                "gpu_queue": gpu,
                "long_queue": long,
                "gpu_long_queue": gpu_long,
            }
        )
        runtime: Any = types.SimpleNamespace(
            settings=settings, session_factory=h.runtime.session_factory
        )
        depth = DeploymentCollector(runtime)._queue_depth()
        assert depth == {cpu: 2, gpu: 0, long: 1, gpu_long: 0}
        # The raw length, which the gauge used to report, would have shown them.
        assert (client.llen(cpu), client.llen(gpu), client.llen(gpu_long)) == (4, 1, 1)
    finally:
        client.delete(cpu, gpu, long, gpu_long)
        client.close()
        sender.close()


def test_an_upload_refused_before_routing_is_not_timed_either(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The size limit answers 413 before any route matches (no route template): the raw path
    still says it is an upload, whose refusal tracks the file's size."""
    with embedded_harness(tmp_path / "home", monkeypatch, max_upload_bytes=1000) as h:
        owner, _ = h.new_key("owner")
        before = [s for s in _metrics(h).splitlines() if 'route="-"' in s]
        r = h.upload(owner, b"x" * 2_000_000, filename="data.csv")  # past the framing allowance
        assert r.status_code == 413, r.text
        missing = h.client.post("/no-such-route", headers=h.headers(owner))
        assert missing.status_code in (404, 405)
        after = [s for s in _metrics(h).splitlines() if 'route="-"' in s]
        grown = set(after) - set(before)
        # The unmatched probe is timed (route "-"); the refused upload is not.
        assert any('method="POST"' in s and 'status="404"' in s for s in grown), grown
        assert not any('status="413"' in s for s in grown), grown
