"""The change log of memory entries: every set and delete, from every path, with provenance.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "memory_changes",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("user_id", sa.String(128), nullable=False),
        sa.Column("key", sa.String(128), nullable=False),
        sa.Column("op", sa.String(8), nullable=False),
        sa.Column("old_value", sa.Text(), nullable=True),
        sa.Column("new_value", sa.Text(), nullable=True),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("conversation_id", sa.String(200), nullable=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["user_id"],
            ["users.id"],
            name=op.f("fk_memory_changes_user_id_users"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_memory_changes")),
        # Change ids are handed to clients (revert targets, page cursors): SQLite must never
        # reuse the id of a deleted change, as it would for a plain INTEGER PRIMARY KEY.
        sqlite_autoincrement=True,
    )
    op.create_index("ix_memory_changes_user_id", "memory_changes", ["user_id", "id"])
    op.create_index("ix_memory_changes_user_key", "memory_changes", ["user_id", "key", "id"])
    op.create_index("ix_memory_changes_at", "memory_changes", ["at"])


def downgrade() -> None:
    op.drop_index("ix_memory_changes_at", table_name="memory_changes")
    op.drop_index("ix_memory_changes_user_key", table_name="memory_changes")
    op.drop_index("ix_memory_changes_user_id", table_name="memory_changes")
    op.drop_table("memory_changes")
