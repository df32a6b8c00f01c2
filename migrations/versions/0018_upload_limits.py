"""datasets.upload_limits: the caps an upload was accepted under

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-28

A release job parses the stored upload again. It must do so under the caps the upload was
accepted under (bytes, values, decoded bytes), not under the file's own size: a compressed NPZ
or a dictionary-encoded Parquet file holds more than its size in values, and was admitted.
Null for datasets uploaded before this migration (their jobs use the server's current caps).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("datasets", schema=None) as batch_op:
        batch_op.add_column(sa.Column("upload_limits", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("datasets", schema=None) as batch_op:
        batch_op.drop_column("upload_limits")
