"""Expiring entries in the database: marking those whose `expires_at` has come, with a change.

An entry whose time has come is kept (`GET /memory?include_expired=true` lists it) but
marked `expired`, and its history gets a change with op `expire` and source `system`, dated
`expires_at`, in the same transaction, under the user's lock, which also bumps the user's
memory version so that cached snapshots are read anew. Two paths do it: `MemoryStore`, for one
user, as soon as a read finds one of their entries due (lazily, so the change is there by the
time any route reads the user's memory), and the periodic sweep (`kvmem.memory.retention`)
for users nobody reads. One transaction marks at most `EXPIRE_BATCH` entries, so that it holds
SQLite's writer no longer than a batch of the history sweep does. It knows nothing of HTTP.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, false, insert, select, update
from sqlalchemy.engine import Connection

from kvmem.db.driver_connection import Executor
from kvmem.db.engine import Database
from kvmem.db.tables import MemoryChange, MemoryEntry, User
from kvmem.memory.history import ChangeLog
from kvmem.memory.write_statements import BUMP, DELETE_ENTRY

# Entries marked per transaction: measured to hold SQLite's writer no longer than a history sweep
# batch (`python -m tests.bench.expiry`).
EXPIRE_BATCH = 20

_DUE_OF_USER = (
    select(
        MemoryEntry.id,
        MemoryEntry.key,
        MemoryEntry.value,
        MemoryEntry.expires_at,
        MemoryEntry.scope,
    )
    .where(
        MemoryEntry.user_id == bindparam("user_id"),
        MemoryEntry.expired == false(),
        MemoryEntry.expires_at <= bindparam("now"),
    )
    .order_by(MemoryEntry.expires_at, MemoryEntry.id)
    .limit(bindparam("batch"))
)
# Read off `ix_memory_entries_expiry`: the entries due soonest, past those already marked.
_DUE_OF_USERS = (
    select(
        MemoryEntry.id,
        MemoryEntry.user_id,
        MemoryEntry.key,
        MemoryEntry.value,
        MemoryEntry.expires_at,
        MemoryEntry.scope,
    )
    .where(MemoryEntry.expired == false(), MemoryEntry.expires_at <= bindparam("now"))
    .order_by(MemoryEntry.expires_at, MemoryEntry.id)
    .limit(bindparam("batch"))
)
_DUE_ANY = _DUE_OF_USERS
_MARK = update(MemoryEntry).where(MemoryEntry.id == bindparam("entry_id")).values(expired=True)
# The user's row, locked (PostgreSQL; SQLite's writer is one already), only if it exists: an
# expiry never creates a user, so it cannot bring back one just erased.
_LOCK_EXISTING_USER = select(User.id).where(User.id == bindparam("user_id")).with_for_update()


def expire_row(connection: Executor, log: ChangeLog, user_id: str, row: Any) -> None:
    """Mark one due entry (a row with `id`, `key`, `value`, `expires_at`, `scope`) expired and
    record its `expire` change; the caller holds the user's lock and bumps their version."""
    connection.execute(_MARK, {"entry_id": row.id})
    log.record(
        connection,
        user_id,
        row.key,
        "expire",
        row.value,
        None,
        "system",
        None,
        at=row.expires_at,
        scope=row.scope,
    )


def expire_due_locked(
    connection: Executor,
    log: ChangeLog,
    user_id: str,
    now: datetime,
    batch: int = EXPIRE_BATCH,
) -> int:
    """Expire up to `batch` of the user's entries due at `now`, inside a transaction that
    holds the user's lock; how many."""
    rows = connection.execute(_DUE_OF_USER, {"user_id": user_id, "now": now, "batch": batch}).all()
    for row in rows:
        expire_row(connection, log, user_id, row)
    if rows:
        connection.execute(BUMP, {"user_id": user_id})
    return len(rows)


def lock_existing_user(connection: Executor, user_id: str) -> bool:
    """Hold the user's row locked until the transaction ends; False when there is none."""
    return connection.execute(_LOCK_EXISTING_USER, {"user_id": user_id}).first() is not None


def expire_user(
    connection: Executor, log: ChangeLog, user_id: str, now: datetime, batch: int = EXPIRE_BATCH
) -> int:
    """Lock the user (if they exist) and expire up to `batch` of their due entries; how many."""
    if not lock_existing_user(connection, user_id):
        return 0
    return expire_due_locked(connection, log, user_id, now, batch)


def expire_due_any(
    connection: Connection, log: ChangeLog, now: datetime, batch: int = EXPIRE_BATCH
) -> int:
    """The sweep's step: expire up to `batch` entries due at `now`, of any user, in a
    handful of statements whatever the batch (a statement per entry would hold SQLite's
    writer ten times longer than a batch of the history sweep); how many. On PostgreSQL the
    users are locked first, in id order (one order for every sweeper and writer: no
    deadlock), and their due entries read again under the locks. The one read not scoped by
    user: it is maintenance."""
    rows = connection.execute(_DUE_ANY, {"now": now, "batch": batch}).all()
    users = sorted({row.user_id for row in rows})
    if not users:
        return 0
    if connection.dialect.name != "sqlite":  # SQLite's writer is held already
        connection.execute(
            select(User.id).where(User.id.in_(users)).order_by(User.id).with_for_update()
        )
        rows = connection.execute(
            _DUE_OF_USERS.where(MemoryEntry.user_id.in_(users)), {"now": now, "batch": batch}
        ).all()
        if not rows:
            return 0
    connection.execute(
        update(MemoryEntry).where(MemoryEntry.id.in_([row.id for row in rows])).values(expired=True)
    )
    if log.enabled:
        connection.execute(
            insert(MemoryChange),
            [
                {
                    "user_id": row.user_id,
                    "key": row.key,
                    "op": "expire",
                    "old_value": row.value,
                    "new_value": None,
                    "source": "system",
                    "conversation_id": None,
                    "at": row.expires_at,
                    "scope": row.scope,
                }
                for row in rows
            ],
        )
    connection.execute(
        update(User)
        .where(User.id.in_(sorted({row.user_id for row in rows})))
        .values(memory_version=User.memory_version + 1)
    )
    return len(rows)


def expire_user_due(database: Database, log: ChangeLog, user_id: str, now: datetime) -> int:
    """Expire every entry of the user due at `now`, `EXPIRE_BATCH` per transaction; how many."""
    total = 0
    while True:
        with database.writing_prebuilt() as connection:
            expired = expire_user(connection, log, user_id, now)
        total += expired
        if expired < EXPIRE_BATCH:
            return total


def drop_expired(connection: Executor, log: ChangeLog, user_id: str, row: Any) -> None:
    """Remove the row of an entry no longer live (an `ENTRY_AT_KEY` row), recording its
    `expire` change first when no read has yet; the caller holds the user's lock."""
    if not row.expired:
        expire_row(connection, log, user_id, row)
    connection.execute(DELETE_ENTRY, {"entry_id": row.id})
    connection.execute(BUMP, {"user_id": user_id})
