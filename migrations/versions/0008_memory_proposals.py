"""Review before remembering: the memory agent's pending proposals, and each user's switch.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "memory_proposals",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("user_id", sa.String(128), nullable=False),
        sa.Column("key", sa.String(128), nullable=False),
        sa.Column("op", sa.String(8), nullable=False),
        sa.Column("value", sa.Text(), nullable=True),
        sa.Column("conversation_id", sa.String(200), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["user_id"],
            ["users.id"],
            name=op.f("fk_memory_proposals_user_id_users"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_memory_proposals")),
        # Proposal ids are handed to clients (accept, reject): SQLite must never reuse the id
        # of one dropped, or a stale "keep" could accept a different proposal.
        sqlite_autoincrement=True,
    )
    op.create_index("ix_memory_proposals_user_id", "memory_proposals", ["user_id", "id"])
    with op.batch_alter_table("users") as batch:
        # A constant default ("0", not sa.false()), so SQLite adds the column in place: a
        # recreated `users` table would cascade its drop to every row that references it.
        batch.add_column(sa.Column("review", sa.Boolean(), server_default="0", nullable=False))


def downgrade() -> None:
    # Not in batch mode: SQLite (3.35+) drops a column in place, where a recreated `users`
    # table would take every row that references it along.
    op.drop_column("users", "review")
    op.drop_index("ix_memory_proposals_user_id", table_name="memory_proposals")
    op.drop_table("memory_proposals")
