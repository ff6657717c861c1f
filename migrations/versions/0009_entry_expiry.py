"""Memories that expire: `expires_at` on entries and proposals, and each entry's `expired` mark.

Existing rows never expire (`expires_at` null, `expired` false).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-05
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable columns and a constant default: SQLite adds them in place (no table copy).
    with op.batch_alter_table("memory_entries") as batch:
        batch.add_column(sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("expired", sa.Boolean(), server_default="0", nullable=False))
    op.create_index("ix_memory_entries_expiry", "memory_entries", ["expired", "expires_at"])
    with op.batch_alter_table("memory_proposals") as batch:
        batch.add_column(sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_index("ix_memory_entries_expiry", table_name="memory_entries")
    # Not in batch mode: SQLite (3.35+) drops a column in place.
    op.drop_column("memory_proposals", "expires_at")
    op.drop_column("memory_entries", "expired")
    op.drop_column("memory_entries", "expires_at")
