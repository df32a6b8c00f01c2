"""api_keys.expires_at and api_keys.bootstrap: key expiry and rotation of the admin key

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-24

``expires_at`` (nullable): a key is refused from that instant on. ``bootstrap`` marks the key
registered at start-up from DPRELEASE_ADMIN_KEY (or the embedded admin.key file): when the
configured key changes, start-up revokes every active bootstrap key and registers the new one
for the same admin principal, so the old admin key stops working.

Existing bootstrap keys are recognised by the audit trail (an ``api_key.created`` event by
``system``); keys older than the audit trail (migration 0007) that have no creation event at
all are recognised as the bootstrap key when their principal is the start-up's ``admin``.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

MARK_BOOTSTRAP = """
UPDATE api_keys SET bootstrap = :true
WHERE id IN (
    SELECT object_id FROM audit_events
    WHERE action = 'api_key.created' AND actor = 'system' AND object_type = 'api_key'
)
OR (
    principal_id IN (SELECT id FROM principals WHERE name = 'admin' AND role = 'admin')
    AND id NOT IN (
        SELECT object_id FROM audit_events
        WHERE action = 'api_key.created' AND object_type = 'api_key'
    )
)
"""


def upgrade() -> None:
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.add_column(sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(
            sa.Column("bootstrap", sa.Boolean(), nullable=False, server_default=sa.false())
        )
    op.get_bind().execute(sa.text(MARK_BOOTSTRAP), {"true": True})


def downgrade() -> None:
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.drop_column("bootstrap")
        batch_op.drop_column("expires_at")
