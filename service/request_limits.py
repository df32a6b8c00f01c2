"""Limits applied before any endpoint runs or any body is read: the rate of requests per API
key (429 with ``Retry-After``) and the size of request bodies (413).

Rates are counted with the ``limits`` library over a moving window: in Redis when one is
configured, so that every API process shares one count per key, else in this process (the
embedded mode has one). A key is counted by a digest of the presented bearer token, before it
is authenticated, so that a flood is refused without touching the database; requests without
a key are not counted (they are refused with 401 at once). When Redis does not answer, requests
are let through (logged): availability of the ledger matters more than the limit.

Sizes: a declared ``Content-Length`` over the limit is refused before anything is read; a body
without one (chunked) is counted as it arrives by Starlette's ``RequestBodyLimitMiddleware``
and refused as soon as it passes the limit. Uploads (``POST /datasets``) have their own limit.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import anyio.to_thread
from limits import RateLimitItem, parse_many
from limits.errors import StorageError
from limits.storage import storage_from_string
from limits.strategies import MovingWindowRateLimiter
from starlette.datastructures import Headers
from starlette.middleware.body_limit import RequestBodyLimitMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from service.config import Settings
from service.errors import PayloadTooLarge, RateLimited, ServiceError
from service.errors_http import error_response

log = logging.getLogger(__name__)

# Room for the multipart framing and the metadata part around an uploaded file.
UPLOAD_OVERHEAD_BYTES = 1024 * 1024
_KEY_PREFIX = "dprelease:ratelimit"


class RateLimiter:
    def __init__(self, spec: str, storage_url: str) -> None:
        self.spec, self.storage_url = spec, storage_url
        self.items: list[RateLimitItem] = parse_many(spec) if spec.strip() else []
        self.shared = not storage_url.startswith("memory")
        options: dict[str, Any] = {"wrap_exceptions": True}
        if self.shared:
            options |= {"key_prefix": _KEY_PREFIX, "socket_timeout": 1, "socket_connect_timeout": 1}
        self._strategy = MovingWindowRateLimiter(storage_from_string(storage_url, **options))

    def check(self, identity: str) -> RateLimited | None:
        """Count one request of ``identity``; the refusal when it passes a limit."""
        for item in self.items:
            if not self._strategy.hit(item, identity):
                reset, _ = self._strategy.get_window_stats(item, identity)
                retry = max(1, math.ceil(reset - time.time()))
                return RateLimited(
                    f"more than {item} with this API key; retry in {retry} s",
                    retry_after=retry,
                    detail={"limit": str(item)},
                )
        return None

    async def acheck(self, identity: str) -> RateLimited | None:
        if not self.shared:
            return self.check(identity)
        try:  # a Redis round trip: off the event loop
            return await anyio.to_thread.run_sync(self.check, identity)
        except StorageError as exc:
            log.warning("rate limit store unavailable, request let through: %s", exc)
            return None


def key_identity(headers: Headers) -> str | None:
    """A digest of the bearer token (never the token, never its stored hash), or None."""
    scheme, _, token = headers.get("authorization", "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return hashlib.sha256(b"dprelease-rate-limit\0" + token.encode()).hexdigest()[:32]


def body_limit(scope: Scope, settings: Settings) -> int:
    if scope["method"] == "POST" and scope["path"].rstrip("/") == "/datasets":
        return settings.max_upload_bytes + UPLOAD_OVERHEAD_BYTES
    return settings.max_request_bytes


@dataclass
class RequestLimits:
    """ASGI middleware; reads the settings of the app's runtime at every request (so a test
    or an operator can change them), rebuilding the limiter when they change."""

    app: ASGIApp
    _limiter: RateLimiter | None = None

    def _limiter_for(self, settings: Settings) -> RateLimiter:
        spec, url = settings.rate_limit, settings.rate_limit_storage_url
        limiter = self._limiter
        if limiter is None or (limiter.spec, limiter.storage_url) != (spec, url):
            limiter = self._limiter = RateLimiter(spec, url)
        return limiter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        runtime = getattr(scope["app"].state, "runtime", None) if "app" in scope else None
        if scope["type"] != "http" or runtime is None:
            await self.app(scope, receive, send)
            return
        settings: Settings = runtime.settings
        headers = Headers(scope=scope)
        refusal: ServiceError | None = None
        identity = key_identity(headers)
        if identity is not None:
            refusal = await self._limiter_for(settings).acheck(identity)
        limit = body_limit(scope, settings)
        declared = headers.get("content-length", "")
        if refusal is None and declared.isdigit() and int(declared) > limit:
            refusal = PayloadTooLarge(
                f"request body of {declared} bytes is larger than the limit of {limit} bytes",
                detail={"limit_bytes": limit},
            )
        if refusal is not None:
            await error_response(refusal)(scope, receive, send)
            return
        await RequestBodyLimitMiddleware(self.app, max_body_size=limit)(scope, receive, send)
