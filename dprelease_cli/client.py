"""A thin, typed client for the dprelease REST API.

It knows the endpoints and the error envelope (``{"error": {"code", "message", "detail"}}``)
and nothing about the command line: every failure surfaces as :class:`ApiError` (or its
subclass :class:`ApiConnectionError` when the server cannot be reached at all).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import quote

import httpx

JSON = dict[str, Any]

DEFAULT_TIMEOUT = httpx.Timeout(60.0, connect=10.0)
_CHUNK = 1 << 20


class ApiError(Exception):
    """An error answer of the API (or a failure to get one)."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        detail: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.detail: dict[str, Any] = dict(detail or {})


class ApiConnectionError(ApiError):
    """The API could not be reached (refused, DNS, timeout, ...)."""


class ChecksumMismatch(ApiError):
    """A downloaded artifact does not hash to what the release declares."""


@dataclass(frozen=True)
class Download:
    path: Path
    bytes: int
    sha256: str

    def as_json(self) -> JSON:
        return {"path": str(self.path), "bytes": self.bytes, "sha256": self.sha256}


def _error_from_response(response: httpx.Response) -> ApiError:
    """Build an :class:`ApiError` from an error response (body already read)."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        err = body["error"]
        detail = err.get("detail")
        return ApiError(
            str(err.get("message") or f"HTTP {response.status_code}"),
            status=response.status_code,
            code=err.get("code"),
            detail=detail if isinstance(detail, dict) else None,
        )
    text = response.text.strip()
    message = f"HTTP {response.status_code} {response.reason_phrase}".rstrip()
    if text:
        message = f"{message}: {text[:300]}"
    return ApiError(message, status=response.status_code)


RATE_LIMIT_RETRIES = 3
MAX_RETRY_WAIT_S = 30.0


def _retry_after(response: httpx.Response) -> float:
    try:
        wait = float(response.headers.get("Retry-After", "1"))
    except ValueError:
        wait = 1.0
    return min(max(wait, 0.0), MAX_RETRY_WAIT_S)


def _rewind(files: Any) -> bool:
    """Put upload streams back at their start for a resend; False if one cannot be."""
    if not files:
        return True
    for value in dict(files).values():
        stream = value[1] if isinstance(value, tuple) else value
        if not (hasattr(stream, "seekable") and stream.seekable()):
            return False
        stream.seek(0)
    return True


class ApiClient:
    """Calls the dprelease API with a bearer key.

    ``http`` may be given to inject a preconfigured :class:`httpx.Client` (tests pass one with
    an ``httpx.MockTransport``); the client then neither owns nor closes it. Requests use
    absolute URLs built from ``base_url`` and send ``Authorization`` per request, so an injected
    client needs no base URL or headers of its own.
    """

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

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- plumbing --------------------------------------------------------------------------

    def _url(self, path: str) -> str:
        return f"{self.base_url}{path}"

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One request, resent after a 429 (refused before the server read it, so resending
        cannot act twice) up to RATE_LIMIT_RETRIES times, waiting as Retry-After says."""
        for attempt in range(RATE_LIMIT_RETRIES + 1):
            try:
                response = self._http.request(
                    method, self._url(path), headers=self._headers, **kwargs
                )
            except httpx.TransportError as exc:
                raise self._connection_error(exc) from exc
            if response.status_code != 429 or attempt == RATE_LIMIT_RETRIES:
                return response
            if not _rewind(kwargs.get("files")):
                return response
            self.sleep(_retry_after(response))
        raise AssertionError("unreachable")

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._send(method, path, **kwargs)
        if response.is_error:
            raise _error_from_response(response)
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

    # -- identity & keys -------------------------------------------------------------------

    def create_api_key(
        self,
        *,
        name: str | None = None,
        role: str | None = None,
        principal_id: str | None = None,
        expires_in: int | None = None,
    ) -> JSON:
        fields = {
            "name": name,
            "role": role,
            "principal_id": principal_id,
            "expires_in": expires_in,
        }
        body = {k: v for k, v in fields.items() if v is not None}
        result: JSON = self._request("POST", "/api-keys", json=body)
        return result

    def list_api_keys(self) -> JSON:
        result: JSON = self._request("GET", "/api-keys")
        return result

    def revoke_api_key(self, key_id: str) -> None:
        self._request("DELETE", f"/api-keys/{_seg(key_id)}")

    def me(self) -> JSON:
        result: JSON = self._request("GET", "/me")
        return result

    # -- datasets --------------------------------------------------------------------------

    def upload_dataset(self, file: BinaryIO, *, filename: str, metadata: Mapping[str, Any]) -> JSON:
        result: JSON = self._request(
            "POST",
            "/datasets",
            files={"file": (filename, file, "application/octet-stream")},
            data={"metadata": json.dumps(dict(metadata))},
            timeout=httpx.Timeout(None, connect=10.0),
        )
        return result

    def list_datasets(self) -> JSON:
        result: JSON = self._request("GET", "/datasets")
        return result

    def get_dataset(self, dataset_id: str) -> JSON:
        result: JSON = self._request("GET", f"/datasets/{_seg(dataset_id)}")
        return result

    def grant(self, dataset_id: str, principal_id: str) -> JSON:
        result: JSON = self._request(
            "POST", f"/datasets/{_seg(dataset_id)}/grants", json={"principal_id": principal_id}
        )
        return result

    def list_grants(self, dataset_id: str) -> JSON:
        result: JSON = self._request("GET", f"/datasets/{_seg(dataset_id)}/grants")
        return result

    def revoke_grant(self, dataset_id: str, grant_id: str) -> None:
        self._request("DELETE", f"/datasets/{_seg(dataset_id)}/grants/{_seg(grant_id)}")

    def delete_dataset(self, dataset_id: str) -> JSON:
        result: JSON = self._request("DELETE", f"/datasets/{_seg(dataset_id)}")
        return result

    # -- releases --------------------------------------------------------------------------

    def create_release(self, body: Mapping[str, Any]) -> JSON:
        result: JSON = self._request("POST", "/releases", json=dict(body))
        return result

    def preview_release(self, body: Mapping[str, Any]) -> JSON:
        result: JSON = self._request("POST", "/releases/preview", json=dict(body))
        return result

    def list_releases(self, *, dataset_id: str | None = None) -> JSON:
        params = {"dataset_id": dataset_id} if dataset_id is not None else None
        result: JSON = self._request("GET", "/releases", params=params)
        return result

    def get_release(self, release_id: str) -> JSON:
        result: JSON = self._request("GET", f"/releases/{_seg(release_id)}")
        return result

    def cancel_release(self, release_id: str) -> JSON:
        result: JSON = self._request("POST", f"/releases/{_seg(release_id)}/cancel")
        return result

    def download_release(
        self,
        release_id: str,
        output: Path,
        *,
        expected_sha256: str | None = None,
        artifact: str | None = None,
    ) -> Download:
        """Stream the artifact (or the further file named ``artifact``) to ``output``
        atomically (temp file in the same directory, then rename), following a redirect to a
        presigned URL if the API answers with one.

        httpx drops ``Authorization`` when a redirect leaves the API's origin, so the key is
        never sent to the object store. With ``expected_sha256`` the file is only moved into
        place if it matches; otherwise :class:`ChecksumMismatch` is raised and nothing is left.
        """
        output = Path(output)
        directory = output.parent if str(output.parent) else Path(".")
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{output.name}.", suffix=".part", dir=directory)
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as sink:
                what = "download" if artifact is None else f"artifacts/{_seg(artifact)}"
                digest, size = self._stream_to(f"/releases/{_seg(release_id)}/{what}", sink)
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
                    raise _error_from_response(response)
                for chunk in response.iter_bytes(_CHUNK):
                    hasher.update(chunk)
                    sink.write(chunk)
                    size += len(chunk)
        except httpx.TooManyRedirects as exc:
            raise ApiError(f"too many redirects downloading {path}") from exc
        except httpx.TransportError as exc:
            raise self._connection_error(exc) from exc
        return hasher.hexdigest(), size

    # -- budgets ---------------------------------------------------------------------------

    def list_budgets(self) -> JSON:
        result: JSON = self._request("GET", "/budgets")
        return result

    def get_budget(self, dataset_id: str) -> JSON:
        result: JSON = self._request("GET", f"/budgets/{_seg(dataset_id)}")
        return result


def _seg(value: str) -> str:
    """Quote one path segment so an id can never change the path."""
    return quote(str(value), safe="")
