"""Scopes: memory per assistant, model or project, beside the person's own (CONTRACT §23).

A `scope` on entries, changes and proposals: "" for the person's own layer (what every row
was before), else the scope's name. Not null, so that the unique (user, scope, key) holds for
the own layer on SQLite and PostgreSQL alike (null is never equal to null in a unique
constraint). Existing rows become the person's own layer.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-05
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def _scope() -> sa.Column[str]:
    return sa.Column("scope", sa.String(128), server_default=sa.text("''"), nullable=False)


def upgrade() -> None:
    # The unique key gains the scope: SQLite cannot alter a constraint, so batch mode copies
    # the table once (no other table references its rows).
    with op.batch_alter_table("memory_entries") as batch:
        batch.add_column(_scope())
        batch.drop_constraint("uq_memory_entries_user_id", type_="unique")
        batch.create_unique_constraint(
            "uq_memory_entries_user_scope_key", ["user_id", "scope", "key"]
        )
        # A turn reads one layer (two for a scoped turn) in order: no other layer's rows.
        batch.drop_index("ix_memory_entries_user_updated")
        batch.create_index(
            "ix_memory_entries_user_scope_updated", ["user_id", "scope", "updated_at"]
        )
    # Not in batch mode: a column with a constant default is added in place on SQLite too,
    # where batch mode would copy the tables and lose their AUTOINCREMENT (ids handed to
    # clients must never be reused).
    op.add_column("memory_changes", _scope())
    op.create_index("ix_memory_changes_user_scope", "memory_changes", ["user_id", "scope", "id"])
    op.add_column("memory_proposals", _scope())


def downgrade() -> None:
    # Scoped rows have no place in the schema before scopes: they go, the own layer stays.
    for table in ("memory_proposals", "memory_changes", "memory_entries"):
        op.execute(sa.text(f"DELETE FROM {table} WHERE scope != ''"))  # noqa: S608 (constant)
    # Not in batch mode: SQLite (3.35+) drops a column in place, keeping AUTOINCREMENT.
    op.drop_column("memory_proposals", "scope")
    op.drop_index("ix_memory_changes_user_scope", table_name="memory_changes")
    op.drop_column("memory_changes", "scope")
    with op.batch_alter_table("memory_entries") as batch:
        batch.drop_index("ix_memory_entries_user_scope_updated")
        batch.create_index("ix_memory_entries_user_updated", ["user_id", "updated_at"])
        batch.drop_constraint("uq_memory_entries_user_scope_key", type_="unique")
        batch.create_unique_constraint("uq_memory_entries_user_id", ["user_id", "key"])
        batch.drop_column("scope")
