"""Upload slots a slow client cannot hold (issue 35, M1).

Before: two clients sending one byte every 5 s held both upload slots, and every other
owner's upload got 503 uploads_busy for as long as they kept sending. Now:

- a body slower than DPRELEASE_UPLOAD_MIN_BYTES_PER_S (after the grace) is cut off with 408
  upload_too_slow, nothing stored, its slot given back;
- one principal holds at most DPRELEASE_MAX_CONCURRENT_UPLOADS_PER_PRINCIPAL slots;
- a request is authenticated before it waits for its body in a slot: a bad key or a key that
  may not upload is answered at once.

The slow clients are real sockets against uvicorn on loopback (tests/integration/servers.py,
``served``), with a grace and a window of tenths of a second; the slot logic is the same in
both modes, so the tests run in embedded mode.
"""

from __future__ import annotations

import http.client
import json
import select
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.conftest import Harness, npz_bytes, toy_dataset
from tests.integration.servers import served, shared_machine_factor
from tests.integration.test_uploads import _dataset_rows, _stored_objects

pytestmark = pytest.mark.modes("embedded")

# The grace outlasts the first steps on a loaded machine (a1 must still trickle when b1 starts).
GRACE_S, WINDOW_S, MIN_RATE = 4.0, 0.5, 4096
TRICKLE_S = 0.1  # one byte per tenth of a second: 10 B/s
META = {
    "name": "toy",
    "feature_range": [0, 13],
    "classes": [0, 1, 2],
    "budget": {"epsilon": 5.0, "delta": 1e-5},
}
BOUNDARY = "dprelease-slow-client"


def _multipart(content: bytes) -> bytes:
    head = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="metadata"\r\n\r\n'
        f"{json.dumps(META)}\r\n"
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="d.npz"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    )
    return head.encode() + content + f"\r\n--{BOUNDARY}--\r\n".encode()


@dataclass
class SlowUpload:
    """``POST /datasets`` from a raw socket that sends its headers at once and its body one
    byte per ``TRICKLE_S``, until the server answers; ``status``, ``headers`` and ``body`` are
    that answer, ``seconds`` the time from the headers to it."""

    url: str
    key: str
    content: bytes
    send_body: bool = True
    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    body: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    thread: threading.Thread | None = None

    def start(self) -> SlowUpload:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def join(self, timeout: float) -> None:
        assert self.thread is not None
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the slow upload got no answer"

    @property
    def answered(self) -> bool:
        return self.status is not None

    def _run(self) -> None:
        parts = urlsplit(self.url)
        payload = _multipart(self.content)
        with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
            sock.sendall(
                (
                    "POST /datasets HTTP/1.1\r\n"
                    f"Host: {parts.netloc}\r\n"
                    f"Authorization: Bearer {self.key}\r\n"
                    f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n"
                    f"Content-Length: {len(payload)}\r\n\r\n"
                ).encode()
            )
            started = time.monotonic()
            for byte in payload if self.send_body else []:
                readable, _, _ = select.select([sock], [], [], TRICKLE_S)
                if readable:  # the server answered: stop sending
                    break
                try:
                    sock.sendall(bytes([byte]))
                except OSError:  # it closed the connection
                    break
            response = http.client.HTTPResponse(sock)
            response.begin()
            self.seconds = time.monotonic() - started
            self.status = response.status
            self.headers = {k.lower(): v for k, v in response.getheaders()}
            self.body = json.loads(response.read())


@dataclass
class HealthProbe:
    """Asks ``/health`` every 20 ms from a thread; latencies in seconds."""

    url: str
    latencies: list[float] = field(default_factory=list)
    failures: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=10) as client:
            while not self.stop.is_set():
                started = time.monotonic()
                r = client.get("/health")
                self.latencies.append(time.monotonic() - started)
                self.failures += r.status_code != 200
                self.stop.wait(0.02)

    def p95(self) -> float:
        return statistics.quantiles(self.latencies, n=20)[-1]


@pytest.fixture
def server(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    settings = harness.runtime.settings
    monkeypatch.setattr(settings, "max_concurrent_uploads", 2)
    monkeypatch.setattr(settings, "max_concurrent_uploads_per_principal", 1)
    monkeypatch.setattr(settings, "upload_min_bytes_per_s", MIN_RATE)
    monkeypatch.setattr(settings, "upload_rate_grace_s", GRACE_S)
    monkeypatch.setattr(settings, "upload_rate_window_s", WINDOW_S)
    monkeypatch.setattr(settings, "upload_retry_after_s", 1)
    monkeypatch.setattr(settings, "rate_limit", "")
    with served(harness.client.app) as url:  # type: ignore[arg-type]
        yield url


def _upload(client: httpx.Client, key: str, content: bytes) -> httpx.Response:
    return client.post(
        "/datasets",
        files={"file": ("d.npz", content)},
        data={"metadata": json.dumps(META)},
        headers={"Authorization": f"Bearer {key}"},
    )


@pytest.mark.timeout(60)
def test_slow_clients_do_not_keep_another_owner_from_uploading(
    harness: Harness, server: str
) -> None:
    h = harness
    (slow_a, _), (slow_b, _), (owner_c, _) = (h.new_key("owner") for _ in range(3))
    content = npz_bytes(*toy_dataset())
    objects_before, rows_before = _stored_objects(h), _dataset_rows(h)
    probe = HealthProbe(server)
    probing = threading.Thread(target=probe.run, daemon=True)
    probing.start()
    with httpx.Client(base_url=server, timeout=30) as client:
        a1 = SlowUpload(server, slow_a, content).start()
        time.sleep(0.6)  # a1 has been authenticated and holds a slot
        # One principal, one slot: a's second slow upload is refused at once...
        a2 = SlowUpload(server, slow_a, content).start()
        a2.join(timeout=5)
        assert a2.status == 503, a2.body
        assert a2.body["error"]["code"] == "uploads_busy"
        assert a2.body["error"]["detail"]["max_concurrent_uploads_per_principal"] == 1
        assert a2.headers["retry-after"] == "1"
        # ...so another owner uploads while a1 trickles (before: 503 as long as a1 sent).
        r = _upload(client, owner_c, content)
        assert r.status_code == 201, r.text
        assert not a1.answered, "a1 should still be trickling"

        # Two slow principals fill both slots, but only until the rate cuts them off.
        b1 = SlowUpload(server, slow_b, content).start()
        time.sleep(0.6)
        busy = _upload(client, owner_c, content)
        assert busy.status_code == 503, busy.text
        assert busy.json()["error"]["detail"]["max_concurrent_uploads"] == 2
        deadline = time.monotonic() + GRACE_S + 3 * WINDOW_S + 3
        while busy.status_code == 503 and time.monotonic() < deadline:
            time.sleep(int(busy.headers["Retry-After"]))
            busy = _upload(client, owner_c, content)
        assert busy.status_code == 201, busy.text

        for slow in (a1, b1):
            slow.join(timeout=GRACE_S + 3 * WINDOW_S + 5)
            assert slow.status == 408, slow.body
            error = slow.body["error"]
            assert error["code"] == "upload_too_slow"
            assert error["detail"]["min_bytes_per_second"] == MIN_RATE
            assert slow.headers["connection"] == "close"
            # Not before the grace and one window, and soon after.
            assert GRACE_S + WINDOW_S - 0.05 <= slow.seconds < GRACE_S + 3 * WINDOW_S + 2
        # Their slots are free again: a, now fast, uploads.
        assert _upload(client, slow_a, content).status_code == 201
    probe.stop.set()
    probing.join(timeout=10)

    # Nothing of the cut-off uploads was stored: three datasets, each with its one object.
    assert _dataset_rows(h) - rows_before == 3
    assert _stored_objects(h) - objects_before == 3
    datasets_b = h.client.get("/datasets", headers=h.headers(slow_b)).json()["items"]
    assert datasets_b == []
    assert probe.failures == 0 and len(probe.latencies) > 20
    limit = 0.05 * shared_machine_factor()
    assert probe.p95() < limit, (
        f"/health p95 {probe.p95():.3f} s (limit {limit:.3f} s) while slow uploads ran"
    )


@pytest.mark.timeout(60)
def test_a_key_that_may_not_upload_waits_for_no_body(harness: Harness, server: str) -> None:
    """The key is checked before the body is awaited: no slot, no wait (before, any bearer
    token took a slot and the answer came only after the body)."""
    analyst, _ = harness.new_key("analyst")
    content = npz_bytes(*toy_dataset())
    cases = {"dpr_unknown-" + "x" * 40: 401, analyst: 403}
    for key, status in cases.items():
        silent = SlowUpload(server, key, content, send_body=False).start()
        silent.join(timeout=5)
        assert silent.status == status, silent.body
        assert silent.seconds < 2
