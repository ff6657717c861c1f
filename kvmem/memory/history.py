"""The change log of memory entries (`memory_changes`): recording, retention and reading.

`ChangeLog` works inside a session (or connection) that `MemoryStore` opened, so a change is recorded in the
same transaction as the write it describes and the two commit or roll back together. It
knows nothing of HTTP. Every query is scoped by user.

Retention: with `keep_days` N, a change older than N days is never shown, and the user's
expired changes are deleted in their next write transaction. One indexed look at the user's
oldest change decides whether there is anything to delete, and tells when there next can be
(that change's time + N days): until then the write path does not look again. Another
process can only add newer changes or delete some, so that moment never comes sooner.
The changes of users who stopped writing are swept by `prune_all`, which the app runs at
start and then hourly. `keep_days: 0` records nothing.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from sqlalchemy import bindparam, delete, insert, select
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from kvmem.db.driver_connection import Executor
from kvmem.db.engine import rowcount
from kvmem.db.tables import MemoryChange
from kvmem.entries import iso, utcnow

Op = Literal["set", "delete", "expire"]
# `system`: kvmem itself, for an entry that expired (`kvmem.memory.expirations`).
ChangeSource = Literal["manual", "agent", "import", "revert", "mcp", "system"]

# The largest id a change can have (PostgreSQL's INTEGER); larger ids name no change.
MAX_CHANGE_ID = 2**31 - 1
# Users whose next prune time is remembered; past this many the memory starts over.
PRUNE_MEMORY_USERS = 100_000
NEVER = datetime.max.replace(tzinfo=UTC)


@dataclass(frozen=True)
class Change:
    """One recorded change to one entry."""

    id: int
    key: str
    op: str
    old_value: str | None
    new_value: str | None
    source: str
    conversation_id: str | None
    at: datetime

    def as_json(self) -> dict[str, Any]:
        """The change as the API shows it."""
        return {
            "id": self.id,
            "key": self.key,
            "op": self.op,
            "old_value": self.old_value,
            "new_value": self.new_value,
            "source": self.source,
            "conversation_id": self.conversation_id,
            "at": iso(self.at),
        }


@dataclass(frozen=True)
class HistoryPage:
    """Changes newest first, and the `before` value of the next page (None on the last)."""

    changes: tuple[Change, ...]
    next: int | None

    def as_json(self) -> dict[str, Any]:
        """The body of `GET /memory/history`."""
        return {"changes": [change.as_json() for change in self.changes], "next": self.next}


_COLUMNS = (
    MemoryChange.id,
    MemoryChange.key,
    MemoryChange.op,
    MemoryChange.old_value,
    MemoryChange.new_value,
    MemoryChange.source,
    MemoryChange.conversation_id,
    MemoryChange.at,
)


_INSERT = insert(MemoryChange)
# `prune`'s statements, built once (every write runs the first when the user's oldest change
# may have expired). Ids grow with time, so the user's first change by id is (about) the oldest.
_OLDEST = (
    select(MemoryChange.at)
    .where(MemoryChange.user_id == bindparam("user_id"))
    .order_by(MemoryChange.id)
    .limit(1)
)
_PRUNE_USER = delete(MemoryChange).where(
    MemoryChange.user_id == bindparam("user_id"), MemoryChange.at < bindparam("cutoff")
)


class ChangeLog:
    """Records, prunes and reads users' changes under one retention period."""

    def __init__(self, keep_days: int = 90) -> None:
        self.keep_days = keep_days
        self._next_prune: dict[str, datetime] = {}  # user: no change of theirs expires before
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        """Whether changes are recorded at all (`keep_days` above 0)."""
        return self.keep_days > 0

    def cutoff(self) -> datetime:
        """Changes at or after this moment are kept; older ones are expired."""
        return utcnow() - timedelta(days=self.keep_days)

    def record(
        self,
        connection: Executor,
        user_id: str,
        key: str,
        op: Op,
        old_value: str | None,
        new_value: str | None,
        source: str,
        conversation_id: str | None,
        at: datetime | None = None,
        scope: str = "",
    ) -> int | None:
        """Record one change to the layer `scope` in the connection's transaction, dated `at`
        (default: now); its id (None when not kept)."""
        if not self.enabled:
            return None
        # One prebuilt statement with bound values: no construct to build and key per write.
        result = connection.execute(
            _INSERT,
            {
                "user_id": user_id,
                "key": key,
                "op": op,
                "old_value": old_value,
                "new_value": new_value,
                "source": source,
                "conversation_id": conversation_id,
                "at": at or utcnow(),
                "scope": scope,
            },
        )
        inserted = result.inserted_primary_key
        assert inserted is not None  # a single-row INSERT always has one
        return inserted[0]

    def record_many(
        self, session: Session | Connection, user_id: str, changes: list[dict[str, Any]]
    ) -> None:
        """Record several changes (`key`, `op`, `old_value`, `new_value`, `source`, and
        `scope` when not the person's own) at once."""
        if not self.enabled or not changes:
            return
        now = utcnow()
        rows = [
            {"conversation_id": None, "scope": "", **change, "user_id": user_id, "at": now}
            for change in changes
        ]
        session.execute(_INSERT, rows)

    def prune(self, session: Session | Executor, user_id: str) -> int:
        """Delete the user's expired changes; how many. Free until one can have expired."""
        now = utcnow()
        with self._lock:
            due = self._next_prune.get(user_id)
        if due is not None and now < due:
            return 0
        cutoff = now - timedelta(days=self.keep_days)
        oldest = session.execute(_OLDEST, {"user_id": user_id}).scalar()
        if oldest is not None and oldest < cutoff:
            result = session.execute(_PRUNE_USER, {"user_id": user_id, "cutoff": cutoff})
            with self._lock:  # the oldest one left is not known: look again next time
                self._next_prune.pop(user_id, None)
            return rowcount(result)
        self._remember(user_id, now, oldest)
        return 0

    def prune_all(self, session: Session, batch: int) -> int:
        """Delete up to `batch` expired changes of any user (the periodic sweep for users who
        stopped writing); how many. On PostgreSQL rows a user's write is pruning right now
        are skipped, not waited for, so the sweep never deadlocks with a write."""
        # The oldest first, read off the index on `at`: each batch costs the same, however
        # many changes are expired or kept (ordering by id would walk the kept ones too).
        expired = (
            select(MemoryChange.id)
            .where(MemoryChange.at < self.cutoff())
            .order_by(MemoryChange.at)
            .limit(batch)
        )
        if session.get_bind().dialect.name == "postgresql":
            expired = expired.with_for_update(skip_locked=True)
        ids = list(session.scalars(expired))
        if not ids:
            return 0
        deleted = session.execute(delete(MemoryChange).where(MemoryChange.id.in_(ids)))
        return rowcount(deleted)

    def _remember(self, user_id: str, now: datetime, oldest: datetime | None) -> None:
        if oldest is not None:
            due = oldest + timedelta(days=self.keep_days)
        elif self.enabled:
            due = now + timedelta(days=self.keep_days)  # the next change is recorded after now
        else:
            due = NEVER  # none left, and none will be recorded
        with self._lock:
            if len(self._next_prune) >= PRUNE_MEMORY_USERS:
                self._next_prune.clear()
            self._next_prune[user_id] = due

    def page(
        self,
        session: Session,
        user_id: str,
        *,
        key: str | None = None,
        limit: int = 50,
        before: int | None = None,
        scope: str = "",
    ) -> HistoryPage:
        """The changes of one layer of the user (of one key, if given) newest first, `limit`
        at a time."""
        query = self._query(user_id, key, scope)
        if before is not None and before <= MAX_CHANGE_ID:  # every id is below a larger one
            query = query.where(MemoryChange.id < before)
        rows = session.execute(query.limit(limit + 1)).all()
        changes = tuple(Change(*row) for row in rows[:limit])
        more = len(rows) > limit
        return HistoryPage(changes=changes, next=changes[-1].id if more else None)

    def of_key(
        self, session: Session, user_id: str, key: str, scope: str = ""
    ) -> tuple[Change, ...]:
        """Every kept change of one key (of the layer `scope`), newest first."""
        query = self._query(user_id, key, scope)
        return tuple(Change(*row) for row in session.execute(query).all())

    def find(
        self,
        session: Session | Connection,
        user_id: str,
        key: str,
        change_id: int,
        scope: str = "",
    ) -> Change | None:
        """The kept change `change_id` if it is this user's, this layer's and this key's,
        else None."""
        if not 1 <= change_id <= MAX_CHANGE_ID:
            return None
        query = self._query(user_id, key, scope).where(MemoryChange.id == change_id)
        row = session.execute(query).first()
        return Change(*row) if row else None

    def clear(self, session: Session | Connection, user_id: str, scope: str | None = None) -> int:
        """Delete the user's changes (of one layer, given a `scope`: "" their own); how many."""
        mine = delete(MemoryChange).where(MemoryChange.user_id == user_id)
        if scope is not None:
            mine = mine.where(MemoryChange.scope == scope)
        return rowcount(session.execute(mine))

    def _query(self, user_id: str, key: str | None, scope: str) -> Any:
        query = select(*_COLUMNS).where(
            MemoryChange.user_id == user_id,
            MemoryChange.scope == scope,
            MemoryChange.at >= self.cutoff(),
        )
        if key is not None:
            query = query.where(MemoryChange.key == key)
        return query.order_by(MemoryChange.id.desc())
