"""Downloads (issue 14, item 5): short-lived presigned URLs checked by a signature-checking S3
(tests/sigv4_s3.py in front of moto), or the object streamed through the API with access
checked at request time (DPRELEASE_DOWNLOAD_MODE=stream)."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

import httpx
import pytest

from service.storage import S3ObjectStore, sha256_hex
from tests.conftest import Harness, npz_bytes, toy_dataset
from tests.sigv4_s3 import SigV4S3Server


@pytest.fixture
def s3(real_services: dict[str, Any]) -> Iterator[SigV4S3Server]:
    """The real mode's S3 server, its clock put back after the test."""
    server: SigV4S3Server = real_services["s3"]
    server.verifier.offset = 0.0
    try:
        yield server
    finally:
        server.verifier.offset = 0.0


def _granted_release(h: Harness, count: int = 1) -> tuple[str, str, str, list[dict[str, Any]]]:
    """An owner, an analyst granted the owner's dataset (its grant id) and ``count`` succeeded
    releases of it."""
    owner, _ = h.new_key("owner")
    analyst, analyst_id = h.new_key("analyst")
    r = h.upload(owner, npz_bytes(*toy_dataset()))
    assert r.status_code == 201, r.text
    ds = r.json()["id"]
    grant = h.client.post(
        f"/datasets/{ds}/grants", json={"principal_id": analyst_id}, headers=h.headers(owner)
    )
    assert grant.status_code == 201, grant.text
    releases = []
    for _ in range(count):
        created = h.client.post("/releases", json=h.release_body(ds), headers=h.headers(owner))
        assert created.status_code == 202, created.text
        releases.append(created.json()["id"])
    done = [h.wait(owner, rid) for rid in releases]
    assert all(d["status"] == "succeeded" for d in done), done
    return owner, analyst, f"/datasets/{ds}/grants/{grant.json()['id']}", done


def _redirect(h: Harness, key: str, release_id: str) -> str:
    r = h.client.get(
        f"/releases/{release_id}/download", headers=h.headers(key), follow_redirects=False
    )
    assert r.status_code == 307, r.text
    location: str = r.headers["location"]
    return location


def _refused(response: httpx.Response, code: str) -> str:
    assert response.status_code == 403, response.text
    assert f"<Code>{code}</Code>" in response.text, response.text
    return response.text


def test_presigned_url_is_short_lived(real: Harness, s3: SigV4S3Server) -> None:
    h = real
    _, analyst, _, (release,) = _granted_release(h)
    url = _redirect(h, analyst, release["id"])
    assert parse_qs(urlsplit(url).query)["X-Amz-Expires"] == ["60"]  # the default lifetime

    s3.verifier.offset = 50.0  # within its lifetime (margin: X-Amz-Date has whole seconds)
    fetched = httpx.get(url)
    assert fetched.status_code == 200, fetched.text
    assert sha256_hex(fetched.content) == release["artifact"]["sha256"]
    assert fetched.headers["content-disposition"] == (
        f'attachment; filename="release-{release["id"]}.npz"'
    )

    s3.verifier.offset = 61.0  # the same URL once its lifetime is over
    assert "Request has expired" in _refused(httpx.get(url), "AccessDenied")


def test_presigned_url_cannot_be_rescoped_to_another_release(
    real: Harness, s3: SigV4S3Server
) -> None:
    h = real
    _, analyst, _, (a, b) = _granted_release(h, count=2)
    url_a, url_b = (urlsplit(_redirect(h, analyst, r["id"])) for r in (a, b))
    # Release A's signature on release B's key (and the reverse): both refused.
    for signed, other in ((url_a, url_b), (url_b, url_a)):
        swapped = urlunsplit(signed._replace(path=other.path))
        _refused(httpx.get(swapped), "SignatureDoesNotMatch")
    # Each as issued still works: the refusal is the swap's.
    assert sha256_hex(httpx.get(urlunsplit(url_b)).content) == b["artifact"]["sha256"]


def test_presigned_url_outlives_a_revocation_by_at_most_its_lifetime(
    real: Harness, s3: SigV4S3Server
) -> None:
    h = real
    owner, analyst, grant, (release,) = _granted_release(h)
    url = _redirect(h, analyst, release["id"])
    assert h.client.delete(grant, headers=h.headers(owner)).status_code == 204
    # The API refuses at once; the URL issued before is the store's to check, until it expires.
    again = h.client.get(
        f"/releases/{release['id']}/download", headers=h.headers(analyst), follow_redirects=False
    )
    assert again.status_code == 404, again.text
    assert httpx.get(url).status_code == 200
    s3.verifier.offset = 61.0  # the default lifetime (60 s) is over
    _refused(httpx.get(url), "AccessDenied")


@pytest.fixture
def streaming(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> Harness:
    """``harness`` serving downloads with DPRELEASE_DOWNLOAD_MODE=stream, and never reading
    a whole object into memory to do so."""
    settings = harness.runtime.settings.model_copy(update={"download_mode": "stream"})
    monkeypatch.setattr(harness.runtime, "settings", settings)

    def whole_read(key: str) -> bytes:
        raise AssertionError(f"a download read {key} whole")

    if isinstance(harness.runtime.store, S3ObjectStore):
        monkeypatch.setattr(harness.runtime.store, "get", whole_read)
    return harness


def test_streamed_download_checks_the_grant_at_request_time(streaming: Harness) -> None:
    h = streaming
    owner, analyst, grant, (release,) = _granted_release(h)
    path = f"/releases/{release['id']}/download"
    r = h.client.get(path, headers=h.headers(analyst), follow_redirects=False)
    assert r.status_code == 200, r.text  # the bytes themselves, no redirect
    assert sha256_hex(r.content) == release["artifact"]["sha256"]
    assert int(r.headers["content-length"]) == len(r.content) == release["artifact"]["bytes"]
    assert r.headers["content-disposition"] == f'attachment; filename="release-{release["id"]}.npz"'
    if h.mode == "real":  # S3's own checksum of the object, and its ETag, as S3 serves them
        digest = base64.b64encode(hashlib.sha256(r.content).digest()).decode()
        assert r.headers["x-amz-checksum-sha256"] == digest
        assert r.headers["etag"] == f'"{hashlib.md5(r.content).hexdigest()}"'

    assert h.client.delete(grant, headers=h.headers(owner)).status_code == 204
    revoked = h.client.get(path, headers=h.headers(analyst), follow_redirects=False)
    assert revoked.status_code == 404, revoked.text
    assert revoked.json()["error"]["code"] == "not_found"
    assert h.client.get(path, headers=h.headers(owner)).content == r.content


def test_s3_stream_is_read_in_bounded_chunks(real: Harness) -> None:
    store = real.runtime.store
    data = bytes(range(256)) * 1200  # 300 KiB
    store.put("tests/streamed.bin", data)
    stream = store.open_stream("tests/streamed.bin", chunk_bytes=64 * 1024)
    try:
        chunks = list(stream.chunks)
    finally:
        stream.close()
    assert stream.size == len(data) and b"".join(chunks) == data
    assert len(chunks) >= 5 and max(len(c) for c in chunks) <= 64 * 1024
