"""Owner-only units (service/owner_only.py): a mark made in a worker thread that runs with a
copy of the request's context reaches the request's unit; records of a marked unit are
dropped by the filter; nothing is marked outside a unit, and a unit never outlives itself."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading

import anyio.to_thread
import pytest

from service import owner_only


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_a_mark_in_a_worker_thread_reaches_the_request_unit() -> None:
    # FastAPI runs a sync endpoint with anyio.to_thread, in a copy of the request's context.
    async def request() -> bool:
        with owner_only.unit():
            await anyio.to_thread.run_sync(owner_only.mark)
            return owner_only.active()

    assert asyncio.run(request()) is True
    assert owner_only.active() is False


def test_records_of_a_marked_unit_are_dropped_and_others_kept() -> None:
    handler = _Records()
    log = logging.getLogger("test_owner_only")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    owner_only.install_on([handler])
    owner_only.install_on([handler])  # idempotent
    try:
        log.info("outside any unit")
        with owner_only.unit():
            log.info("ordinary unit")
            owner_only.mark(False)
            log.info("still ordinary")
            owner_only.mark()
            log.info("research release r-1")
        with owner_only.unit():
            log.info("the next unit starts ordinary")
    finally:
        log.removeHandler(handler)
    assert handler.messages == [
        "outside any unit",
        "ordinary unit",
        "still ordinary",
        "the next unit starts ordinary",
    ]
    assert sum(isinstance(f, owner_only.OwnerOnlyFilter) for f in handler.filters) == 1


def test_mark_outside_a_unit_does_nothing_and_units_nest() -> None:
    owner_only.mark()
    assert not owner_only.active()
    with owner_only.unit():
        with owner_only.unit():
            owner_only.mark()
            assert owner_only.active()
        assert not owner_only.active()  # the inner unit's mark stays with it


def test_enter_and_leave_bracket_a_task_in_its_thread() -> None:
    # The Celery signals (worker/celery_app.py) open and close a unit around each task.
    seen: list[bool] = []

    def task() -> None:
        token = owner_only.enter()
        owner_only.mark()
        seen.append(owner_only.active())
        owner_only.leave(token)
        seen.append(owner_only.active())

    thread = threading.Thread(target=contextvars.copy_context().run, args=(task,))
    thread.start()
    thread.join()
    assert seen == [True, False]


def test_celerys_own_success_line_of_a_marked_task_is_dropped() -> None:
    """Celery writes "Task …[id] succeeded in …s" after the task returns, before its postrun
    signal: the worker's prerun/postrun unit (worker/celery_app.py) covers it."""
    from celery import Celery

    import worker.celery_app  # noqa: F401  (connects the task signals)

    app = Celery("owner-only-test", broker="memory://")

    @app.task(name="owner_only_test.ordinary")
    def ordinary() -> None:
        pass

    @app.task(name="owner_only_test.research")
    def research() -> None:
        owner_only.mark()

    handler = _Records()
    trace = logging.getLogger("celery.app.trace")
    level = trace.level
    trace.setLevel(logging.INFO)
    trace.addHandler(handler)
    owner_only.install_on([handler])
    try:
        ordinary.apply()
        research.apply()
    finally:
        trace.removeHandler(handler)
        trace.setLevel(level)
    names = [m.split("[", 1)[0] for m in handler.messages if "succeeded" in m]
    assert names == ["Task owner_only_test.ordinary"]
    assert not owner_only.active()


def test_a_failed_job_logs_where_it_failed_not_what_it_computed(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The exception's message (here a count computed from private data) is stored on the
    release for its owner; the operator's log line carries its type and frames only."""
    from types import SimpleNamespace

    from worker import attempts

    stored: list[str] = []
    monkeypatch.setattr(attempts, "fail", lambda _r, _id, text, attempt: stored.append(text))
    monkeypatch.setattr(attempts, "discard_parts", lambda _r, _id: None)

    def work(_job: object) -> None:
        raise ValueError("class 3 holds 17 records, fewer than min_class_size")

    with caplog.at_level(logging.DEBUG):
        attempts.run(
            SimpleNamespace(),
            "r-1",
            lambda: SimpleNamespace(attempt=1),
            work,  # type: ignore[arg-type]
        )
    assert "17 records" in stored[0]
    assert "ValueError at" in caplog.text and "work" in caplog.text
    assert "17 records" not in caplog.text and "min_class_size" not in caplog.text
    assert all(record.exc_info is None for record in caplog.records)
