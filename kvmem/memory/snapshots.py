"""Reading users' memory: the snapshot on every chat request's path and its cache, single
entries, and the change history.

`MemoryReader` is the read half of `kvmem.memory.store.MemoryStore` (which adds the writes). The
snapshot is read through one small row, the user's memory version, that tells whether the
entries read before are still current (`EntryCache`); on SQLite both statements run straight
on the pooled sqlite3 connection (`Database.reading_cursor`). Every query is scoped by
`user_id`; callers get frozen dataclasses. It writes nothing.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, case, func, select
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import Session

from kvmem.db.engine import Database
from kvmem.db.tables import MemoryEntry, User
from kvmem.entries import Entry, Snapshot, utcnow
from kvmem.errors import NotFound, StoreUnavailable
from kvmem.memory.history import Change, ChangeLog, HistoryPage
from kvmem.memory.rules import MemoryRules
from kvmem.memory.write_statements import LIVE

log = logging.getLogger("kvmem.store")

_SNAPSHOT = (
    select(
        MemoryEntry.key,
        MemoryEntry.value,
        MemoryEntry.token_count,
        MemoryEntry.source,
        MemoryEntry.created_at,
        MemoryEntry.updated_at,
        MemoryEntry.expires_at,
        MemoryEntry.expired,
        MemoryEntry.scope,
    )
    # An unscoped turn's read: the person's own layer ("scope" is ""), in order off
    # `ix_memory_entries_user_scope_updated`, no other layer's rows.
    .where(MemoryEntry.user_id == bindparam("user_id"), MemoryEntry.scope == bindparam("scope"))
    .order_by(MemoryEntry.updated_at, MemoryEntry.id)
)
# A scoped turn's read: the own layer ("own" is "") and the scope's, in one statement (two
# ranges of the same index, sorted together).
_SNAPSHOT_SCOPED = (
    select(*_SNAPSHOT.selected_columns)
    .where(
        MemoryEntry.user_id == bindparam("user_id"),
        MemoryEntry.scope.in_([bindparam("own"), bindparam("scope")]),
    )
    .order_by(MemoryEntry.updated_at, MemoryEntry.id)
)
# Every layer of the user (an export of everything), by scope: not on a chat's path, not cached.
_ALL_LAYERS = (
    select(*_SNAPSHOT.selected_columns)
    .where(MemoryEntry.user_id == bindparam("user_id"))
    .order_by(MemoryEntry.scope, MemoryEntry.updated_at, MemoryEntry.id)
)
# The user's scopes that hold memory now, with their entries and tokens (liveness summed over,
# not filtered on: see `write_statements.TOTAL`).
_SCOPES = (
    select(
        MemoryEntry.scope,
        func.sum(case((LIVE, 1), else_=0)),
        func.sum(case((LIVE, MemoryEntry.token_count), else_=0)),
    )
    .where(MemoryEntry.user_id == bindparam("user_id"), MemoryEntry.scope != "")
    .group_by(MemoryEntry.scope)
    .having(func.sum(case((LIVE, 1), else_=0)) > 0)
    .order_by(MemoryEntry.scope)
)
_USER_STATE = select(User.memories_enabled, User.memory_version, User.created_at).where(
    User.id == bindparam("user_id")
)
# The entry at one key, with its row id (the writes use it too): `Entry(*row[1:])`.
ENTRY_AT_KEY = select(
    MemoryEntry.id,
    MemoryEntry.key,
    MemoryEntry.value,
    MemoryEntry.token_count,
    MemoryEntry.source,
    MemoryEntry.created_at,
    MemoryEntry.updated_at,
    MemoryEntry.expires_at,
    MemoryEntry.expired,
    MemoryEntry.scope,
).where(
    MemoryEntry.user_id == bindparam("user_id"),
    MemoryEntry.scope == bindparam("scope"),
    MemoryEntry.key == bindparam("key"),
)
_MEMORIES_ENABLED = select(User.memories_enabled).where(User.id == bindparam("user_id"))


@functools.cache
def _sqlite_reads(
    dialect: Dialect,
) -> tuple[str, str, str, list[Callable[[Any], Any] | None]]:
    """`snapshot`'s statements compiled for SQLite (the user's version; the own layer's
    entries; the own layer's and a scope's), and what SQLAlchemy would make of each column of
    the entries (text to datetime, say): built once per engine, not per store."""
    return (
        str(_USER_STATE.compile(dialect=dialect)),
        str(_SNAPSHOT.compile(dialect=dialect)),
        str(_SNAPSHOT_SCOPED.compile(dialect=dialect)),
        [
            column.type.dialect_impl(dialect).result_processor(dialect, None)
            for column in _SNAPSHOT.selected_columns
        ],
    )


# A user row's memory version, with its creation time: a user erased and seen again starts
# at version 0 anew, so the version alone could match entries cached before the erasure.
# (On SQLite the creation time is the stored text: it is only compared.)
Version = tuple[datetime | str, int]


@dataclass(frozen=True)
class Loaded:
    """A user's entry rows as read (oldest first), and what expiry needs to know of them."""

    rows: tuple[Entry, ...]  # every row, expired ones too
    live: tuple[Entry, ...]  # the rows not marked expired (`rows` itself when that is all)
    due_at: datetime | None  # the soonest `expires_at` among `live`; None: none expires

    @classmethod
    def of(cls, rows: tuple[Entry, ...]) -> Loaded:
        """`rows` with their live ones and the moment the first of those expires."""
        live = tuple(entry for entry in rows if not entry.expired)
        due = min(
            (entry.expires_at for entry in live if entry.expires_at is not None), default=None
        )
        return cls(rows, rows if len(live) == len(rows) else live, due)

    def entries_at(self, now: datetime) -> tuple[Entry, ...]:
        """The entries that are memory at `now`: `live` itself unless one is due."""
        if self.due_at is None or now < self.due_at:
            return self.live
        return tuple(entry for entry in self.live if entry.live(now))


_NOTHING = Loaded((), (), None)


# Whose entries a read is of: the user, and the scope read beside their own ("" for none).
Reader = tuple[str, str]


class EntryCache:
    """The last entries read per user (and scope), tagged with the user's memory version
    (bounded LRU)."""

    def __init__(self, size: int = 1024) -> None:
        self.size = size
        self._items: OrderedDict[Reader, tuple[Version, Loaded]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, reader: Reader, version: Version) -> Loaded | None:
        """The cached entries if they were read at `version`."""
        with self._lock:
            item = self._items.get(reader)
            if item is None or item[0] != version:
                return None
            self._items.move_to_end(reader)
            return item[1]

    def put(self, reader: Reader, version: Version, entries: Loaded) -> None:
        """Remember the entries read at `version`."""
        with self._lock:
            self._items[reader] = (version, entries)
            self._items.move_to_end(reader)
            while len(self._items) > self.size:
                self._items.popitem(last=False)


class MemoryReader:
    """Reads users' memory entries and history (the read half of `MemoryStore`)."""

    def __init__(
        self,
        database: Database,
        rules: MemoryRules,
        history_log: ChangeLog,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.database = database
        self.rules = rules
        self.history_log = history_log
        # What "now" is for expiry (`kvmem eval` pins it for a scenario's "now").
        self.clock = clock
        self._cache = EntryCache()
        if database.dialect == "sqlite":
            self._sqlite_reads = _sqlite_reads(database.engine.dialect)

    def snapshot(self, user_id: str, scope: str = "") -> Snapshot:
        """The user's entries that are memory now, oldest first, and whether they want memory
        used: their own and, given a `scope`, that scope's (each `Entry` says which). An entry
        found due to expire is expired first (`expire_due`)."""
        loaded, enabled = self._settled(user_id, scope)
        return Snapshot(entries=loaded.entries_at(self.clock()), memories_enabled=enabled)

    def entries_with_expired(self, user_id: str, scope: str = "") -> tuple[Entry, ...]:
        """Every entry row of one layer of the user (`scope`; "" their own), expired ones
        too, oldest first."""
        rows = self._settled(user_id, scope)[0].rows
        return rows if scope == "" else tuple(row for row in rows if row.scope == scope)

    def layer(self, user_id: str, scope: str = "") -> Snapshot:
        """`snapshot` of one layer only: the user's own entries (`scope` ""), or the scope's."""
        snapshot = self.snapshot(user_id, scope)
        if scope == "":
            return snapshot
        entries = tuple(entry for entry in snapshot.entries if entry.scope == scope)
        return Snapshot(entries=entries, memories_enabled=snapshot.memories_enabled)

    def every_layer(self, user_id: str) -> Snapshot:
        """The user's entries that are memory now in every layer: their own, then each scope
        by name, each oldest first (an export of everything)."""
        enabled = self.snapshot(user_id).memories_enabled  # expires what is due first
        now = self.clock()
        with self.database.reading() as session:
            rows = session.execute(_ALL_LAYERS, {"user_id": user_id}).all()
        entries = tuple(entry for entry in (Entry(*row) for row in rows) if entry.live(now))
        return Snapshot(entries=entries, memories_enabled=enabled)

    def scopes(self, user_id: str) -> list[tuple[str, int, int]]:
        """The user's scopes that hold memory now, by name: (scope, entries, tokens)."""
        self.settle(user_id)
        with self.database.reading() as session:
            rows = session.execute(_SCOPES, {"user_id": user_id, "now": self.clock()}).all()
        return [(scope, count, int(tokens or 0)) for scope, count, tokens in rows]

    def settle(self, user_id: str, scope: str = "") -> None:
        """Expire the user's entries whose time has come (seen in their own layer and, given
        a `scope`, that scope's: the read is `snapshot`'s, cached), so that what a route reads
        next (history above all) shows it."""
        self._settled(user_id, scope)

    def expire_due(self, user_id: str, now: datetime) -> int:
        """Expire the user's entries due at `now`: a write, which `MemoryStore` makes; a
        reader alone only leaves them out of what it answers."""
        return 0

    def _settled(self, user_id: str, scope: str) -> tuple[Loaded, bool]:
        loaded, enabled = self._loaded(user_id, scope)
        # One comparison on every chat request; a write only when an entry's time has come.
        due = loaded.due_at is not None and loaded.due_at <= self.clock()
        if not due:
            return loaded, enabled
        try:
            expired = self.expire_due(user_id, self.clock())
        except StoreUnavailable as exc:
            # The writer is out of reach (the read went through): answer without the due
            # entries all the same (`Loaded.entries_at`); the next read or the sweep marks them.
            log.warning("could not expire the due entries of %s now: %s", user_id, exc)
            return loaded, enabled
        return self._loaded(user_id, scope) if expired else (loaded, enabled)

    def _loaded(self, user_id: str, scope: str) -> tuple[Loaded, bool]:
        """The user's entry rows (their own and `scope`'s) and opt-out switch."""
        # This read is on every chat request's path: one small row tells whether the entries
        # read before are still current; only when they are not are they read again (as
        # plain column rows, not ORM objects).
        if self.database.dialect == "sqlite":
            return self._sqlite_loaded(user_id, scope)
        with self.database.reading() as session:
            connection = session.connection()
            user = connection.execute(_USER_STATE, {"user_id": user_id}).first()
            if user is None:  # no row, no entries (they reference it)
                return _NOTHING, True
            version = (user.created_at, user.memory_version)
            loaded = self._cache.get((user_id, scope), version)
            if loaded is None:
                read = _SNAPSHOT_SCOPED if scope else _SNAPSHOT
                rows = connection.execute(
                    read, {"user_id": user_id, "own": "", "scope": scope}
                ).all()
                loaded = Loaded.of(tuple(Entry(*row) for row in rows))
                self._cache.put((user_id, scope), version, loaded)
        return loaded, user.memories_enabled

    def _sqlite_loaded(self, user_id: str, scope: str) -> tuple[Loaded, bool]:
        """`_loaded` on SQLite's own connection (see `Database.reading_cursor`)."""
        user_state, snapshot, scoped, processors = self._sqlite_reads
        with self.database.reading_cursor() as cursor:
            user = cursor.execute(user_state, (user_id,)).fetchone()
            if user is None:
                return _NOTHING, True
            memories_enabled, memory_version, created_at = user
            version = (created_at, memory_version)
            loaded = self._cache.get((user_id, scope), version)
            if loaded is None:
                read = (scoped, (user_id, "", scope)) if scope else (snapshot, (user_id, ""))
                entries = tuple(
                    Entry(
                        *(
                            process(value) if process else value
                            for process, value in zip(processors, row, strict=True)
                        )
                    )
                    for row in cursor.execute(*read).fetchall()
                )
                loaded = Loaded.of(entries)
                self._cache.put((user_id, scope), version, loaded)
        return loaded, bool(memories_enabled)

    def get(self, user_id: str, key: str, scope: str = "") -> Entry:
        """The entry at `key` (of `scope`; "" the user's own), or `NotFound` (also once it
        expired)."""
        self.rules.check_key_format(key)
        self.settle(user_id, scope)
        with self.database.reading() as session:
            row = session.execute(
                ENTRY_AT_KEY, {"user_id": user_id, "scope": scope, "key": key}
            ).first()
        entry = Entry(*row[1:10]) if row is not None else None
        if entry is None or not entry.live(self.clock()):
            raise NotFound(f"no memory with key {key!r}")
        return entry

    def memories_enabled(self, user_id: str) -> bool:
        """The user's opt-out switch (true unless they turned memory off)."""
        with self.database.reading() as session:
            enabled = session.scalar(_MEMORIES_ENABLED, {"user_id": user_id})
        return True if enabled is None else enabled

    def history(
        self,
        user_id: str,
        key: str | None = None,
        limit: int = 50,
        before: int | None = None,
        scope: str = "",
    ) -> HistoryPage:
        """The changes of one layer of the user (of one key, if given) newest first, paged
        by id."""
        if key is not None:
            self.rules.check_key_format(key)
        self.settle(user_id, scope)
        with self.database.reading() as session:
            return self.history_log.page(
                session, user_id, key=key, limit=limit, before=before, scope=scope
            )

    def key_history(self, user_id: str, key: str, scope: str = "") -> tuple[Change, ...]:
        """Every kept change of `key`, newest first (also after a delete); `NotFound` when
        the key has neither an entry nor a change."""
        self.rules.check_key_format(key)
        self.settle(user_id, scope)
        with self.database.reading() as session:
            changes = self.history_log.of_key(session, user_id, key, scope)
            if not changes and not self._has_entry(session, user_id, key, scope):
                raise NotFound(f"no memory and no history with key {key!r}")
            return changes

    def key_history_page(
        self,
        user_id: str,
        key: str,
        limit: int = 50,
        before: int | None = None,
        scope: str = "",
    ) -> HistoryPage:
        """`key_history` a page at a time (newest first, paged by id as `history`);
        `NotFound` when the key has neither an entry nor a kept change."""
        self.rules.check_key_format(key)
        self.settle(user_id, scope)
        with self.database.reading() as session:
            page = self.history_log.page(
                session, user_id, key=key, limit=limit, before=before, scope=scope
            )
            if page.changes:
                return page
            if (
                before is not None
                and self.history_log.page(session, user_id, key=key, limit=1, scope=scope).changes
            ):
                return page  # past the last page of a key that has changes
            if not self._has_entry(session, user_id, key, scope):
                raise NotFound(f"no memory and no history with key {key!r}")
            return page

    @staticmethod
    def _has_entry(session: Session, user_id: str, key: str, scope: str) -> bool:
        at_key = {"user_id": user_id, "scope": scope, "key": key}
        return session.execute(ENTRY_AT_KEY, at_key).first() is not None
