"""Request size (413) and per-key rate (429) limits, applied before any endpoint runs."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.models import Dataset
from service.request_limits import UPLOAD_OVERHEAD_BYTES
from service.runtime import build_runtime
from tests.conftest import Harness, npz_bytes, toy_dataset
from worker.dispatch import celery_dispatcher


def _rows(h: Harness) -> int:
    with h.runtime.session_factory() as session:
        return session.query(Dataset).count()


@pytest.mark.modes("real")
def test_a_body_over_the_limit_is_413(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    h = harness
    owner, _ = h.new_key("owner")
    monkeypatch.setattr(h.runtime.settings, "max_request_bytes", 200)
    body = h.release_body("x" * 300)
    r = h.client.post("/releases/preview", json=body, headers=h.headers(owner))
    assert r.status_code == 413, r.text
    assert r.json()["error"]["code"] == "payload_too_large"

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        data = json.dumps(body).encode()
        for i in range(0, len(data), 50):
            yield data[i : i + 50]

    r = h.client.post(
        "/releases/preview",
        content=chunks(),
        headers={**h.headers(owner), "content-type": "application/json"},
    )
    assert r.status_code == 413, r.text
    assert r.json()["error"]["code"] == "payload_too_large"
    # Under the limit, the same endpoint answers as usual (404: no such dataset).
    small = h.client.post("/releases/preview", json=h.release_body("x"), headers=h.headers(owner))
    assert small.status_code == 404


@pytest.mark.modes("real")
def test_uploads_have_their_own_larger_limit(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = harness
    owner, _ = h.new_key("owner")
    content = npz_bytes(*toy_dataset())
    monkeypatch.setattr(h.runtime.settings, "max_request_bytes", 1000)
    assert h.upload(owner, content).status_code == 201  # well over 1000 bytes
    rows = _rows(h)
    monkeypatch.setattr(h.runtime.settings, "max_upload_bytes", len(content) - 1)
    r = h.upload(owner, content)
    assert r.status_code == 413 and "limit" in r.json()["error"]["message"]
    big = b"\0" * (len(content) + UPLOAD_OVERHEAD_BYTES + 1)
    r = h.upload(owner, big)
    assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"
    assert _rows(h) == rows


def _asgi_upload(h: Harness, key: str, *, size: int, declare_length: bool) -> tuple[int, int]:
    """POST /datasets straight to the ASGI app; (status, body bytes the app pulled)."""
    boundary = "b0undary"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="d.npz"\r\n\r\n'
    ).encode()
    chunk = b"\0" * 65536
    pulled = 0
    total = len(head) + size
    headers = [
        (b"authorization", f"Bearer {key}".encode()),
        (b"content-type", f"multipart/form-data; boundary={boundary}".encode()),
    ]
    if declare_length:
        headers.append((b"content-length", str(total).encode()))
    sent = {"head": False, "left": size}
    status: list[int] = []

    async def receive() -> dict[str, Any]:
        nonlocal pulled
        if not sent["head"]:
            sent["head"] = True
            pulled += len(head)
            return {"type": "http.request", "body": head, "more_body": True}
        piece = chunk[: sent["left"]]
        sent["left"] -= len(piece)
        pulled += len(piece)
        return {"type": "http.request", "body": piece, "more_body": sent["left"] > 0}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/datasets",
        "raw_path": b"/datasets",
        "root_path": "",
        "query_string": b"",
        "headers": headers,
        "client": ("127.0.0.1", 1),
        "server": ("testserver", 80),
        "app": h.client.app,
    }
    anyio.run(h.client.app, scope, receive, send)  # type: ignore[arg-type]
    return status[0], pulled


def test_an_oversized_upload_is_refused_without_reading_it(
    embedded: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = embedded
    owner, _ = h.new_key("owner")
    monkeypatch.setattr(h.runtime.settings, "max_upload_bytes", 100_000)
    limit = 100_000 + UPLOAD_OVERHEAD_BYTES
    huge = 50 * limit  # 55 MB that are never produced
    # Declared too large: refused before a byte is read.
    assert _asgi_upload(h, owner, size=huge, declare_length=True) == (413, 0)
    # Streamed without a length: refused as soon as it passes the limit.
    status, pulled = _asgi_upload(h, owner, size=huge, declare_length=False)
    assert status == 413 and limit < pulled <= limit + 65536 + 200
    assert _rows(h) == 0


def test_rate_limit_per_key_is_429_with_retry_after(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = harness
    owner, _ = h.new_key("owner")
    other, _ = h.new_key("owner")
    monkeypatch.setattr(h.runtime.settings, "rate_limit", "5/minute")
    codes = [h.client.get("/me", headers=h.headers(owner)).status_code for _ in range(5)]
    assert codes == [200] * 5
    r = h.client.get("/me", headers=h.headers(owner))
    assert r.status_code == 429
    assert r.json()["error"]["code"] == "rate_limited"
    assert 1 <= int(r.headers["retry-after"]) <= 60
    assert r.json()["error"]["detail"]["retry_after_seconds"] == int(r.headers["retry-after"])
    # Another key has its own count; requests without a key are not counted (401).
    assert h.client.get("/me", headers=h.headers(other)).status_code == 200
    assert h.client.get("/me").status_code == 401
    monkeypatch.setattr(h.runtime.settings, "rate_limit", "")
    assert h.client.get("/me", headers=h.headers(owner)).status_code == 200


def test_rate_limit_is_shared_by_api_processes(
    real: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two apps (as two API processes would be) count one key together, in Redis."""
    h = real
    owner, _ = h.new_key("owner")
    monkeypatch.setattr(h.runtime.settings, "rate_limit", "4/minute")
    assert h.runtime.settings.rate_limit_storage_url.startswith("redis://")
    second = build_runtime(h.runtime.settings, celery_dispatcher)
    try:
        with TestClient(create_app(runtime=second)) as other_process:
            codes = []
            for client in (h.client, other_process) * 3:
                codes.append(client.get("/me", headers=h.headers(owner)).status_code)
    finally:
        second.engine.dispose()
    assert codes == [200, 200, 200, 200, 429, 429]


def test_an_unreachable_rate_limit_store_lets_requests_through(
    real: Harness, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    h = real
    owner, _ = h.new_key("owner")
    monkeypatch.setattr(h.runtime.settings, "rate_limit", "1/minute")
    monkeypatch.setattr(h.runtime.settings, "redis_url", "redis://127.0.0.1:1/0")
    with caplog.at_level(logging.WARNING, logger="service.request_limits"):
        codes = [h.client.get("/me", headers=h.headers(owner)).status_code for _ in range(3)]
    assert codes == [200, 200, 200]
    assert "rate limit store unavailable" in caplog.text and owner not in caplog.text
