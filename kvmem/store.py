"""The memory store: each user's key/value entries and opt-out switch.

Every write applies `MemoryRules` and checks `tokenLimit` inside one transaction that holds
the user's write lock, so the limit holds under any concurrency. Every query is scoped by
`user_id`; callers get frozen dataclasses, never a session.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import bindparam, delete, func, select, update
from sqlalchemy.orm import Session

from kvmem.db import Database
from kvmem.errors import MemoryFull, NotFound
from kvmem.rules import MemoryRules
from kvmem.tables import MemoryEntry, User, utcnow
from kvmem.tokens import TokenCounter

Source = Literal["manual", "agent", "import"]


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


_USER_STATE = select(User.memories_enabled, User.memory_version).where(
    User.id == bindparam("user_id")
)
_BUMP = (
    update(User)
    .where(User.id == bindparam("user_id"))
    .values(memory_version=User.memory_version + 1)
)


class EntryCache:
    """The last entries read per user, tagged with the user's memory version (bounded LRU)."""

    def __init__(self, size: int = 1024) -> None:
        self.size = size
        self._items: OrderedDict[str, tuple[int, tuple[Entry, ...]]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, user_id: str, version: int) -> tuple[Entry, ...] | None:
        """The cached entries if they were read at `version`."""
        with self._lock:
            item = self._items.get(user_id)
            if item is None or item[0] != version:
                return None
            self._items.move_to_end(user_id)
            return item[1]

    def put(self, user_id: str, version: int, entries: tuple[Entry, ...]) -> None:
        """Remember the entries read at `version`."""
        with self._lock:
            self._items[user_id] = (version, entries)
            self._items.move_to_end(user_id)
            while len(self._items) > self.size:
                self._items.popitem(last=False)


def iso(moment: datetime) -> str:
    """`moment` as ISO 8601 in UTC with a `Z` suffix."""
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class MemoryStore:
    """Reads and writes users' memory entries under the configured rules."""

    def __init__(self, database: Database, rules: MemoryRules, tokens: TokenCounter) -> None:
        self.database = database
        self.rules = rules
        self.tokens = tokens
        self._cache = EntryCache()

    def snapshot(self, user_id: str) -> Snapshot:
        """The user's entries, oldest first, and whether they want memory used."""
        # This read is on every chat request's path: one small row tells whether the entries
        # read before are still current; only when they are not are they read again (as
        # plain column rows, not ORM objects).
        with self.database.reading() as session:
            connection = session.connection()
            user = connection.execute(_USER_STATE, {"user_id": user_id}).first()
            if user is None:  # no row, no entries (they reference it)
                return Snapshot(entries=(), memories_enabled=True)
            entries = self._cache.get(user_id, user.memory_version)
            if entries is None:
                rows = connection.execute(_SNAPSHOT, {"user_id": user_id}).all()
                entries = tuple(Entry(*row) for row in rows)
                self._cache.put(user_id, user.memory_version, entries)
        return Snapshot(entries=entries, memories_enabled=user.memories_enabled)

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
        guard: Callable[[], None] | None = None,
    ) -> Written:
        """Create or replace the entry at `key`; `MemoryFull` if it would pass `tokenLimit`.

        `guard` runs just before the commit; if it raises, nothing is written (the memory
        agent uses it so that no write lands after its deadline).
        """
        self.rules.check_key(key)
        value = self.rules.clean_value(value)
        tokens = self.tokens.count(value)
        with self.database.writing() as session:
            self.database.lock_user(session, user_id)
            row = _find(session, user_id, key)
            total = _total(session, user_id)
            replaced = row.token_count if row else 0
            self._check_limit(total, tokens, replaced=replaced)
            row, created = _upsert(session, row, user_id, key, value, tokens, source)
            new_total = total - replaced + tokens
            session.execute(_BUMP, {"user_id": user_id})
            session.flush()
            if guard is not None:
                guard()
            return Written(entry=_entry(row), created=created, total_tokens=new_total)

    def delete(
        self, user_id: str, key: str, *, guard: Callable[[], None] | None = None
    ) -> Entry:
        """Remove the entry at `key` and return it, or `NotFound`; `guard` as for `set`."""
        self.rules.check_key_format(key)
        with self.database.writing() as session:
            # Every write takes the user's lock first: one lock order for all writers.
            self.database.lock_user(session, user_id)
            row = _find(session, user_id, key)
            if row is None:
                raise NotFound(f"no memory with key {key!r}")
            entry = _entry(row)
            session.delete(row)
            session.execute(_BUMP, {"user_id": user_id})
            session.flush()
            if guard is not None:
                guard()
            return entry

    def clear(self, user_id: str) -> int:
        """Remove all of the user's entries; the number removed."""
        with self.database.writing() as session:
            self.database.lock_user(session, user_id)
            result = session.execute(delete(MemoryEntry).where(MemoryEntry.user_id == user_id))
            session.execute(_BUMP, {"user_id": user_id})
            return result.rowcount

    def import_entries(
        self, user_id: str, items: Iterable[tuple[str, str]], *, replace: bool = False
    ) -> int:
        """Write many entries at once, all or none; with `replace`, drop the others first."""
        cleaned: dict[str, str] = {}
        for key, value in items:
            cleaned[self.rules.check_key(key)] = self.rules.clean_value(value)
        counted = {key: (value, self.tokens.count(value)) for key, value in cleaned.items()}
        with self.database.writing() as session:
            self.database.lock_user(session, user_id)
            if replace:
                session.execute(delete(MemoryEntry).where(MemoryEntry.user_id == user_id))
            existing = {
                row.key: row
                for row in session.scalars(
                    select(MemoryEntry).where(MemoryEntry.user_id == user_id)
                )
            }
            total = sum(row.token_count for row in existing.values())
            replaced = sum(existing[k].token_count for k in counted if k in existing)
            self._check_limit(total, sum(t for _, t in counted.values()), replaced=replaced)
            for key, (value, tokens) in counted.items():
                _upsert(session, existing.get(key), user_id, key, value, tokens, "import")
            session.execute(_BUMP, {"user_id": user_id})
        return len(counted)

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


def _find(session: Session, user_id: str, key: str) -> MemoryEntry | None:
    return session.scalar(
        select(MemoryEntry).where(MemoryEntry.user_id == user_id, MemoryEntry.key == key)
    )


def _total(session: Session, user_id: str) -> int:
    return session.scalar(
        select(func.coalesce(func.sum(MemoryEntry.token_count), 0)).where(
            MemoryEntry.user_id == user_id
        )
    )


def _entry(row: MemoryEntry) -> Entry:
    return Entry(
        key=row.key,
        value=row.value,
        token_count=row.token_count,
        source=row.source,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )
