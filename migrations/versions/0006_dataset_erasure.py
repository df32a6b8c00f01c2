"""datasets can be deleted: raw data erased, the row kept (deleted_at, deleted_by)

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("datasets", schema=None) as batch_op:
        batch_op.add_column(sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("deleted_by", sa.String(length=36), nullable=True))
        batch_op.create_foreign_key("fk_datasets_deleted_by", "principals", ["deleted_by"], ["id"])
        # Erased with the raw data, so it may now be empty.
        batch_op.alter_column("clipped_values", existing_type=sa.BigInteger(), nullable=True)


def downgrade() -> None:
    # The old schema cannot say "deleted": such datasets come back looking active, with no
    # raw data (a release on them fails cleanly and is refunded). Their erased count reads 0.
    op.execute("UPDATE datasets SET clipped_values = 0 WHERE clipped_values IS NULL")
    with op.batch_alter_table("datasets", schema=None) as batch_op:
        batch_op.alter_column("clipped_values", existing_type=sa.BigInteger(), nullable=False)
        batch_op.drop_constraint("fk_datasets_deleted_by", type_="foreignkey")
        batch_op.drop_column("deleted_by")
        batch_op.drop_column("deleted_at")
