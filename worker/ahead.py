"""Drawing a release's next rows while the current ones are written: the generator runs in a
thread of its own, a bounded number of chunks ahead of the writer.

Generation (gathers, noise: torch and numpy kernels that release the GIL) and writing
(mapping into the domain, the file's bytes and checksums) then use two cores instead of
taking turns on one. The thread runs in a copy of the caller's context (``contextvars``), so
an owner-only job's log records stay owner-only there too (``service.owner_only``); an error
in the generator is raised in the writer, at the chunk where it happened; and however the
writer stops, the generator is closed in its own thread and the thread joined before
``ahead`` returns: nothing keeps drawing after the job has ended.
"""

from __future__ import annotations

import contextvars
import queue
import threading
from collections.abc import Generator, Iterable
from typing import TypeVar

T = TypeVar("T")

# Chunks drawn ahead of the writer: one being written, one waiting, one being drawn. Memory
# grows by that many chunks (each bounded by the generators' own chunk budgets).
DEPTH = 2
_POLL_S = 0.1


class _End:
    pass


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


def ahead(items: Iterable[T], depth: int = DEPTH) -> Generator[T, None, None]:
    """The items of ``items`` in order, produced in a background thread up to ``depth``
    ahead of the consumer."""
    buffer: queue.Queue[T | _End | _Failed] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: T | _End | _Failed) -> bool:
        while not stop.is_set():
            try:
                buffer.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        source = iter(items)
        try:
            for item in source:
                if not put(item):
                    break
            else:
                put(_End())
        except BaseException as exc:  # raised again in the consumer
            put(_Failed(exc))
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()  # the generator's own clean-up, in the thread that ran it

    context = contextvars.copy_context()
    thread = threading.Thread(target=context.run, args=(produce,), name="release-rows", daemon=True)
    thread.start()
    try:
        while True:
            item = buffer.get()
            if isinstance(item, _End):
                return
            if isinstance(item, _Failed):
                raise item.error
            yield item
    finally:
        stop.set()
        thread.join()
