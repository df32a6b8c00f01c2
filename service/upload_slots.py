"""A cap on the uploads (``POST /datasets``) one API process reads and parses at once, per
process and per principal, and a minimum transfer rate while a slot is held.

Parsing an upload takes memory in proportion to its values (bounded per upload by
``datasets/parsing.py``) and CPU for seconds; without a cap, a handful of large uploads at once
could exhaust the process for every tenant. The slot is taken here, in ASGI middleware, before
FastAPI reads the multipart body, and held until the response is sent; one upload over the cap
is answered 503 ``uploads_busy`` with ``Retry-After`` without reading a byte of it.

A slot held while the body trickles in is a slot nobody else gets, so:

- the key is authenticated (and must be an owner's) before a slot is taken: a request with a
  missing, unknown or revoked key, or a key that may not upload, is answered 401 or 403 at
  once, its body unread, and never waits for its bytes in a slot;
- one principal holds at most ``max_concurrent_uploads_per_principal`` slots (all its keys
  together), so one tenant cannot take every slot;
- the body must arrive at ``upload_min_bytes_per_s`` or better (``service/upload_rate.py``):
  a slower one is cut off with 408 ``upload_too_slow`` and its slot is given back at once.

The counts live in this process (the event loop is single-threaded, so plain counters are
exact); with several API processes each has its own caps.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import anyio.to_thread
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.auth.schemas import Role
from service.auth.service import authenticate, check_role
from service.config import Settings
from service.errors import ServiceError, UploadsBusy, UploadTooSlow
from service.errors_http import error_response
from service.models import Principal
from service.runtime import Runtime
from service.upload_rate import BodyRateGuard, RateLimit


def is_upload(scope: Scope) -> bool:
    return bool(scope["method"] == "POST" and scope["path"].rstrip("/") == "/datasets")


def _uploader(runtime: Runtime, authorization: str | None) -> Principal:
    # The endpoint's own check (service.deps) runs again after the body is read: this one
    # only decides whether the request may wait for its body in a slot.
    with runtime.session_factory() as session:
        principal = authenticate(session, authorization=authorization)
    check_role(principal, (Role.owner,))
    return principal


@dataclass
class UploadSlots:
    """ASGI middleware; reads the caps from the app's runtime settings at every request (so a
    test or an operator can change them)."""

    app: ASGIApp
    by_principal: Counter[str] = field(default_factory=Counter)

    @property
    def active(self) -> int:
        return sum(self.by_principal.values())

    def _refusal(self, principal_id: str, settings: Settings) -> UploadsBusy | None:
        retry = settings.upload_retry_after_s
        per_principal = settings.max_concurrent_uploads_per_principal
        if self.by_principal[principal_id] >= per_principal:
            return UploadsBusy(
                f"this key's owner already has {per_principal} upload(s) in progress; "
                f"retry in {retry} s",
                retry_after=retry,
                detail={"max_concurrent_uploads_per_principal": per_principal},
            )
        cap = settings.max_concurrent_uploads
        if self.active >= cap:
            return UploadsBusy(
                f"this server already processes {cap} upload(s); retry in {retry} s",
                retry_after=retry,
                detail={"max_concurrent_uploads": cap},
            )
        return None

    def _release(self, principal_id: str) -> None:
        self.by_principal[principal_id] -= 1
        if self.by_principal[principal_id] <= 0:
            del self.by_principal[principal_id]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        runtime = getattr(scope["app"].state, "runtime", None) if "app" in scope else None
        if scope["type"] != "http" or runtime is None or not is_upload(scope):
            await self.app(scope, receive, send)
            return
        settings: Settings = runtime.settings
        authorization = Headers(scope=scope).get("authorization")
        try:
            principal = await anyio.to_thread.run_sync(_uploader, runtime, authorization)
        except ServiceError as refusal:
            await error_response(refusal)(scope, receive, send)
            return
        busy = self._refusal(principal.id, settings)
        if busy is not None:
            await error_response(busy)(scope, receive, send)
            return
        self.by_principal[principal.id] += 1
        try:
            too_slow = await self._guarded(scope, receive, send, settings)
        finally:
            self._release(principal.id)
        if too_slow is not None:  # the slot is free again before the client hears of it
            response = error_response(too_slow)
            # The rest of the body is not wanted: the connection is closed after the answer.
            response.headers["Connection"] = "close"
            await response(scope, receive, send)

    async def _guarded(
        self, scope: Scope, receive: Receive, send: Send, s: Settings
    ) -> UploadTooSlow | None:
        """Run the application with the body under the minimum rate; the refusal to answer
        when the body was cut off."""
        if s.upload_min_bytes_per_s == 0:
            await self.app(scope, receive, send)
            return None
        limit = RateLimit(s.upload_min_bytes_per_s, s.upload_rate_grace_s, s.upload_rate_window_s)
        guard = BodyRateGuard(receive, limit)

        async def send_unless_cut_off(message: Message) -> None:
            # Once the guard cut the body off, the application answers a client that "went
            # away" (400): that answer is dropped, and the 408 sent instead.
            if not guard.tripped:
                await send(message)

        try:
            await self.app(scope, guard, send_unless_cut_off)
        except Exception:
            if not guard.tripped:
                raise  # an error of the application's own; one it met after the cut-off is ours
        finally:
            guard.close()
        return limit.refusal() if guard.tripped else None
