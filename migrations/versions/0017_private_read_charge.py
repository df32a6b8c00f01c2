"""releases.private_read_at and ledger_entries.settled_because: failures after a private read
are charged

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-27

A job records ``releases.private_read_at`` (under the release row lock) before it first reads
its dataset's content. From then on whether the release fails may depend on the private data
(a mechanism that raises with a small, analysed probability after drawing its noise, say), so a
release that ends without succeeding is refunded only when no job of it had begun reading:
``ledger_entries.settled_because`` says which rule settled each entry (succeeded,
upload_claimed, private_data_read, before_private_read); null for entries settled before this
migration and for research entries.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("releases", schema=None) as batch_op:
        batch_op.add_column(sa.Column("private_read_at", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("ledger_entries", schema=None) as batch_op:
        batch_op.add_column(sa.Column("settled_because", sa.String(length=32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("ledger_entries", schema=None) as batch_op:
        batch_op.drop_column("settled_because")
    with op.batch_alter_table("releases", schema=None) as batch_op:
        batch_op.drop_column("private_read_at")
