"""Erasing a user: every row kvmem holds for one user, from every table, in one transaction.

The tables are found from the schema, not listed by hand, so a table added later is erased
too: a row belongs to the user when it has the user's `user_id`, references the `users` row,
or references (one level down) a row that has the user's `user_id` (messages through their
conversation). Children go before parents, then the `users` row (preferences) itself.
It works in a session `MemoryStore.erase_user` opened; it knows nothing of HTTP.

An erasure is final: it leaves a fence (`user_erasures`: the sha256 of the user id, not the
id, and when, kept for `FENCE_KEPT`), and a write of work that began before it (an agent
run's write or proposal, an inline turn's markers, its usage record, a `/chat` turn) checks
the fence in its own transaction, under the user's lock, and writes nothing
(`check_not_erased`). The fence is in the database, so it holds on every replica.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Table, bindparam, delete, insert, or_, select
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from kvmem.db.driver_connection import Executor
from kvmem.db.engine import rowcount
from kvmem.db.tables import Base, UserErasure
from kvmem.errors import UserErased

# Longer than any work in flight can last (an agent run lives seconds, its record a moment).
FENCE_KEPT = timedelta(days=1)
_ERASED_AT = select(UserErasure.erased_at).where(UserErasure.user_hash == bindparam("user_hash"))


def user_hash(user_id: str) -> str:
    """What the fence keeps of an erased user: the sha256 of the id, in hex."""
    return hashlib.sha256(user_id.encode("utf-8")).hexdigest()


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

    def __add__(self, other: Erased) -> Erased:
        """The rows of two erasures of the same user, together."""
        return Erased(
            **{name: getattr(self, name) + getattr(other, name) for name in REPORTED.values()}
        )

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
            counts[table.name] = rowcount(session.execute(delete(table).where(condition)))
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
            if foreign_key.parent is not table.c.get("user_id"):  # else already above
                conditions.append(foreign_key.parent == user_id)
        elif "user_id" in parent.c:
            owned = select(foreign_key.column).where(parent.c.user_id == user_id)
            conditions.append(foreign_key.parent.in_(owned))
    return or_(*conditions) if conditions else None


def fence_user(session: Session, user_id: str, now: datetime) -> None:
    """Record that the user was erased `now` (inside the erasure's transaction), and drop the
    fences older than `FENCE_KEPT`."""
    fenced = user_hash(user_id)
    # Two statements, each by its index (an OR of the two would scan the table).
    session.execute(delete(UserErasure).where(UserErasure.user_hash == fenced))
    session.execute(delete(UserErasure).where(UserErasure.erased_at < now - FENCE_KEPT))
    session.execute(insert(UserErasure).values(user_hash=fenced, erased_at=now))


def erasure_times(connection: Connection, user_ids: Iterable[str]) -> dict[str, datetime]:
    """When each of these users was last erased (those erased within `FENCE_KEPT`)."""
    hashes = {user_hash(user_id): user_id for user_id in user_ids}
    rows = connection.execute(
        select(UserErasure.user_hash, UserErasure.erased_at).where(
            UserErasure.user_hash.in_(list(hashes))
        )
    )
    return {hashes[fenced]: erased_at for fenced, erased_at in rows}


def erased_since(connection: Executor, user_id: str, since: datetime) -> bool:
    """Whether the user was erased at or after `since` (read under the user's lock)."""
    erased_at = connection.execute(_ERASED_AT, {"user_hash": user_hash(user_id)}).scalar()
    return erased_at is not None and erased_at >= since


def check_not_erased(connection: Executor, user_id: str, since: datetime) -> None:
    """`UserErased` if the user was erased after work that began at `since` began."""
    if erased_since(connection, user_id, since):
        raise UserErased(f"user {user_id!r} was erased after this write began")
