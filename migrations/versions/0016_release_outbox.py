"""releases.touched_at and sweeper_leases: the outbox sweeper

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-24

A committed queued release is the outbox of its job: when handing it to the broker fails (or
the message is lost), the sweeper (service.releases.sweeper) sends it again, and it ends a
release left running past its last attempt. ``releases.touched_at`` is the last sign of life
of a release's job (re-sent, started, progress written); ``sweeper_leases`` holds the lease
that lets one API process sweep at a time.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("releases", schema=None) as batch_op:
        batch_op.add_column(sa.Column("touched_at", sa.DateTime(timezone=True), nullable=True))
    op.create_table(
        "sweeper_leases",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("holder", sa.String(length=64), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )


def downgrade() -> None:
    op.drop_table("sweeper_leases")
    with op.batch_alter_table("releases", schema=None) as batch_op:
        batch_op.drop_column("touched_at")
