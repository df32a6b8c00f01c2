"""The database allows exactly the statuses of ``ReleaseStatus``: the CHECK constraint of
migration 0010 (whose list is written out, migrations being frozen history) is read back from
databases built by the migrations, so a status added to the enum without a migration fails
here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.exc import IntegrityError

from service import bootstrap
from service.releases.status import ReleaseStatus
from tests.conftest import TEST_DATABASE_URL, scratch_database


def _allowed_statuses(url: str) -> set[str]:
    bootstrap.upgrade(url)
    engine = create_engine(url)
    try:
        checks = inspect(engine).get_check_constraints("releases")
        (status,) = [c for c in checks if c["name"] == "ck_releases_status"]
        # SQLite returns the text as written ("status IN ('queued', …)"), Postgres its own
        # rendering ("(status)::text = ANY (ARRAY['queued'::character varying, …])"): the
        # quoted words are the values either way.
        assert "status" in status["sqltext"]
        values = re.findall(r"'([^']*)'", status["sqltext"])
        assert len(values) == len(set(values))
        # And the database enforces it (rolled back: nothing is written).
        with engine.connect() as conn, pytest.raises(IntegrityError, match="ck_releases_status"):
            conn.execute(
                text(
                    "INSERT INTO releases (id, dataset_id, requested_by, mechanism, params, "
                    "accountant, format, noise, epsilon, delta, status, progress, attempts, "
                    "created_at) VALUES ('r', 'd', 'p', 'm', '{}', 'a', 'npz', '{}', 1, 0, "
                    "'paused', 0, 0, CURRENT_TIMESTAMP)"
                )
            )
        return set(values)
    finally:
        engine.dispose()


def test_sqlite_allows_exactly_the_enum(tmp_path: Path) -> None:
    assert _allowed_statuses(f"sqlite:///{tmp_path / 's.db'}") == set(ReleaseStatus)


def test_postgres_allows_exactly_the_enum() -> None:
    with scratch_database(TEST_DATABASE_URL) as url:
        assert _allowed_statuses(url) == set(ReleaseStatus)
