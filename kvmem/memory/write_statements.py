"""The memory store's write statements: built once, run as Core statements on the write
transaction's connection (SQLAlchemy's, or on SQLite the bare sqlite3 connection of
`kvmem.db.driver_connection`). `MemoryStore` (`kvmem.memory.store`) runs them.
"""

from __future__ import annotations

from sqlalchemy import bindparam, delete, func, insert, select, update

from kvmem.db.tables import MemoryEntry, MemoryProposal, User

BUMP = (
    update(User)
    .where(User.id == bindparam("user_id"))
    .values(memory_version=User.memory_version + 1)
)
TOTAL = select(func.coalesce(func.sum(MemoryEntry.token_count), 0)).where(
    MemoryEntry.user_id == bindparam("user_id")
)
ENTRIES_OF_USER = select(
    MemoryEntry.id, MemoryEntry.key, MemoryEntry.value, MemoryEntry.token_count
).where(MemoryEntry.user_id == bindparam("user_id"))
INSERT_ENTRY = insert(MemoryEntry)
REPLACE_ENTRY = (
    update(MemoryEntry)
    .where(MemoryEntry.id == bindparam("entry_id"))
    .values(
        value=bindparam("value"),
        token_count=bindparam("token_count"),
        source=bindparam("source"),
        updated_at=bindparam("updated_at"),
    )
)
DELETE_ENTRY = delete(MemoryEntry).where(MemoryEntry.id == bindparam("entry_id"))
DELETE_ENTRIES = delete(MemoryEntry).where(MemoryEntry.user_id == bindparam("user_id"))
DELETE_PROPOSALS = delete(MemoryProposal).where(MemoryProposal.user_id == bindparam("user_id"))
SET_ENABLED = (
    update(User).where(User.id == bindparam("user_id")).values(memories_enabled=bindparam("on"))
)
