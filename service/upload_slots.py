"""A cap on the uploads (``POST /datasets``) one API process reads and parses at once.

Parsing an upload takes memory in proportion to its values (bounded per upload by
``datasets/parsing.py``) and CPU for seconds; without a cap, a handful of large uploads at once
could exhaust the process for every tenant. The slot is taken here, in ASGI middleware, before
FastAPI reads the multipart body, and held until the response is sent; one upload over the cap
is answered 503 ``uploads_busy`` with ``Retry-After`` without reading a byte of it.

Requests without a bearer token take no slot: they are refused with 401 before the dataset is
parsed, so they could only keep other tenants' uploads out. The count lives in this process
(the event loop is single-threaded, so a plain counter is exact); with several API processes
each has its own ``DPRELEASE_MAX_CONCURRENT_UPLOADS``.
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from service.config import Settings
from service.errors import UploadsBusy
from service.errors_http import error_response
from service.request_limits import key_identity


def is_upload(scope: Scope) -> bool:
    return bool(scope["method"] == "POST" and scope["path"].rstrip("/") == "/datasets")


@dataclass
class UploadSlots:
    """ASGI middleware; reads the cap from the app's runtime settings at every request (so a
    test or an operator can change it)."""

    app: ASGIApp
    active: int = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        runtime = getattr(scope["app"].state, "runtime", None) if "app" in scope else None
        if (
            scope["type"] != "http"
            or runtime is None
            or not is_upload(scope)
            or key_identity(Headers(scope=scope)) is None
        ):
            await self.app(scope, receive, send)
            return
        settings: Settings = runtime.settings
        cap = settings.max_concurrent_uploads
        if self.active >= cap:
            retry = settings.upload_retry_after_s
            refusal = UploadsBusy(
                f"this server already processes {cap} upload(s); retry in {retry} s",
                retry_after=retry,
                detail={"max_concurrent_uploads": cap},
            )
            await error_response(refusal)(scope, receive, send)
            return
        self.active += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.active -= 1
