"""The erasure fence: one row per user erased in the last day (the sha256 of the user id, not
the id itself), with when.

Work that began before a user's erasure (an agent run, its usage record) checks this row in
its own write transaction and writes nothing, on every replica.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "user_erasures",
        sa.Column("user_hash", sa.String(64), nullable=False),
        sa.Column("erased_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("user_hash", name=op.f("pk_user_erasures")),
    )
    # Old fences are dropped by age in every erasure: by this index, not a scan.
    op.create_index("ix_user_erasures_erased_at", "user_erasures", ["erased_at"])


def downgrade() -> None:
    op.drop_table("user_erasures")
