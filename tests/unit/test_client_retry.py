"""The API client resends a request the server refused with 429, as Retry-After says."""

from __future__ import annotations

import io

import httpx
import pytest

from dprelease_cli.client import RATE_LIMIT_RETRIES, ApiError, Client

waits: list[float] = []


def _client(answers: list[httpx.Response], seen: list[httpx.Request]) -> Client:
    def handle(request: httpx.Request) -> httpx.Response:
        request.read()
        seen.append(request)
        return answers.pop(0)

    client = Client(
        base_url="http://api", api_key="k", http=httpx.Client(transport=httpx.MockTransport(handle))
    )
    client.sleep = waits.append  # type: ignore[method-assign]
    return client


def _limited(after: str = "2") -> httpx.Response:
    body = {"error": {"code": "rate_limited", "message": "slow down"}}
    return httpx.Response(429, headers={"Retry-After": after}, json=body)


def test_a_429_is_resent_after_retry_after() -> None:
    waits.clear()
    seen: list[httpx.Request] = []
    client = _client([_limited("2"), _limited("0.5"), httpx.Response(200, json={"ok": 1})], seen)
    assert client.me() == {"ok": 1}
    assert len(seen) == 3 and waits == [2.0, 0.5]


def test_retries_are_bounded_and_the_429_surfaces() -> None:
    waits.clear()
    seen: list[httpx.Request] = []
    client = _client([_limited() for _ in range(RATE_LIMIT_RETRIES + 1)], seen)
    with pytest.raises(ApiError) as info:
        client.me()
    assert info.value.status == 429
    assert len(seen) == RATE_LIMIT_RETRIES + 1


def test_an_upload_is_resent_from_the_start_of_its_file() -> None:
    waits.clear()
    seen: list[httpx.Request] = []
    client = _client([_limited("0"), httpx.Response(201, json={"id": "d"})], seen)
    file = io.BytesIO(b"payload-bytes")
    assert client.upload_dataset(file, filename="x.npz", metadata={}) == {"id": "d"}
    assert len(seen) == 2
    assert b"payload-bytes" in seen[0].content and b"payload-bytes" in seen[1].content


def test_api_client_is_a_deprecated_name_of_client() -> None:
    import dprelease_cli.client as cli_client

    with pytest.warns(DeprecationWarning, match="use dprelease_client.Client"):
        assert cli_client.ApiClient is Client
