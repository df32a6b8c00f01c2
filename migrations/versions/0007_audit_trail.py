"""append-only audit trail of state changes

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_REFUSE = "audit_events is append-only"

# Postgres: one function refuses UPDATE, DELETE and TRUNCATE, whoever asks.
_PG_UP = [
    f"""
    CREATE FUNCTION audit_events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION '{_REFUSE}: % refused', TG_OP;
    END
    $$
    """,
    """
    CREATE TRIGGER audit_events_no_change BEFORE UPDATE OR DELETE ON audit_events
    FOR EACH ROW EXECUTE FUNCTION audit_events_append_only()
    """,
    """
    CREATE TRIGGER audit_events_no_truncate BEFORE TRUNCATE ON audit_events
    FOR EACH STATEMENT EXECUTE FUNCTION audit_events_append_only()
    """,
]
# SQLite (embedded). A later batch migration that recreates this table must recreate these.
_SQLITE_UP = [
    f"""
    CREATE TRIGGER audit_events_no_{op_name.lower()} BEFORE {op_name} ON audit_events
    BEGIN SELECT RAISE(ABORT, '{_REFUSE}: {op_name} refused'); END
    """
    for op_name in ("UPDATE", "DELETE")
]


def upgrade() -> None:
    op.create_table(
        "audit_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(length=64), nullable=False),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("object_type", sa.String(length=32), nullable=False),
        sa.Column("object_id", sa.String(length=64), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_audit_events_at", "audit_events", ["at"])
    op.create_index("ix_audit_events_actor", "audit_events", ["actor"])
    op.create_index("ix_audit_events_object", "audit_events", ["object_type", "object_id"])
    dialect = op.get_bind().dialect.name
    for statement in _PG_UP if dialect == "postgresql" else _SQLITE_UP:
        op.execute(statement)


def downgrade() -> None:
    op.drop_table("audit_events")  # its triggers go with it
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION audit_events_append_only()")
