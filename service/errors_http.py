"""Mapping of typed errors to HTTP: one JSON shape, declared in the OpenAPI schema."""

from __future__ import annotations

import re
from typing import Any

from botocore.exceptions import (
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
)
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.body_limit import MAX_BODY_SIZE_SCOPE_KEY

from service import strict_json
from service.errors import RetryLater, ServiceError, StoreUnavailable


class ErrorBody(BaseModel):
    code: str
    message: str
    detail: dict[str, Any] = {}


class ErrorResponse(BaseModel):
    error: ErrorBody


_DESCRIPTIONS = {
    401: "Missing, malformed or unknown API key",
    403: "The key's role may not do this",
    404: "Not found (or not visible to this key)",
    409: "Conflict: the privacy budget would be exceeded, the release is not ready (or was "
    "cancelled), the release already finished, the dataset was deleted or has no declared "
    "classes, releases of the dataset are still pending, or the key is the last active admin "
    "key",
    408: "The upload's body arrived slower than DPRELEASE_UPLOAD_MIN_BYTES_PER_S over "
    "DPRELEASE_UPLOAD_RATE_WINDOW_S (after DPRELEASE_UPLOAD_RATE_GRACE_S; code "
    "upload_too_slow): it was cut off and nothing was stored; the connection is closed",
    410: "Erased: the object was deleted with the raw data it was computed from",
    413: "Request body too large (uploads: DPRELEASE_MAX_UPLOAD_BYTES; any other request: "
    "DPRELEASE_MAX_REQUEST_BYTES); or, for an upload (code dataset_too_large), a file whose "
    "metadata declares more values than DPRELEASE_MAX_UPLOAD_CELLS or more decoded bytes than "
    "DPRELEASE_MAX_UPLOAD_DECODED_BYTES",
    422: "Invalid input; the message says what to fix",
    429: "Too many requests with this API key (DPRELEASE_RATE_LIMIT); retry after Retry-After",
    503: "This API process already parses DPRELEASE_MAX_CONCURRENT_UPLOADS uploads, or this "
    "key's owner DPRELEASE_MAX_CONCURRENT_UPLOADS_PER_PRINCIPAL (code uploads_busy; the "
    "detail names the limit), or the object store did not answer (code store_unavailable); "
    "nothing was stored or changed: retry after Retry-After",
}

_RETRY_AFTER = {
    "Retry-After": {
        "description": "Seconds until a request with this key fits the rate limit again",
        "schema": {"type": "integer", "minimum": 1},
    }
}
_RETRY_AFTER_BUSY = {
    "Retry-After": {
        "description": "Seconds after which a retry is likely to succeed",
        "schema": {"type": "integer", "minimum": 1},
    }
}


def responses(*codes: int, **why: str) -> dict[int | str, dict[str, Any]]:
    """Error responses of an operation; ``why`` overrides a description, keyed ``e409=…``."""
    out: dict[int | str, dict[str, Any]] = {}
    for code in codes:
        out[code] = {
            "model": ErrorResponse,
            "description": why.get(f"e{code}", _DESCRIPTIONS[code]),
        }
        if code == 429:
            out[code]["headers"] = _RETRY_AFTER
        if code == 503:
            out[code]["headers"] = _RETRY_AFTER_BUSY
    return out


# Every operation may answer these: both limits apply before any endpoint runs.
COMMON_RESPONSES = responses(413, 429)

_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}


def _body(code: str, message: str, detail: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "detail": detail or {}}}


def error_response(exc: ServiceError) -> JSONResponse:
    headers: dict[str, str] = {}
    if exc.status_code == 401:
        headers["WWW-Authenticate"] = "Bearer"
    if isinstance(exc, RetryLater):
        headers["Retry-After"] = str(exc.retry_after)
    return JSONResponse(
        _body(exc.code, exc.message, exc.detail), status_code=exc.status_code, headers=headers
    )


def _allowed_methods(request: Request) -> list[str]:
    """The methods documented for this path (Starlette's 405 names only the first route's).
    The most specific template wins: /releases/preview is POST only, although
    /releases/{release_id} (GET) matches it too."""
    path = request.scope["path"]
    best: tuple[int, list[str]] | None = None
    for template, operations in request.app.openapi()["paths"].items():
        pattern = re.sub(r"\\{[^/]+?\\}", "[^/]+", re.escape(template))
        if re.fullmatch(pattern, path):
            params = template.count("{")
            if best is None or params < best[0]:
                best = (params, sorted(m.upper() for m in operations))
    return best[1] if best else []


#: What an object store that does not answer raises (botocore's connection and timeout errors).
STORE_DOWN: tuple[type[Exception], ...] = (
    EndpointConnectionError,
    ConnectTimeoutError,
    ReadTimeoutError,
    ConnectionClosedError,
)
STORE_RETRY_AFTER_S = 10


def install(app: FastAPI) -> None:
    # Duplicate JSON keys refused in every JSON body (routers are included after this).
    strict_json.install(app)

    @app.exception_handler(ServiceError)
    async def _service_error(_request: Request, exc: ServiceError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [
            {"loc": [str(p) for p in err.get("loc", ())], "msg": str(err.get("msg", ""))}
            for err in exc.errors()
        ]
        message = "; ".join(f"{'.'.join(p['loc'])}: {p['msg']}" for p in problems)
        return JSONResponse(
            _body("invalid_input", message or "invalid request", {"errors": problems}),
            status_code=422,
        )

    async def _store_down(_request: Request, _exc: Exception) -> JSONResponse:
        """An object store that did not answer (connection refused or timed out, after the
        client's own retries): 503 with Retry-After, nothing of the exception in it. The
        request's unit of work rolled back: nothing was recorded."""
        return error_response(
            StoreUnavailable(
                f"the object store did not answer; retry in {STORE_RETRY_AFTER_S} s",
                retry_after=STORE_RETRY_AFTER_S,
            )
        )

    for kind in STORE_DOWN:
        app.add_exception_handler(kind, _store_down)

    @app.exception_handler(Exception)
    async def _unhandled_error(_request: Request, exc: Exception) -> JSONResponse:
        """Anything else (a database or object store that did not answer, a bug): the same
        JSON shape, with nothing of the exception in it (it may quote private data). The
        server still logs the traceback (Starlette re-raises it after this answer)."""
        return JSONResponse(_body("internal_error", "internal server error"), status_code=500)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        """The framework's own errors (unknown path, wrong method, a body that cannot be
        decoded or is too large) in the same JSON shape as ours."""
        headers = dict(exc.headers or {})
        status, message = exc.status_code, str(exc.detail)
        if status == 400:
            # FastAPI's answer to a body it cannot decode (bad UTF-8, broken multipart).
            status, message = 422, f"the request body could not be read: {message}"
        elif status == 405:
            # Paths outside the schema (the console's pages) keep the route's own Allow.
            documented = _allowed_methods(request)
            if documented or "Allow" not in headers:
                headers["Allow"] = ", ".join(documented)
        elif status == 413 and MAX_BODY_SIZE_SCOPE_KEY in request.scope:
            message = f"request body is larger than {request.scope[MAX_BODY_SIZE_SCOPE_KEY]} bytes"
        code = "invalid_input" if status == 422 else _HTTP_CODES.get(status, "http_error")
        if status in (204, 304) or status < 200:
            return Response(status_code=status, headers=headers)
        return JSONResponse(_body(code, message), status_code=status, headers=headers)
