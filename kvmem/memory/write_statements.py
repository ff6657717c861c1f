"""The memory store's write statements: built once, run as Core statements on the write
transaction's connection (SQLAlchemy's, or on SQLite the bare sqlite3 connection of
`kvmem.db.driver_connection`). `MemoryStore` (`kvmem.memory.store`) runs them.
"""

from __future__ import annotations

from sqlalchemy import (
    and_,
    bindparam,
    case,
    delete,
    distinct,
    false,
    func,
    insert,
    or_,
    select,
    update,
)

from kvmem.db.tables import MemoryEntry, MemoryProposal, User

BUMP = (
    update(User)
    .where(User.id == bindparam("user_id"))
    .values(memory_version=User.memory_version + 1)
)
# The tokens of one layer of the user (`scope`) at `now`: expired entries, and those due to be,
# count for nothing. Each layer has its own `tokenLimit`. Liveness is summed over, not filtered
# on: a filter on `expired` let SQLite (no statistics) read `ix_memory_entries_expiry`, every
# live entry of every user, instead of the user's rows (23 ms a write at 200,000 entries).
LIVE = and_(
    MemoryEntry.expired == false(),
    or_(MemoryEntry.expires_at.is_(None), MemoryEntry.expires_at > bindparam("now")),
)
TOTAL = select(func.coalesce(func.sum(case((LIVE, MemoryEntry.token_count), else_=0)), 0)).where(
    MemoryEntry.user_id == bindparam("user_id"), MemoryEntry.scope == bindparam("scope")
)
# How many scopes (not their own layer) hold memory of the user's at `now`: what
# `memory.scopes.maxScopes` bounds. Liveness is counted over, not filtered on (see TOTAL),
# so the plan reads the user's rows by (user_id, scope) and nobody else's.
SCOPES_HELD = select(func.count(distinct(case((LIVE, MemoryEntry.scope))))).where(
    MemoryEntry.user_id == bindparam("user_id"), MemoryEntry.scope != ""
)
# The same scopes by name (an import weighs which of its layers would be new).
SCOPES_HELD_NAMES = (
    select(MemoryEntry.scope)
    .where(MemoryEntry.user_id == bindparam("user_id"), MemoryEntry.scope != "")
    .group_by(MemoryEntry.scope)
    .having(func.sum(case((LIVE, 1), else_=0)) > 0)
)
ENTRIES_OF_USER = select(
    MemoryEntry.id,
    MemoryEntry.key,
    MemoryEntry.value,
    MemoryEntry.token_count,
    MemoryEntry.expires_at,
    MemoryEntry.expired,
).where(MemoryEntry.user_id == bindparam("user_id"), MemoryEntry.scope == bindparam("scope"))
INSERT_ENTRY = insert(MemoryEntry)
REPLACE_ENTRY = (
    update(MemoryEntry)
    .where(MemoryEntry.id == bindparam("entry_id"))
    .values(
        value=bindparam("value"),
        token_count=bindparam("token_count"),
        source=bindparam("source"),
        updated_at=bindparam("updated_at"),
        expires_at=bindparam("expires_at"),
    )
)
# Only the expiry changes (a set of the same value with another `expires_at`): no change is
# recorded, as for any set that leaves the value as it was.
SET_EXPIRY = (
    update(MemoryEntry)
    .where(MemoryEntry.id == bindparam("entry_id"))
    .values(expires_at=bindparam("expires_at"))
)
DELETE_ENTRY = delete(MemoryEntry).where(MemoryEntry.id == bindparam("entry_id"))
# One layer's entries and proposals (`scope`; "" the person's own).
DELETE_ENTRIES = delete(MemoryEntry).where(
    MemoryEntry.user_id == bindparam("user_id"), MemoryEntry.scope == bindparam("scope")
)
DELETE_PROPOSALS = delete(MemoryProposal).where(
    MemoryProposal.user_id == bindparam("user_id"), MemoryProposal.scope == bindparam("scope")
)
SET_ENABLED = (
    update(User).where(User.id == bindparam("user_id")).values(memories_enabled=bindparam("on"))
)
