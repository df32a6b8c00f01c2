"""The minimum transfer rate of upload bodies (service/upload_rate.py), at the ASGI level: a
``receive`` that hands chunks over at a chosen pace, read by a loop standing for Starlette's
body reader. Times are tenths of a second so that each test ends in about a second."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from starlette.types import Message

from service.upload_rate import BodyRateGuard, RateLimit

# 1000 B/s after 0.3 s of waiting, averaged over 0.2 s (200 bytes per window).
LIMIT = RateLimit(min_bytes_per_s=1000, grace_s=0.3, window_s=0.2)


def paced(chunks: list[tuple[float, bytes]]) -> Callable[[], Awaitable[Message]]:
    """A receive giving each chunk after its delay; the last ends the body. After the body it
    waits for ever, as a server's receive waits for the disconnect."""
    left = list(chunks)

    async def receive() -> Message:
        if not left:
            await asyncio.Event().wait()
        delay, body = left.pop(0)
        await asyncio.sleep(delay)
        return {"type": "http.request", "body": body, "more_body": bool(left)}

    return receive


async def read_body(guard: BodyRateGuard, pause: float = 0.0) -> tuple[bytes, str]:
    """What the application reads: the body, and the type of the message that ended it."""
    body = b""
    while True:
        message = await guard()
        if message["type"] != "http.request":
            return body, message["type"]
        body += message.get("body", b"")
        if not message.get("more_body", False):
            return body, "complete"
        await asyncio.sleep(pause)


def test_a_body_at_the_rate_passes_untouched() -> None:
    chunks = [(0.05, bytes([i]) * 100) for i in range(12)]  # 2000 B/s for 0.6 s
    guard = BodyRateGuard(paced(chunks), LIMIT)
    body, end = asyncio.run(read_body(guard))
    assert end == "complete" and body == b"".join(c for _, c in chunks)
    assert not guard.tripped


def test_a_trickling_body_is_cut_off_after_the_grace_and_one_window() -> None:
    chunks = [(0.05, b"x")] * 100  # 20 B/s: far below 1000
    guard = BodyRateGuard(paced(chunks), LIMIT)
    started = time.monotonic()
    body, end = asyncio.run(read_body(guard))
    elapsed = time.monotonic() - started
    assert end == "http.disconnect" and guard.tripped
    assert 0 < len(body) < 100
    # Judged at the end of the first window after the grace, not before, not much after.
    assert LIMIT.grace_s + LIMIT.window_s - 0.02 <= elapsed < LIMIT.grace_s + 3 * LIMIT.window_s


def test_a_client_that_sends_nothing_is_cut_off() -> None:
    async def silent() -> Message:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    guard = BodyRateGuard(silent, LIMIT)
    started = time.monotonic()
    _, end = asyncio.run(read_body(guard))
    assert end == "http.disconnect" and guard.tripped
    assert time.monotonic() - started < LIMIT.grace_s + 3 * LIMIT.window_s


def test_nothing_is_checked_during_the_grace() -> None:
    # Silent for most of the grace, then fast: a slow start is not a slow body.
    chunks = [(0.25, b"a" * 10)] + [(0.02, b"b" * 100)] * 20
    guard = BodyRateGuard(paced(chunks), LIMIT)
    _, end = asyncio.run(read_body(guard))
    assert end == "complete" and not guard.tripped


def test_a_body_that_stalls_after_a_fast_start_is_cut_off() -> None:
    # Most of the bytes fast, then a trickle: every window is judged on its own bytes.
    chunks = [(0.01, b"a" * 1000)] * 5 + [(0.1, b"b")] * 50
    guard = BodyRateGuard(paced(chunks), LIMIT)
    _, end = asyncio.run(read_body(guard))
    assert end == "http.disconnect" and guard.tripped


def test_time_the_server_spends_between_reads_is_not_held_against_the_client() -> None:
    # Every chunk is there at once, but the application pauses longer than a window between
    # reads (a busy disk, a full thread pool): the client waited for nothing.
    chunks = [(0.0, b"c" * 10)] * 6
    guard = BodyRateGuard(paced(chunks), LIMIT)
    _, end = asyncio.run(read_body(guard, pause=LIMIT.window_s + 0.05))
    assert end == "complete" and not guard.tripped
    assert guard.waited_s < LIMIT.grace_s


def test_close_stops_a_pending_read() -> None:
    cancelled = asyncio.Event()

    async def scenario() -> None:
        async def receive() -> Message:
            try:
                await asyncio.Event().wait()
            finally:
                cancelled.set()
            raise AssertionError("unreachable")

        guard = BodyRateGuard(receive, RateLimit(1000, grace_s=10, window_s=10))
        reader = asyncio.ensure_future(guard())
        await asyncio.sleep(0.05)
        reader.cancel()  # the application gave up waiting (it is cancelled itself)
        guard.close()
        await asyncio.wait_for(cancelled.wait(), 1)

    asyncio.run(scenario())
