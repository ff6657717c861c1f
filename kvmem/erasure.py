"""Erasing a user: every row kvmem holds for one user, from every table, in one transaction.

The tables are found from the schema, not listed by hand, so a table added later is erased
too: a row belongs to the user when it has the user's `user_id`, references the `users` row,
or references (one level down) a row that has the user's `user_id` (messages through their
conversation). Children go before parents, then the `users` row (preferences) itself.
It works in a session `MemoryStore.erase_user` opened; it knows nothing of HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Table, delete, or_, select
from sqlalchemy.orm import Session

from kvmem.tables import Base

# What `DELETE /me` reports, by table.
REPORTED = {
    "memory_entries": "memories",
    "memory_changes": "changes",
    "conversations": "conversations",
    "messages": "messages",
    "api_keys": "keys",
    "sessions": "sessions",
    "agent_runs": "agent_runs",
}


@dataclass(frozen=True)
class Erased:
    """How many rows of the user's were deleted, by kind."""

    memories: int = 0
    changes: int = 0
    conversations: int = 0
    messages: int = 0
    keys: int = 0
    sessions: int = 0
    agent_runs: int = 0

    def as_json(self) -> dict[str, Any]:
        """The body of `DELETE /me`."""
        return {
            "deleted": {
                "memories": self.memories,
                "changes": self.changes,
                "conversations": self.conversations,
                "messages": self.messages,
                "keys": self.keys,
                "sessions": self.sessions,
                "agent_runs": self.agent_runs,
            }
        }


def erase_user_rows(session: Session, user_id: str) -> Erased:
    """Delete the user's rows from every table (inside the caller's transaction)."""
    users = Base.metadata.tables["users"]
    counts: dict[str, int] = {}
    for table in reversed(Base.metadata.sorted_tables):
        if table is users:
            continue
        condition = _owned_by(table, users, user_id)
        if condition is not None:
            counts[table.name] = session.execute(delete(table).where(condition)).rowcount
    session.execute(delete(users).where(users.c.id == user_id))
    return Erased(**{REPORTED[name]: n for name, n in counts.items() if name in REPORTED})


def _owned_by(table: Table, users: Table, user_id: str) -> ColumnElement[bool] | None:
    """Which of `table`'s rows are the user's, or None when the table holds no user data."""
    conditions: list[ColumnElement[bool]] = []
    if "user_id" in table.c:
        conditions.append(table.c.user_id == user_id)
    for foreign_key in table.foreign_keys:
        parent = foreign_key.column.table
        if parent is users:
            conditions.append(foreign_key.parent == user_id)
        elif "user_id" in parent.c:
            owned = select(foreign_key.column).where(parent.c.user_id == user_id)
            conditions.append(foreign_key.parent.in_(owned))
    return or_(*conditions) if conditions else None
