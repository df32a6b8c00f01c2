"""A minimum transfer rate for upload bodies: a client that sends its body too slowly is cut
off, so that it cannot hold an upload slot (``service/upload_slots.py``) for as long as it
likes.

``BodyRateGuard`` wraps an ASGI ``receive``. The clock runs only while the application waits
in ``receive`` for the client's bytes: time the server itself spends between reads (writing
the spooled part to disk, a busy thread pool) is never held against the client. Within the
first ``grace_s`` seconds of waiting nothing is checked (connection set-up, a client that
computes its first bytes); from then on each ``window_s`` seconds of waiting must bring at
least ``min_bytes_per_s × window_s`` bytes. A window that does not is the end of the body: the
guard stops reading and hands the application ``http.disconnect`` (as if the client had gone,
so Starlette closes and deletes the spooled parts and no endpoint runs), and ``tripped``
tells the middleware to answer 408 itself.

The guard reads the wrapped ``receive`` from a task of its own that survives its timeouts: a
timeout never cancels a read that may already hold a chunk, so no byte is lost or counted
twice.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from starlette.types import Message, Receive

from service.errors import UploadTooSlow


@dataclass(frozen=True)
class RateLimit:
    min_bytes_per_s: int
    grace_s: float
    window_s: float

    @property
    def window_bytes(self) -> float:
        return self.min_bytes_per_s * self.window_s

    def refusal(self) -> UploadTooSlow:
        return UploadTooSlow(
            f"the upload's body arrived slower than {self.min_bytes_per_s} bytes/s over "
            f"{self.window_s:g} s (after a grace of {self.grace_s:g} s); nothing was stored: "
            "send it again over a faster connection",
            detail={
                "min_bytes_per_second": self.min_bytes_per_s,
                "window_seconds": self.window_s,
                "grace_seconds": self.grace_s,
            },
        )


@dataclass
class BodyRateGuard:
    """An ASGI ``receive`` that gives the request body through until it arrives slower than
    ``limit``; afterwards it answers ``http.disconnect`` and ``tripped`` is true."""

    receive: Receive
    limit: RateLimit
    tripped: bool = field(default=False, init=False)
    waited_s: float = field(default=0.0, init=False)  # seconds spent waiting for the client
    _checked_at: float = field(init=False)  # waiting time of the next check
    _counting: bool = field(default=False, init=False)  # past the grace: windows are checked
    _window_bytes: int = field(default=0, init=False)  # bytes since the window began
    _body_done: bool = field(default=False, init=False)
    _pending: asyncio.Task[Message] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self._checked_at = self.limit.grace_s

    async def __call__(self) -> Message:
        if self._body_done:  # the body is in: a later receive waits for the disconnect only
            return await self.receive()
        if self.tripped:
            return {"type": "http.disconnect"}
        loop = asyncio.get_running_loop()
        while True:
            self._check_windows()
            if self.tripped:
                self.close()
                return {"type": "http.disconnect"}
            if self._pending is None:
                self._pending = asyncio.ensure_future(self.receive())
            started = loop.time()
            await asyncio.wait({self._pending}, timeout=self._checked_at - self.waited_s)
            self.waited_s += loop.time() - started
            if self._pending.done():
                message = self._pending.result()
                self._pending = None
                self._count(message)
                return message

    def _count(self, message: Message) -> None:
        if message["type"] != "http.request":
            self._body_done = True  # a disconnect: the application ends the request
            return
        self._window_bytes += len(message.get("body", b""))
        if not message.get("more_body", False):
            self._body_done = True

    def _check_windows(self) -> None:
        # Every check whose time has come, oldest first: a window is judged on the bytes
        # that arrived while it lasted, not on what came after.
        while not self.tripped and self.waited_s >= self._checked_at:
            if self._counting and self._window_bytes < self.limit.window_bytes:
                self.tripped = True
                return
            self._counting = True
            self._window_bytes = 0
            self._checked_at += self.limit.window_s

    def close(self) -> None:
        """Stop a read still pending (the application ended before the body did)."""
        if self._pending is not None:
            self._pending.cancel()
            # Its outcome is of no interest: the request is over.
            self._pending.add_done_callback(_ignore_outcome)
            self._pending = None


def _ignore_outcome(task: asyncio.Task[Message]) -> None:
    with contextlib.suppress(asyncio.CancelledError, Exception):
        task.result()
