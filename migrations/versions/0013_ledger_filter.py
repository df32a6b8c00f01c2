"""ledger_entries: how the privacy filter charged each release

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-23

The ledger became a privacy filter (dpcore.accounting.filter): each release is charged either
``basic`` (its own (ε, δ)) or ``renyi`` (its RDP curve, in a group that holds δ_R), fixed at
admission. ``group_delta`` is δ_R for ``renyi`` charges; ``consumed_epsilon`` and
``consumed_delta`` are what admission added to the filter's spend (for display).

Entries from before this revision were admitted by the minimum over composition methods; they
are carried over conservatively: with a curve they join the Rényi group at their own δ (the
filter counts the largest such δ as spent and converts at the smallest), without one they are
basic charges of their (ε, δ).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("ledger_entries", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("charged_as", sa.String(8), nullable=False, server_default="basic")
        )
        batch_op.add_column(sa.Column("group_delta", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("consumed_epsilon", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("consumed_delta", sa.Float(), nullable=True))
    op.execute(
        "UPDATE ledger_entries SET charged_as = 'renyi', group_delta = delta "
        "WHERE rdp IS NOT NULL AND delta > 0"
    )
    op.execute("UPDATE ledger_entries SET consumed_epsilon = epsilon, consumed_delta = delta")
    with op.batch_alter_table("ledger_entries", schema=None) as batch_op:
        batch_op.create_check_constraint(
            "ck_ledger_entries_charged_as",
            "(charged_as = 'basic') OR (charged_as = 'renyi' AND group_delta IS NOT NULL "
            "AND rdp IS NOT NULL)",
        )


def downgrade() -> None:
    with op.batch_alter_table("ledger_entries", schema=None) as batch_op:
        batch_op.drop_constraint("ck_ledger_entries_charged_as", type_="check")
        batch_op.drop_column("consumed_delta")
        batch_op.drop_column("consumed_epsilon")
        batch_op.drop_column("group_delta")
        batch_op.drop_column("charged_as")
