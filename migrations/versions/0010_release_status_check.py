"""releases.status: only the known statuses (a CHECK constraint), and "cancelled" joins them

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-24

The list is written out here, not imported from service.releases.status: a migration is frozen
history, and the day a status is added the enum changes while this revision must not.
tests/integration/test_release_status.py builds the database from the migrations and checks
that the constraint allows exactly the enum's values, so a new status needs a new revision.
"""

from __future__ import annotations

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

NAME = "ck_releases_status"
STATUSES = ("queued", "running", "succeeded", "failed", "cancelled")


def upgrade() -> None:
    allowed = ", ".join(f"'{s}'" for s in STATUSES)
    # Batch mode: SQLite cannot add a constraint to a table; it is recreated with it.
    with op.batch_alter_table("releases", schema=None) as batch_op:
        batch_op.create_check_constraint(NAME, f"status IN ({allowed})")


def downgrade() -> None:
    with op.batch_alter_table("releases", schema=None) as batch_op:
        batch_op.drop_constraint(NAME, type_="check")
