"""One unit of work for requests and jobs: ``service.db.transaction`` (the worker's, the
sweeper's, start-up's) runs the hooks the request boundary runs. An after-commit callback runs
once the unit is durable and never after a rollback; an on-rollback callback runs after a
rollback only; a failing after-commit callback is logged and undoes nothing."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import delete

from service.db import after_commit, on_rollback, transaction
from service.models import SweeperLease, utcnow
from service.runtime import Runtime
from tests.conftest import Harness


class Boom(Exception):
    pass


@pytest.fixture
def lease_name(harness: Harness) -> Iterator[str]:
    """A row name of this test's own (real mode shares one database across the session)."""
    name = f"uow-{uuid.uuid4().hex[:12]}"
    yield name
    with transaction(harness.runtime.session_factory) as session:
        session.execute(delete(SweeperLease).where(SweeperLease.name == name))


def _stored(runtime: Runtime, name: str) -> bool:
    """Whether the row is committed, as another session sees it."""
    with runtime.session_factory() as session:
        return session.get(SweeperLease, name) is not None


def test_after_commit_runs_once_the_unit_is_durable(harness: Harness, lease_name: str) -> None:
    runtime, seen = harness.runtime, []
    with transaction(runtime.session_factory) as session:
        session.add(SweeperLease(name=lease_name, holder="test", expires_at=utcnow()))
        after_commit(session, lambda: seen.append(("committed", _stored(runtime, lease_name))))
        on_rollback(session, lambda: seen.append(("rolled back", False)))
        assert seen == []
    assert seen == [("committed", True)]


def test_on_rollback_runs_after_a_rollback_only(harness: Harness, lease_name: str) -> None:
    runtime, seen = harness.runtime, []
    with pytest.raises(Boom), transaction(runtime.session_factory) as session:
        session.add(SweeperLease(name=lease_name, holder="test", expires_at=utcnow()))
        session.flush()
        after_commit(session, lambda: seen.append("committed"))
        on_rollback(session, lambda: seen.append("rolled back"))
        raise Boom
    assert seen == ["rolled back"]
    assert not _stored(runtime, lease_name)


def test_a_failing_after_commit_callback_undoes_nothing(
    harness: Harness, lease_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    runtime, seen = harness.runtime, []

    def fails() -> None:
        raise Boom("the broker is down")

    with (
        caplog.at_level(logging.ERROR, logger="service.db"),
        transaction(runtime.session_factory) as session,
    ):
        session.add(SweeperLease(name=lease_name, holder="test", expires_at=utcnow()))
        after_commit(session, fails)
        after_commit(session, lambda: seen.append("next"))
    assert seen == ["next"]  # each callback on its own
    assert _stored(runtime, lease_name)
    assert "after-commit callback failed" in caplog.text
