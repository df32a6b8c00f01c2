"""every noise of a release, typed: releases.noise (JSON) replaces sigma_x/sigma_y

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-23

A release now stores its accountant's noise description (every Gaussian scale with its σ,
sensitivity and what it perturbs, and the analysis parameters fixed with it). Rows written
before keep their two σ's as {"sigma_x": …, "sigma_y": …}; the service rebuilds their full
description from the accountant when it reads them (``service.releases.noise``).
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

_releases = sa.table(
    "releases",
    sa.column("id", sa.String),
    sa.column("sigma_x", sa.Float),
    sa.column("sigma_y", sa.Float),
    sa.column("noise", sa.JSON),
)


def upgrade() -> None:
    with op.batch_alter_table("releases", schema=None) as batch_op:
        batch_op.add_column(sa.Column("noise", sa.JSON(), nullable=True))
    bind = op.get_bind()
    rows = bind.execute(sa.select(_releases.c.id, _releases.c.sigma_x, _releases.c.sigma_y))
    for release_id, sigma_x, sigma_y in rows.fetchall():
        bind.execute(
            _releases.update()
            .where(_releases.c.id == release_id)
            .values(noise={"sigma_x": sigma_x, "sigma_y": sigma_y})
        )
    with op.batch_alter_table("releases", schema=None) as batch_op:
        batch_op.alter_column("noise", existing_type=sa.JSON(), nullable=False)
        batch_op.drop_column("sigma_x")
        batch_op.drop_column("sigma_y")


def downgrade() -> None:
    with op.batch_alter_table("releases", schema=None) as batch_op:
        batch_op.add_column(sa.Column("sigma_x", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("sigma_y", sa.Float(), nullable=True))
    bind = op.get_bind()
    rows = bind.execute(sa.select(_releases.c.id, _releases.c.noise))
    for release_id, noise in rows.fetchall():
        value = json.loads(noise) if isinstance(noise, str) else noise
        bind.execute(
            _releases.update()
            .where(_releases.c.id == release_id)
            .values(sigma_x=value["sigma_x"], sigma_y=value.get("sigma_y") or 0.0)
        )
    with op.batch_alter_table("releases", schema=None) as batch_op:
        batch_op.alter_column("sigma_x", existing_type=sa.Float(), nullable=False)
        batch_op.alter_column("sigma_y", existing_type=sa.Float(), nullable=False)
        batch_op.drop_column("noise")
