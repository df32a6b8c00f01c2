"""releases.research and research ledger entries: owner-only releases charged nothing

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-24

A research release runs an accountant whose ε is not a valid bound (a paper's own analysis,
reproduced) under the owner's explicit opt-in. It is shown to the dataset's owner only and
charges nothing: ``releases.research`` holds what the accountant claimed and why that is not a
bound ({claimed_epsilon, claimed_delta, caveat, statement}); its ledger entry is in state
``research`` (never held by the filter) with ε = δ = 0, which the check constraint pins so that
no code path can turn a research entry into a charge, or a charge into a free entry.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

RESEARCH_FREE = (
    "(state <> 'research') OR (epsilon = 0 AND delta = 0 AND consumed_epsilon = 0 "
    "AND consumed_delta = 0 AND charged_as = 'basic')"
)


def upgrade() -> None:
    with op.batch_alter_table("releases", schema=None) as batch_op:
        batch_op.add_column(sa.Column("research", sa.JSON(), nullable=True))
    with op.batch_alter_table("ledger_entries", schema=None) as batch_op:
        batch_op.create_check_constraint("ck_ledger_entries_research_free", RESEARCH_FREE)


def downgrade() -> None:
    with op.batch_alter_table("ledger_entries", schema=None) as batch_op:
        batch_op.drop_constraint("ck_ledger_entries_research_free", type_="check")
    with op.batch_alter_table("releases", schema=None) as batch_op:
        batch_op.drop_column("research")
