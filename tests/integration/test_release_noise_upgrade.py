"""Releases written before typed noise (migration 0009) keep their two σ's, and a job queued
before an upgrade still runs with exactly the noise it was charged for."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa
from alembic import command

from service import bootstrap
from service.db import transaction
from service.models import Release
from tests.conftest import TEST_DATABASE_URL, Harness, npz_bytes, scratch_database, toy_dataset
from worker import runner


def _legacy_rows_survive(url: str) -> None:
    config = bootstrap.alembic_config(url)
    command.upgrade(config, "0008")
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO principals (id, name, role, created_at) "
                "VALUES ('p', 'owner', 'owner', CURRENT_TIMESTAMP)"
            )
        )
        conn.execute(
            sa.text(
                "INSERT INTO datasets (id, owner_id, name, format, filename, storage_key, sha256,"
                " size_bytes, n_rows, n_features, feature_shape, classes, classes_declared,"
                " feature_range, created_at) VALUES ('d', 'p', 'x', 'npz', 'x.npz', 'k', 's', 1,"
                " 10, 2, '[2]', '[0, 1]', true, '[0, 1]', CURRENT_TIMESTAMP)"
            )
        )
        conn.execute(
            sa.text(
                "INSERT INTO releases (id, dataset_id, requested_by, mechanism, params, accountant,"
                " format, sigma_x, sigma_y, epsilon, delta, status, progress, attempts,"
                " created_at) VALUES ('r', 'd', 'p', 'dpmix', '{}', 'tight', 'npz', 0.5, 0.25,"
                " 1.0, 1e-5, 'succeeded', 1.0, 1, CURRENT_TIMESTAMP)"
            )
        )
    command.upgrade(config, "head")
    with engine.connect() as conn:
        noise = conn.execute(sa.text("SELECT noise FROM releases WHERE id = 'r'")).scalar_one()
    assert (json.loads(noise) if isinstance(noise, str) else noise) == {
        "sigma_x": 0.5,
        "sigma_y": 0.25,
    }
    command.downgrade(config, "0008")
    with engine.connect() as conn:
        row = conn.execute(sa.text("SELECT sigma_x, sigma_y FROM releases")).one()
    assert tuple(row) == (0.5, 0.25)
    engine.dispose()


def test_migration_keeps_legacy_sigmas_sqlite(tmp_path: Path) -> None:
    _legacy_rows_survive(f"sqlite:///{tmp_path / 'legacy.db'}")


def test_migration_keeps_legacy_sigmas_postgres() -> None:
    with scratch_database(TEST_DATABASE_URL) as url:
        _legacy_rows_survive(url)


def test_a_legacy_queued_release_runs_with_its_charged_noise(
    embedded: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = embedded
    owner, _ = h.new_key("owner")
    X, y = toy_dataset()
    ds = h.upload(owner, npz_bytes(X, y)).json()
    # Queue without running, as if the job waited in the broker across the upgrade.
    monkeypatch.setattr(h.runtime.dispatcher, "enqueue", lambda release_id, queue: None)
    body = h.release_body(ds["id"], noise_ratio=2.0)
    created = h.client.post("/releases", json=body, headers=h.headers(owner)).json()
    described = created["noise"]
    with transaction(h.runtime.session_factory) as session:
        release = session.get(Release, created["id"])
        assert release is not None
        release.noise = {"sigma_x": described["sigma_x"], "sigma_y": described["sigma_y"]}
    shown = h.client.get(f"/releases/{created['id']}", headers=h.headers(owner)).json()
    assert shown["noise"]["scales"] == [] and shown["noise"]["sigma_x"] == described["sigma_x"]

    runner.run_release(h.runtime, created["id"])
    done = h.wait(owner, created["id"])
    assert done["status"] == "succeeded", done
    meta = json.loads(str(np.load(io.BytesIO(h.download(owner, done["id"])))["metadata"]))
    # Rebuilt from the accountant at the stored σ's: the very scales that were charged.
    assert meta["noise"]["scales"] == described["scales"]
