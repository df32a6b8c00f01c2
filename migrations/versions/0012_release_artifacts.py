"""releases.artifacts: the further files of a release (a model's weights, say)

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-24

A JSON list of {name, media_type, description}, recorded with the upload claim (what the
attempt is about to store), completed with bytes and sha256 when the release succeeds. Null for
releases without further files, and for every release from before this revision.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("releases", schema=None) as batch_op:
        batch_op.add_column(sa.Column("artifacts", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("releases", schema=None) as batch_op:
        batch_op.drop_column("artifacts")
