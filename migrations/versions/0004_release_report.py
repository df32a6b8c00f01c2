"""releases may ask for an owner-only utility report on a held-out dataset

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("releases", schema=None) as batch_op:
        batch_op.add_column(sa.Column("report_dataset_id", sa.String(length=36), nullable=True))
        batch_op.create_foreign_key(
            "fk_releases_report_dataset_id", "datasets", ["report_dataset_id"], ["id"]
        )


def downgrade() -> None:
    with op.batch_alter_table("releases", schema=None) as batch_op:
        batch_op.drop_constraint("fk_releases_report_dataset_id", type_="foreignkey")
        batch_op.drop_column("report_dataset_id")
