"""noise sampler per release (secure by default; earlier releases used the fast one)

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Rows written before this revision were noised with the fast sampler: say so, then make
    # new rows default to the secure one.
    with op.batch_alter_table("releases", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("noise_sampler", sa.String(length=16), nullable=False, server_default="fast")
        )
    with op.batch_alter_table("releases", schema=None) as batch_op:
        batch_op.alter_column("noise_sampler", server_default="secure")


def downgrade() -> None:
    with op.batch_alter_table("releases", schema=None) as batch_op:
        batch_op.drop_column("noise_sampler")
