"""The client's HTTP plumbing: bearer-key requests with absolute URLs, resends of the answers
given before the server read the request, the error envelope raised, and atomic,
checksum-verified streaming of a file to disk."""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Self
from urllib.parse import quote

import httpx

from dprelease_client.errors import (
    ApiConnectionError,
    ApiError,
    ChecksumMismatch,
    error_from_response,
)

JSON = dict[str, Any]

DEFAULT_TIMEOUT = httpx.Timeout(60.0, connect=10.0)
_CHUNK = 1 << 20
RATE_LIMIT_RETRIES = 3
MAX_RETRY_WAIT_S = 30.0


@dataclass(frozen=True)
class Download:
    path: Path
    bytes: int
    sha256: str

    def as_json(self) -> JSON:
        return {"path": str(self.path), "bytes": self.bytes, "sha256": self.sha256}


def refused_unread(response: httpx.Response) -> bool:
    """An answer given before the server read the request, so resending cannot act twice:
    429 (rate limit) or 503 ``uploads_busy`` (the upload slots, or this key's owner's own
    share of them, are full; nothing stored).
    Other 503s (``/ready`` not ready) are answers, not a request to come back."""
    if response.status_code == 429:
        return True
    if response.status_code != 503:
        return False
    try:
        body = response.json()
    except ValueError:
        return False
    error = body.get("error") if isinstance(body, dict) else None
    return isinstance(error, dict) and error.get("code") == "uploads_busy"


def retry_after(response: httpx.Response) -> float:
    try:
        wait = float(response.headers.get("Retry-After", "1"))
    except ValueError:
        wait = 1.0
    return min(max(wait, 0.0), MAX_RETRY_WAIT_S)


def rewind(files: Any) -> bool:
    """Put upload streams back at their start for a resend; False if one cannot be."""
    if not files:
        return True
    for value in dict(files).values():
        stream = value[1] if isinstance(value, tuple) else value
        if not (hasattr(stream, "seekable") and stream.seekable()):
            return False
        stream.seek(0)
    return True


def seg(value: str) -> str:
    """Quote one path segment so an id can never change the path."""
    return quote(str(value), safe="")


class Transport:
    """Sends the requests of :class:`dprelease_client.Client`, its subclass (whose docstring
    says what ``http`` and ``base_url`` do)."""

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str,
        http: httpx.Client | None = None,
        timeout: httpx.Timeout | float = DEFAULT_TIMEOUT,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {api_key}", "Accept": "application/json"}
        self._owns_http = http is None
        self._http = http if http is not None else httpx.Client(timeout=timeout)
        self.sleep: Callable[[float], None] = time.sleep

    # -- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- plumbing --------------------------------------------------------------------------

    def _url(self, path: str) -> str:
        return f"{self.base_url}{path}"

    def _send(
        self,
        method: str,
        path: str,
        *,
        extra_headers: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> httpx.Response:
        """One request, resent after a 429 or a 503 ``uploads_busy`` (both refused before the
        server read it, so resending cannot act twice) up to RATE_LIMIT_RETRIES times, waiting
        as Retry-After says."""
        for attempt in range(RATE_LIMIT_RETRIES + 1):
            try:
                response = self._http.request(
                    method,
                    self._url(path),
                    headers={**self._headers, **(extra_headers or {})},
                    **kwargs,
                )
            except httpx.TransportError as exc:
                raise self._connection_error(exc) from exc
            if not refused_unread(response) or attempt == RATE_LIMIT_RETRIES:
                return response
            if not rewind(kwargs.get("files")):
                return response
            self.sleep(retry_after(response))
        raise AssertionError("unreachable")

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._send(method, path, **kwargs)
        if response.is_error:
            raise error_from_response(response)
        if not response.content:
            return {}
        try:
            return response.json()
        except ValueError as exc:
            raise ApiError(
                f"unexpected non-JSON answer from {method} {path} (HTTP {response.status_code})",
                status=response.status_code,
            ) from exc

    def _connection_error(self, exc: httpx.TransportError) -> ApiConnectionError:
        reason = str(exc) or type(exc).__name__
        return ApiConnectionError(f"cannot reach the API at {self.base_url}: {reason}")

    def _download_to(
        self, path: str, output: Path, release_id: str, *, expected_sha256: str | None = None
    ) -> Download:
        output = Path(output)
        directory = output.parent if str(output.parent) else Path(".")
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{output.name}.", suffix=".part", dir=directory)
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as sink:
                digest, size = self._stream_to(path, sink)
                sink.flush()
                os.fsync(sink.fileno())
            if expected_sha256 is not None and digest != expected_sha256.lower():
                raise ChecksumMismatch(
                    f"checksum mismatch for release {release_id}: downloaded {size} bytes "
                    f"hashing to {digest}, the release declares {expected_sha256}",
                    detail={"expected_sha256": expected_sha256, "actual_sha256": digest},
                )
            os.replace(tmp, output)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            raise
        return Download(path=output, bytes=size, sha256=digest)

    def _stream_to(self, path: str, sink: BinaryIO) -> tuple[str, int]:
        hasher = hashlib.sha256()
        size = 0
        try:
            with self._http.stream(
                "GET",
                self._url(path),
                headers=self._headers,
                follow_redirects=True,
                timeout=httpx.Timeout(60.0, connect=10.0),
            ) as response:
                if response.is_error:
                    response.read()
                    raise error_from_response(response)
                for chunk in response.iter_bytes(_CHUNK):
                    hasher.update(chunk)
                    sink.write(chunk)
                    size += len(chunk)
        except httpx.TooManyRedirects as exc:
            raise ApiError(f"too many redirects downloading {path}") from exc
        except httpx.TransportError as exc:
            raise self._connection_error(exc) from exc
        return hasher.hexdigest(), size
