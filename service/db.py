"""Engine and session factory.

Only the request boundary (``deps.get_session``) and the task wrapper commit; services flush.
SQLite (embedded mode) gets ``BEGIN IMMEDIATE`` so that a transaction takes the write lock at
its start: that is SQLite's equivalent of locking the budget row, and it keeps two admissions
from reading the same ledger state.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker


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


@contextmanager
def transaction(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A unit of work for code outside a request (the task wrapper, start-up)."""
    session = factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
