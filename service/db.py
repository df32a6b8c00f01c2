"""Engine, session factory and the unit of work.

Only ``unit_of_work`` commits (entered by the request boundary, ``deps.get_session``, and by
``transaction``, for the worker, the sweeper and start-up); services flush. What must happen
outside the database once the unit is decided is registered on the session: ``after_commit``
(e.g. enqueueing a job only once its row is durable) and ``on_rollback`` (e.g. deleting a stored
object the failed unit wrote). After-commit callbacks run once the session is closed, each on
its own: one that raises is logged and changes nothing, the unit it followed is committed.
SQLite (embedded mode) gets ``BEGIN IMMEDIATE`` so that a transaction takes the write lock at
its start: that is SQLite's equivalent of locking the budget row, and it keeps two admissions
from reading the same ledger state.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker

log = logging.getLogger(__name__)


class Base(DeclarativeBase):
    pass


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(
            url, connect_args={"check_same_thread": False, "timeout": 30}, pool_pre_ping=True
        )
        _sqlite_immediate_transactions(engine)
        return engine
    # READ COMMITTED (Postgres's default, pinned so a server setting cannot change it): each
    # statement sees what committed before it, so admission, once it holds the budget row lock,
    # reads the ledger entries its predecessor committed. Under REPEATABLE READ the snapshot
    # would predate the lock (and FOR UPDATE would fail with a serialization error).
    return create_engine(
        url,
        pool_pre_ping=True,
        pool_size=10,
        max_overflow=20,
        isolation_level="READ COMMITTED",
    )


def _sqlite_immediate_transactions(engine: Engine) -> None:
    # pysqlite's own BEGIN handling is disabled so that we can issue BEGIN IMMEDIATE.
    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(bind=engine, expire_on_commit=False, autoflush=True)


def after_commit(session: Session, callback: Callable[[], None]) -> None:
    """Run ``callback`` once ``session``'s unit of work has committed (never if it fails)."""
    session.info.setdefault("after_commit", []).append(callback)


def on_rollback(session: Session, callback: Callable[[], None]) -> None:
    """Undo a side effect outside the database (e.g. a stored object) if the unit fails."""
    session.info.setdefault("on_rollback", []).append(callback)


@contextmanager
def unit_of_work(session: Session) -> Iterator[Session]:
    """Commit ``session`` when the block ends, then run its after-commit callbacks; or roll it
    back, run its on-rollback callbacks and re-raise. The session is closed either way."""
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        for undo in session.info.pop("on_rollback", []):
            undo()
        raise
    finally:
        callbacks = session.info.pop("after_commit", [])
        session.close()
    for callback in callbacks:
        # The unit is committed: what it did stands, and the answer says so. A callback that
        # fails (the broker is down when a release is handed over) is logged; the outbox
        # sweeper (service.releases.sweeper) does it again later.
        try:
            callback()
        except Exception:
            log.exception("after-commit callback failed; left to the sweeper")


@contextmanager
def transaction(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A unit of work for code outside a request (the task wrapper, the sweeper, start-up)."""
    with unit_of_work(factory()) as session:
        yield session
