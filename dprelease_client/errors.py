"""The errors of the API client: the API's error envelope
(``{"error": {"code", "message", "detail"}}``) as :class:`ApiError`, and its subclasses."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx


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


class WaitTimeout(ApiError):
    """:meth:`Client.wait` gave up; the release keeps running on the server.
    ``detail["release"]`` is its last state seen."""


class ReleaseFailed(ApiError):
    """:meth:`Client.wait` saw the release end ``failed`` or ``cancelled``.
    ``detail["release"]`` is its final state."""


def error_from_response(response: httpx.Response) -> ApiError:
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
