"""releases.work: the job's declared work, which picks its lane

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-02

Admission computes each job's declared work (multiply-adds, from public figures: the
mechanism's parameters and the dataset's shape) to hold it to the work cap. It is now stored
with the release, so that every hand-over of its job (at admission, by the outbox sweeper, its
shard and finaliser tasks) sends it to the same lane: the long queue of its worker pool above
DPRELEASE_LONG_JOB_WORK, the short one otherwise. Null for releases admitted before this
migration (their jobs stay in the short lane, where every job waited before).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("releases", schema=None) as batch_op:
        batch_op.add_column(sa.Column("work", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("releases", schema=None) as batch_op:
        batch_op.drop_column("work")
