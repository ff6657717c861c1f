"""The memory store: each user's key/value entries, their history and opt-out switch.

Every write applies `MemoryRules` and checks `tokenLimit` inside one transaction that holds
the user's write lock, so the limit holds under any concurrency; the change it makes is
recorded (`kvmem.history`) in that same transaction, so history is never missing a write
nor holds one that did not happen. A write that leaves the value as it was changes nothing:
no change is recorded and `updated_at` and `source` stay. Every query is scoped by
`user_id`; callers get frozen dataclasses, never a session. On SQLite, while the app runs,
concurrent `set`s share transactions through one writer thread (`kvmem.group_commit`), each
keeping its own checks and result.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import anyio.to_thread
from sqlalchemy import bindparam, delete, func, insert, select, update
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.orm import Session

from kvmem.db import Database, rowcount
from kvmem.erasure import Erased, check_not_erased, erase_user_rows, fence_user
from kvmem.errors import BadRequest, KvmemError, MemoryFull, NotFound
from kvmem.group_commit import GroupCommit, Prepare
from kvmem.history import Change, ChangeLog, ChangeSource, HistoryPage, iso
from kvmem.rules import MemoryRules
from kvmem.tables import MemoryEntry, MemoryProposal, User, utcnow
from kvmem.tokens import TokenCounter

log = logging.getLogger("kvmem.store")

Source = ChangeSource
# Expired changes deleted per transaction by the sweep: each holds SQLite's writer ~2 ms.
SWEEP_BATCH = 200
ImportMode = Literal["merge", "replace"]
__all__ = [
    "Change", "Entry", "Erased", "HistoryPage", "Imported", "MemoryStore", "Reverted",
    "Snapshot", "Written", "iso",
]


@dataclass(frozen=True)
class Entry:
    """One stored memory."""

    key: str
    value: str
    token_count: int
    source: str
    created_at: datetime
    updated_at: datetime

    def as_json(self) -> dict[str, Any]:
        """The entry as the API shows it, times in ISO 8601 UTC."""
        return {
            "key": self.key,
            "value": self.value,
            "token_count": self.token_count,
            "created_at": iso(self.created_at),
            "updated_at": iso(self.updated_at),
            "source": self.source,
        }


@dataclass(frozen=True)
class Snapshot:
    """All of a user's entries (oldest `updated_at` first) and their opt-out switch."""

    entries: tuple[Entry, ...]
    memories_enabled: bool

    @property
    def total_tokens(self) -> int:
        """The sum of the entries' token counts."""
        return sum(entry.token_count for entry in self.entries)


@dataclass(frozen=True)
class Written:
    """The outcome of a successful `set`."""

    entry: Entry
    created: bool
    total_tokens: int
    # The recorded change; None when the value did not change or no history is kept.
    change_id: int | None = None


@dataclass(frozen=True)
class Imported:
    """The outcome of an import: entries written, entries deleted (`replace`), the total now."""

    imported: int
    deleted: int
    total_tokens: int


@dataclass(frozen=True)
class Reverted:
    """The outcome of a `revert`: the entry now (None when the key is now deleted)."""

    entry: Entry | None
    total_tokens: int
    change_id: int | None


_SNAPSHOT = (
    select(
        MemoryEntry.key,
        MemoryEntry.value,
        MemoryEntry.token_count,
        MemoryEntry.source,
        MemoryEntry.created_at,
        MemoryEntry.updated_at,
    )
    .where(MemoryEntry.user_id == bindparam("user_id"))
    .order_by(MemoryEntry.updated_at, MemoryEntry.id)
)


_USER_STATE = select(User.memories_enabled, User.memory_version, User.created_at).where(
    User.id == bindparam("user_id")
)
_BUMP = (
    update(User)
    .where(User.id == bindparam("user_id"))
    .values(memory_version=User.memory_version + 1)
)
# The write path's statements, built once and run on the session's connection as Core
# statements: the ORM's unit of work, identity map and bulk-update synchronization cost more
# than the SQL itself, and every write holds the writer lock (SQLite) while it runs them.
_ROW = select(
    MemoryEntry.id,
    MemoryEntry.key,
    MemoryEntry.value,
    MemoryEntry.token_count,
    MemoryEntry.source,
    MemoryEntry.created_at,
    MemoryEntry.updated_at,
).where(MemoryEntry.user_id == bindparam("user_id"), MemoryEntry.key == bindparam("key"))
_TOTAL = select(func.coalesce(func.sum(MemoryEntry.token_count), 0)).where(
    MemoryEntry.user_id == bindparam("user_id")
)
_INSERT_ENTRY = insert(MemoryEntry)
_REPLACE_ENTRY = (
    update(MemoryEntry)
    .where(MemoryEntry.id == bindparam("entry_id"))
    .values(
        value=bindparam("value"),
        token_count=bindparam("token_count"),
        source=bindparam("source"),
        updated_at=bindparam("updated_at"),
    )
)


@functools.cache
def _sqlite_reads(dialect: Dialect) -> tuple[str, str, list[Callable[[Any], Any] | None]]:
    """`snapshot`'s two statements compiled for SQLite, and what SQLAlchemy would make of each
    column of the second (text to datetime, say): built once per engine, not per store."""
    return (
        str(_USER_STATE.compile(dialect=dialect)),
        str(_SNAPSHOT.compile(dialect=dialect)),
        [column.type.dialect_impl(dialect).result_processor(dialect, None)
         for column in _SNAPSHOT.selected_columns],
    )


# A user row's memory version, with its creation time: a user erased and seen again starts
# at version 0 anew, so the version alone could match entries cached before the erasure.
# (On SQLite the creation time is the stored text: it is only compared.)
Version = tuple[datetime | str, int]


class EntryCache:
    """The last entries read per user, tagged with the user's memory version (bounded LRU)."""

    def __init__(self, size: int = 1024) -> None:
        self.size = size
        self._items: OrderedDict[str, tuple[Version, tuple[Entry, ...]]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, user_id: str, version: Version) -> tuple[Entry, ...] | None:
        """The cached entries if they were read at `version`."""
        with self._lock:
            item = self._items.get(user_id)
            if item is None or item[0] != version:
                return None
            self._items.move_to_end(user_id)
            return item[1]

    def put(self, user_id: str, version: Version, entries: tuple[Entry, ...]) -> None:
        """Remember the entries read at `version`."""
        with self._lock:
            self._items[user_id] = (version, entries)
            self._items.move_to_end(user_id)
            while len(self._items) > self.size:
                self._items.popitem(last=False)


class MemoryStore:
    """Reads and writes users' memory entries under the configured rules."""

    def __init__(
        self,
        database: Database,
        rules: MemoryRules,
        tokens: TokenCounter,
        *,
        keep_days: int = 90,
    ) -> None:
        self.database = database
        self.rules = rules
        self.tokens = tokens
        self.history_log = ChangeLog(keep_days)
        self._cache = EntryCache()
        if database.dialect == "sqlite":
            self._sqlite_reads = _sqlite_reads(database.engine.dialect)
        self._group: GroupCommit | None = None  # SQLite's writer thread, while it runs

    def snapshot(self, user_id: str) -> Snapshot:
        """The user's entries, oldest first, and whether they want memory used."""
        # This read is on every chat request's path: one small row tells whether the entries
        # read before are still current; only when they are not are they read again (as
        # plain column rows, not ORM objects).
        if self.database.dialect == "sqlite":
            return self._sqlite_snapshot(user_id)
        with self.database.reading() as session:
            connection = session.connection()
            user = connection.execute(_USER_STATE, {"user_id": user_id}).first()
            if user is None:  # no row, no entries (they reference it)
                return Snapshot(entries=(), memories_enabled=True)
            version = (user.created_at, user.memory_version)
            entries = self._cache.get(user_id, version)
            if entries is None:
                rows = connection.execute(_SNAPSHOT, {"user_id": user_id}).all()
                entries = tuple(Entry(*row) for row in rows)
                self._cache.put(user_id, version, entries)
        return Snapshot(entries=entries, memories_enabled=user.memories_enabled)

    def _sqlite_snapshot(self, user_id: str) -> Snapshot:
        """`snapshot` on SQLite's own connection (see `Database.reading_cursor`)."""
        user_state, snapshot, processors = self._sqlite_reads
        with self.database.reading_cursor() as cursor:
            user = cursor.execute(user_state, (user_id,)).fetchone()
            if user is None:
                return Snapshot(entries=(), memories_enabled=True)
            memories_enabled, memory_version, created_at = user
            version = (created_at, memory_version)
            entries = self._cache.get(user_id, version)
            if entries is None:
                entries = tuple(
                    Entry(*(process(value) if process else value
                            for process, value in zip(processors, row, strict=True)))
                    for row in cursor.execute(snapshot, (user_id,)).fetchall()
                )
                self._cache.put(user_id, version, entries)
        return Snapshot(entries=entries, memories_enabled=bool(memories_enabled))

    def get(self, user_id: str, key: str) -> Entry:
        """The entry at `key`, or `NotFound`."""
        self.rules.check_key_format(key)
        with self.database.reading() as session:
            row = _find(session, user_id, key)
            if row is None:
                raise NotFound(f"no memory with key {key!r}")
            return _entry(row)

    def set(
        self,
        user_id: str,
        key: str,
        value: str,
        source: Source = "manual",
        *,
        conversation_id: str | None = None,
        guard: Callable[[], None] | None = None,
        since: datetime | None = None,
    ) -> Written:
        """Create or replace the entry at `key`; `MemoryFull` if it would pass `tokenLimit`.

        The change is recorded with `source` and `conversation_id` (the conversation whose
        agent run made it). `guard` runs just before the commit; if it raises, nothing is
        written (the memory agent uses it so that no write lands after its deadline).
        `since`, when the work making the write began, refuses it with `UserErased` if the
        user was erased after that (the agent's runs pass it: erasure is final).
        """
        prepare = self._set_write(user_id, key, value, source, conversation_id, since)
        # A guarded write runs alone, its guard checked right before its own COMMIT.
        future = self._group.submit(prepare) if self._group and guard is None else None
        if future is not None:
            return future.result()
        write = prepare()
        with self.database.writing_connection() as connection:
            written = write(connection)
            if guard is not None:
                guard()
            return written

    async def set_async(
        self,
        user_id: str,
        key: str,
        value: str,
        source: Source = "manual",
        *,
        conversation_id: str | None = None,
    ) -> Written:
        """`set` for the event loop: awaits the writer thread (group commit) instead of
        holding a worker thread, or runs `set` in one when there is no writer thread."""
        prepare = self._set_write(user_id, key, value, source, conversation_id)
        future = self._group.submit(prepare) if self._group else None
        if future is None:
            return await anyio.to_thread.run_sync(
                functools.partial(
                    self.set, user_id, key, value, source, conversation_id=conversation_id
                )
            )
        # Shielded: once queued the write is made even if the caller goes away, as a
        # write already running in a worker thread is.
        return await asyncio.shield(asyncio.wrap_future(future))

    def start_group_commit(self, on_batch: Callable[[int], None] | None = None) -> None:
        """On SQLite, start the writer thread through which `set`s without a guard share
        transactions (`kvmem.group_commit`); elsewhere nothing (each write commits alone).
        `on_batch` is told the number of writes of each batch the thread runs."""
        if self.database.dialect == "sqlite" and self._group is None:
            group = GroupCommit(self.database, on_batch=on_batch)
            group.start()
            self._group = group

    @property
    def queued_writes(self) -> int:
        """Writes waiting for the writer thread to take them (0 when there is none)."""
        group = self._group
        return group.pending if group is not None else 0

    def stop_group_commit(self) -> None:
        """Answer every queued write and stop the writer thread; `set` then runs directly."""
        group = self._group
        if group is not None:
            group.stop()
            self._group = None

    def _set_write(
        self,
        user_id: str,
        key: str,
        value: str,
        source: Source,
        conversation_id: str | None,
        since: datetime | None = None,
    ) -> Prepare:
        """`set` in two steps: checking and counting the value (no transaction), then
        writing it on a connection whose transaction the caller owns."""

        def prepare() -> Callable[[Connection], Written]:
            self.rules.check_key(key)
            clean = self.rules.clean_value(value)
            tokens = self.tokens.count(clean)

            def write(connection: Connection) -> Written:
                self.database.lock_user(connection, user_id)
                if since is not None:
                    check_not_erased(connection, user_id, since)
                return self._set_locked(
                    connection, user_id, key, clean, tokens, source, conversation_id
                )

            return write

        return prepare

    def delete(
        self,
        user_id: str,
        key: str,
        source: Source = "manual",
        *,
        conversation_id: str | None = None,
        guard: Callable[[], None] | None = None,
        since: datetime | None = None,
    ) -> Entry:
        """Remove the entry at `key` and return it, or `NotFound`; the rest as for `set`."""
        self.rules.check_key_format(key)
        with self.database.writing() as session:
            # Every write takes the user's lock first: one lock order for all writers.
            self.database.lock_user(session, user_id)
            if since is not None:
                check_not_erased(session.connection(), user_id, since)
            row = _find(session, user_id, key)
            if row is None:
                raise NotFound(f"no memory with key {key!r}")
            entry, _ = self._delete_locked(session, user_id, row, source, conversation_id)
            if guard is not None:
                guard()
            return entry

    def clear(self, user_id: str) -> int:
        """Remove all of the user's entries, their history and the agent's pending proposals;
        the number of entries removed."""
        with self.database.writing() as session:
            self.database.lock_user(session, user_id)
            result = session.execute(delete(MemoryEntry).where(MemoryEntry.user_id == user_id))
            self.history_log.clear(session, user_id)
            session.execute(delete(MemoryProposal).where(MemoryProposal.user_id == user_id))
            session.execute(_BUMP, {"user_id": user_id})
            return rowcount(result)

    def write_locked(
        self,
        session: Session,
        user_id: str,
        key: str,
        value: str | None,
        source: Source,
        *,
        conversation_id: str | None = None,
    ) -> tuple[Entry | None, int]:
        """Set `key` to `value` (or delete it when `value` is None) under every write rule,
        inside the caller's transaction, which already holds the user's lock: for a caller
        that changes another table in the same transaction (accepting a proposal). The entry
        now (None once deleted; a delete of a missing key changes nothing) and the total."""
        if value is not None:
            self.rules.check_key(key)
            clean = self.rules.clean_value(value)
            written = self._set_locked(
                session.connection(), user_id, key, clean, self.tokens.count(clean), source,
                conversation_id,
            )
            return written.entry, written.total_tokens
        self.rules.check_key_format(key)
        row = _find(session, user_id, key)
        if row is not None:
            self._delete_locked(session, user_id, row, source, conversation_id)
        return None, _total(session, user_id)

    def _set_locked(
        self,
        connection: Connection,
        user_id: str,
        key: str,
        value: str,
        tokens: int,
        source: Source,
        conversation_id: str | None,
    ) -> Written:
        """`set` inside a transaction that holds the user's lock (the value already clean)."""
        row = connection.execute(_ROW, {"user_id": user_id, "key": key}).first()
        total = connection.execute(_TOTAL, {"user_id": user_id}).scalar_one()
        if row is not None and row.value == value:
            return Written(entry=Entry(*row[1:]), created=False, total_tokens=total)
        replaced = row.token_count if row else 0
        self._check_limit(total, tokens, replaced=replaced)
        now = utcnow()
        if row is None:
            entry = Entry(key, value, tokens, source, now, now)
            connection.execute(_INSERT_ENTRY, {
                "user_id": user_id, "key": key, "value": value, "token_count": tokens,
                "source": source, "created_at": now, "updated_at": now,
            })
        else:
            entry = Entry(key, value, tokens, source, row.created_at, now)
            connection.execute(_REPLACE_ENTRY, {
                "entry_id": row.id, "value": value, "token_count": tokens, "source": source,
                "updated_at": now,
            })
        change_id = self._record(
            connection, user_id, key, "set", row.value if row else None, value, source,
            conversation_id,
        )
        connection.execute(_BUMP, {"user_id": user_id})
        return Written(
            entry=entry,
            created=row is None,
            total_tokens=total - replaced + tokens,
            change_id=change_id,
        )

    def _delete_locked(
        self,
        session: Session,
        user_id: str,
        row: MemoryEntry,
        source: Source,
        conversation_id: str | None,
    ) -> tuple[Entry, int | None]:
        """`delete` inside a transaction that holds the user's lock; the entry and change id."""
        entry = _entry(row)
        session.delete(row)
        change_id = self._record(
            session.connection(), user_id, row.key, "delete", row.value, None, source,
            conversation_id,
        )
        session.execute(_BUMP, {"user_id": user_id})
        session.flush()
        return entry, change_id

    def _record(
        self,
        connection: Connection,
        user_id: str,
        key: str,
        op: Literal["set", "delete"],
        old_value: str | None,
        new_value: str | None,
        source: Source,
        conversation_id: str | None,
    ) -> int | None:
        """Record a change and drop the user's expired ones, in the write's transaction."""
        self.history_log.prune(connection, user_id)
        return self.history_log.record(
            connection, user_id, key, op, old_value, new_value, source, conversation_id
        )

    def import_document(
        self,
        user_id: str,
        items: Iterable[tuple[str, str]],
        *,
        mode: ImportMode = "merge",
    ) -> Imported:
        """Write many entries at once, all or none, with source `import`.

        Every entry is checked against every rule, and the resulting total against
        `tokenLimit`, before anything is written; the error names the offending `key` in its
        details. A key twice in one document is refused. `merge` keeps the user's other
        entries; `replace` deletes them (each delete recorded).
        """
        counted: dict[str, tuple[str, int]] = {}
        for index, (key, value) in enumerate(items):
            try:
                self.rules.check_key(key)
                if key in counted:
                    raise BadRequest(f"the key {key!r} appears more than once in the document")
                value = self.rules.clean_value(value)
            except KvmemError as exc:
                # Name the entry, so that a person can find it in a file of thousands.
                exc.message = f"memories[{index}] (key {key!r}): {exc.message}"
                exc.details["key"] = key
                raise
            counted[key] = (value, self.tokens.count(value))
        with self.database.writing() as session:
            self.database.lock_user(session, user_id)
            existing = {
                row.key: row
                for row in session.scalars(
                    select(MemoryEntry).where(MemoryEntry.user_id == user_id)
                )
            }
            dropped = [row for key, row in existing.items() if key not in counted]
            self._check_import_limit(existing, dropped if mode == "replace" else [], counted)
            changes: list[dict[str, Any]] = []
            for gone in dropped if mode == "replace" else []:
                changes.append(_change(gone.key, "delete", gone.value, None))
                session.delete(gone)
            for key, (value, tokens) in counted.items():
                row = existing.get(key)
                if row is not None and row.value == value:
                    continue
                changes.append(_change(key, "set", row.value if row else None, value))
                _upsert(session, row, user_id, key, value, tokens, "import")
            if changes:
                self.history_log.prune(session, user_id)
                self.history_log.record_many(session, user_id, changes)
                session.execute(_BUMP, {"user_id": user_id})
            session.flush()
            total = _total(session, user_id)
        return Imported(
            imported=len(counted),
            deleted=len(dropped) if mode == "replace" else 0,
            total_tokens=total,
        )

    def _check_import_limit(
        self,
        existing: dict[str, MemoryEntry],
        dropped: list[MemoryEntry],
        counted: dict[str, tuple[str, int]],
    ) -> None:
        limit = self.rules.token_limit
        if limit is None:
            return
        total = sum(row.token_count for row in existing.values())
        gone = {row.key for row in dropped}
        # What stays of the user's entries, then each imported one in document order: the
        # entry that takes the sum over the limit is the one the error names.
        running = sum(
            row.token_count for key, row in existing.items() if key not in counted and key not in gone
        )
        requested = sum(tokens for _, tokens in counted.values())
        for key, (_, tokens) in counted.items():
            running += tokens
            if running > limit:
                raise MemoryFull(
                    f"importing {requested} tokens would take memory over the limit of "
                    f"{limit} tokens (passed at key {key!r})",
                    token_limit=limit,
                    total_tokens=total,
                    requested_tokens=requested,
                    key=key,
                )

    def history(
        self,
        user_id: str,
        key: str | None = None,
        limit: int = 50,
        before: int | None = None,
    ) -> HistoryPage:
        """The user's changes (of one key, if given) newest first, paged by id."""
        if key is not None:
            self.rules.check_key_format(key)
        with self.database.reading() as session:
            return self.history_log.page(session, user_id, key=key, limit=limit, before=before)

    def key_history(self, user_id: str, key: str) -> tuple[Change, ...]:
        """Every kept change of `key`, newest first (also after a delete); `NotFound` when
        the key has neither an entry nor a change."""
        self.rules.check_key_format(key)
        with self.database.reading() as session:
            changes = self.history_log.of_key(session, user_id, key)
            if not changes and _find(session, user_id, key) is None:
                raise NotFound(f"no memory and no history with key {key!r}")
            return changes

    def key_history_page(
        self, user_id: str, key: str, limit: int = 50, before: int | None = None
    ) -> HistoryPage:
        """`key_history` a page at a time (newest first, paged by id as `history`);
        `NotFound` when the key has neither an entry nor a kept change."""
        self.rules.check_key_format(key)
        with self.database.reading() as session:
            page = self.history_log.page(session, user_id, key=key, limit=limit, before=before)
            if page.changes:
                return page
            if before is not None and self.history_log.page(
                session, user_id, key=key, limit=1
            ).changes:
                return page  # past the last page of a key that has changes
            if _find(session, user_id, key) is None:
                raise NotFound(f"no memory and no history with key {key!r}")
            return page

    def revert(
        self,
        user_id: str,
        key: str,
        change_id: int,
        *,
        conversation_id: str | None = None,
    ) -> Reverted:
        """Set `key` back to its value right after change `change_id` (deleted, if that
        change was a delete), as a write with source `revert` under every write rule.

        `NotFound` when the change is not this user's, not this key's, or no longer kept.
        """
        self.rules.check_key_format(key)
        with self.database.writing() as session:
            self.database.lock_user(session, user_id)
            target = self.history_log.find(session, user_id, key, change_id)
            if target is None:
                raise NotFound(f"no change {change_id} of key {key!r}")
            if target.new_value is not None:
                self.rules.check_key(key)
                value = self.rules.clean_value(target.new_value)
                written = self._set_locked(
                    session.connection(), user_id, key, value, self.tokens.count(value),
                    "revert", conversation_id,
                )
                return Reverted(written.entry, written.total_tokens, written.change_id)
            row = _find(session, user_id, key)
            recorded = None
            if row is not None:
                _, recorded = self._delete_locked(session, user_id, row, "revert", conversation_id)
            return Reverted(None, _total(session, user_id), recorded)

    def prune_expired_history(self, batch: int = SWEEP_BATCH) -> int:
        """Delete every user's changes older than `keep_days`, `batch` per transaction; how
        many (`prune_expired_batch` until none is left)."""
        total = 0
        while True:
            deleted = self.prune_expired_batch(batch)
            total += deleted
            if deleted < batch:
                return total

    def prune_expired_batch(self, batch: int = SWEEP_BATCH) -> int:
        """Delete up to `batch` changes older than `keep_days`, of any user, in one short
        transaction that a request's write never waits behind (on SQLite it starts only when
        no other write is waiting); how many. The one query not scoped by user: it is
        maintenance, and reads nothing back."""
        with self.database.writing(background=True) as session:
            deleted = self.history_log.prune_all(session, batch)
        if deleted:
            self.database.checkpoint()
        return deleted

    def clear_history(self, user_id: str) -> int:
        """Erase the user's change history (entries stay); how many changes were erased."""
        with self.database.writing() as session:
            self.database.lock_user(session, user_id)
            return self.history_log.clear(session, user_id)

    def erase_user(self, user_id: str) -> Erased:
        """Delete every row kvmem holds for the user, from every table, in one transaction
        that also fences the user (see `kvmem.erasure`); on SQLite the deleted text is then
        gone from the database files too (`secure_delete`, and the WAL checkpointed)."""
        with self.database.writing() as session:
            self.database.lock_user(session, user_id)
            erased = erase_user_rows(session, user_id)
            # Taken last: work that began while the rows were being deleted is fenced too.
            fence_user(session, user_id, utcnow())
        if not self.database.truncate_wal():
            log.warning("erased user %s; the WAL could not be emptied now (readers kept it "
                        "busy): the next checkpoint does it", user_id)
        return erased

    def memories_enabled(self, user_id: str) -> bool:
        """The user's opt-out switch (true unless they turned memory off)."""
        with self.database.reading() as session:
            enabled = session.scalar(select(User.memories_enabled).where(User.id == user_id))
        return True if enabled is None else enabled

    def set_memories_enabled(self, user_id: str, enabled: bool) -> bool:
        """Turn memory on or off for the user's chats."""
        with self.database.writing() as session:
            self.database.lock_user(session, user_id)
            session.execute(
                update(User).where(User.id == user_id).values(memories_enabled=enabled)
            )
        return enabled

    def _check_limit(self, total: int, requested: int, *, replaced: int) -> None:
        limit = self.rules.token_limit
        if limit is not None and total - replaced + requested > limit:
            raise MemoryFull(
                f"storing {requested} tokens would take memory to {total - replaced + requested} "
                f"tokens, over the limit of {limit}",
                token_limit=limit,
                total_tokens=total,
                requested_tokens=requested,
            )


def _upsert(
    session: Session,
    row: MemoryEntry | None,
    user_id: str,
    key: str,
    value: str,
    tokens: int,
    source: Source,
) -> tuple[MemoryEntry, bool]:
    """Replace `row` (or add a new one) with the value; the row and whether it is new."""
    now = utcnow()
    if row is not None:
        row.value, row.token_count, row.source, row.updated_at = value, tokens, source, now
        return row, False
    row = MemoryEntry(
        user_id=user_id,
        key=key,
        value=value,
        token_count=tokens,
        source=source,
        created_at=now,
        updated_at=now,
    )
    session.add(row)
    return row, True


def _change(key: str, op: str, old_value: str | None, new_value: str | None) -> dict[str, Any]:
    return {"key": key, "op": op, "old_value": old_value, "new_value": new_value, "source": "import"}


def _find(session: Session, user_id: str, key: str) -> MemoryEntry | None:
    return session.scalar(
        select(MemoryEntry).where(MemoryEntry.user_id == user_id, MemoryEntry.key == key)
    )


def _total(session: Session, user_id: str) -> int:
    return session.execute(
        select(func.coalesce(func.sum(MemoryEntry.token_count), 0)).where(
            MemoryEntry.user_id == user_id
        )
    ).scalar_one()


def _entry(row: MemoryEntry) -> Entry:
    return Entry(
        key=row.key,
        value=row.value,
        token_count=row.token_count,
        source=row.source,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )
