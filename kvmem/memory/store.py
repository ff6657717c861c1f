"""The memory store's writes: each user's key/value entries, their history and opt-out switch.

Every write applies `MemoryRules` and checks `tokenLimit` inside one transaction that holds
the user's write lock, so the limit holds under any concurrency; the change it makes is
recorded (`kvmem.memory.history`) in that same transaction, so history is never missing a write
nor holds one that did not happen. A write that leaves the value as it was changes nothing:
no change is recorded and `updated_at` and `source` stay. The entries' writes run
prebuilt Core statements on a bare connection (no ORM session): the ORM's unit of work and
identity map cost more than the SQL itself, and on SQLite every write holds the writer lock
while it runs. On SQLite `set` and `delete` run them on the bare sqlite3 connection
(`kvmem.db.driver_connection`), and while the app runs concurrent `set`s share transactions
through one writer thread (`kvmem.memory.group_commit`), each keeping its own checks and result.
Every query is scoped by `user_id`; callers get frozen dataclasses, never a session. The
reads are `MemoryReader`'s (`kvmem.memory.snapshots`), the writes inside a locked transaction
`LockedWrites`' (`kvmem.memory.locked_writes`), the imports `ImportWrites`'
(`kvmem.memory.imports`), which this class extends.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from datetime import datetime

import anyio.to_thread

from kvmem.db.driver_connection import Executor
from kvmem.db.engine import Database, rowcount
from kvmem.db.erasure import Erased, check_not_erased, erase_user_rows, fence_user
from kvmem.entries import Entry, Reverted, Written, utcnow
from kvmem.errors import NotFound
from kvmem.memory import write_statements as statements
from kvmem.memory.expiry import check_future
from kvmem.memory.group_commit import GroupCommit, Prepare
from kvmem.memory.history import ChangeLog, ChangeSource
from kvmem.memory.imports import ImportWrites
from kvmem.memory.rules import MemoryRules
from kvmem.memory.snapshots import ENTRY_AT_KEY
from kvmem.tokens import TokenCounter

log = logging.getLogger("kvmem.store")


class MemoryStore(ImportWrites):
    """Reads and writes users' memory entries under the configured rules."""

    def __init__(
        self,
        database: Database,
        rules: MemoryRules,
        tokens: TokenCounter,
        *,
        keep_days: int = 90,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        super().__init__(database, rules, ChangeLog(keep_days), clock)
        self.tokens = tokens
        self._group: GroupCommit | None = None  # SQLite's writer thread, while it runs

    def set(
        self,
        user_id: str,
        key: str,
        value: str,
        source: ChangeSource = "manual",
        *,
        conversation_id: str | None = None,
        guard: Callable[[], None] | None = None,
        since: datetime | None = None,
        expires_at: datetime | None = None,
        scope: str = "",
    ) -> Written:
        """Create or replace the entry at `key` of the layer `scope` ("": the user's own, else
        a scope, checked by `MemoryRules.scope`); `MemoryFull` if it would pass that layer's
        `tokenLimit`.

        The entry expires at `expires_at` (which must be in the future), or never.
        The change is recorded with `source` and `conversation_id` (the conversation whose
        agent run made it). `guard` runs just before the commit; if it raises, nothing is
        written (the memory agent uses it so that no write lands after its deadline).
        `since`, when the work making the write began, refuses it with `UserErased` if the
        user was erased after that (every writer passes it: an agent run, a request, a
        command; erasure is final).
        """
        prepare = self._set_write(
            user_id, key, value, source, conversation_id, since, expires_at, scope
        )
        # A guarded write runs alone, its guard checked right before its own COMMIT.
        future = self._group.submit(prepare) if self._group and guard is None else None
        if future is not None:
            return future.result()
        write = prepare()
        with self.database.writing_prebuilt() as connection:
            written = write(connection)
            if guard is not None:
                guard()
            return written

    async def set_async(
        self,
        user_id: str,
        key: str,
        value: str,
        source: ChangeSource = "manual",
        *,
        conversation_id: str | None = None,
        since: datetime | None = None,
        expires_at: datetime | None = None,
        scope: str = "",
    ) -> Written:
        """`set` for the event loop: awaits the writer thread (group commit) instead of
        holding a worker thread, or runs `set` in one when there is no writer thread."""
        prepare = self._set_write(
            user_id, key, value, source, conversation_id, since, expires_at, scope
        )
        future = self._group.submit(prepare) if self._group else None
        if future is None:
            return await anyio.to_thread.run_sync(
                functools.partial(
                    self.set,
                    user_id,
                    key,
                    value,
                    source,
                    conversation_id=conversation_id,
                    since=since,
                    expires_at=expires_at,
                    scope=scope,
                )
            )
        # Shielded: once queued the write is made even if the caller goes away, as a
        # write already running in a worker thread is.
        return await asyncio.shield(asyncio.wrap_future(future))

    def start_group_commit(
        self, on_batch: Callable[[int], None] | None = None
    ) -> GroupCommit | None:
        """On SQLite, start the writer thread through which `set`s without a guard share
        transactions (`kvmem.memory.group_commit`), and return it; elsewhere nothing (each write
        commits alone). `on_batch` is told the number of writes of each batch it runs."""
        if self.database.dialect == "sqlite" and self._group is None:
            group = GroupCommit(self.database, on_batch=on_batch)
            group.start()
            self._group = group
        return self._group

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
        source: ChangeSource,
        conversation_id: str | None,
        since: datetime | None = None,
        expires_at: datetime | None = None,
        scope: str = "",
    ) -> Prepare:
        """`set` in two steps: checking and counting the value (no transaction), then
        writing it on a connection whose transaction the caller owns."""

        def prepare() -> Callable[[Executor], Written]:
            rules = self.rules.layer(scope)
            rules.check_key(key)
            clean = rules.clean_value(value)
            if expires_at is not None:
                check_future(expires_at, self.clock())
            tokens = self.tokens.count(clean)

            def write(connection: Executor) -> Written:
                self.database.lock_user(connection, user_id)
                if since is not None:
                    check_not_erased(connection, user_id, since)
                return self._set_locked(
                    connection,
                    user_id,
                    key,
                    clean,
                    tokens,
                    source,
                    conversation_id,
                    expires_at,
                    scope,
                )

            return write

        return prepare

    def delete(
        self,
        user_id: str,
        key: str,
        source: ChangeSource = "manual",
        *,
        conversation_id: str | None = None,
        guard: Callable[[], None] | None = None,
        since: datetime | None = None,
        scope: str = "",
    ) -> Entry:
        """Remove the entry at `key` and return it, or `NotFound`; the rest as for `set`."""
        self.rules.layer(scope).check_key_format(key)
        with self.database.writing_prebuilt() as connection:
            # Every write takes the user's lock first: one lock order for all writers.
            self.database.lock_user(connection, user_id)
            if since is not None:
                check_not_erased(connection, user_id, since)
            at_key = {"user_id": user_id, "scope": scope, "key": key}
            row = connection.execute(ENTRY_AT_KEY, at_key).first()
            if row is None:
                raise NotFound(f"no memory with key {key!r}")
            entry, _ = self._delete_locked(connection, user_id, row, source, conversation_id)
            if guard is not None:
                guard()
            return entry

    def clear(self, user_id: str, scope: str = "") -> int:
        """Remove all entries of one layer of the user (`scope`; "" their own), its history
        and the agent's pending proposals for it; the number of entries removed."""
        with self.database.writing_connection() as connection:
            self.database.lock_user(connection, user_id)
            layer = {"user_id": user_id, "scope": scope}
            result = connection.execute(statements.DELETE_ENTRIES, layer)
            self.history_log.clear(connection, user_id, scope)
            connection.execute(statements.DELETE_PROPOSALS, layer)
            connection.execute(statements.BUMP, {"user_id": user_id})
            return rowcount(result)

    def revert(
        self,
        user_id: str,
        key: str,
        change_id: int,
        *,
        conversation_id: str | None = None,
        scope: str = "",
    ) -> Reverted:
        """Set `key` of the layer `scope` back to its value right after change `change_id`
        (deleted, if that change was a delete), as a write with source `revert` under every
        write rule.

        `NotFound` when the change is not this user's, this layer's and this key's, or no
        longer kept.
        """
        rules = self.rules.layer(scope)
        rules.check_key_format(key)
        with self.database.writing_connection() as connection:
            self.database.lock_user(connection, user_id)
            target = self.history_log.find(connection, user_id, key, change_id, scope)
            if target is None:
                raise NotFound(f"no change {change_id} of key {key!r}")
            if target.new_value is not None:
                rules.check_key(key)
                value = rules.clean_value(target.new_value)
                written = self._set_locked(
                    connection,
                    user_id,
                    key,
                    value,
                    self.tokens.count(value),
                    "revert",
                    conversation_id,
                    scope=scope,
                )
                return Reverted(written.entry, written.total_tokens, written.change_id)
            at_key = {"user_id": user_id, "scope": scope, "key": key}
            row = connection.execute(ENTRY_AT_KEY, at_key).first()
            recorded = None
            if row is not None:
                _, recorded = self._delete_locked(
                    connection, user_id, row, "revert", conversation_id
                )
            return Reverted(None, self._total(connection, user_id, scope), recorded)

    def clear_history(self, user_id: str, scope: str | None = None) -> int:
        """Erase the user's change history (entries stay): of one layer (`scope`; "" their
        own), or, given none, of every layer; how many changes were erased."""
        with self.database.writing() as session:
            self.database.lock_user(session, user_id)
            return self.history_log.clear(session, user_id, scope)

    def erase_user(self, user_id: str) -> Erased:
        """Delete every row kvmem holds for the user, from every table, in one transaction
        that also fences the user (see `kvmem.db.erasure`); on SQLite the deleted text is then
        gone from the database files too (`secure_delete`, and the WAL checkpointed)."""
        with self.database.writing() as session:
            self.database.lock_user(session, user_id)
            erased = erase_user_rows(session, user_id)
            # Taken last: work that began while the rows were being deleted is fenced too.
            fence_user(session, user_id, utcnow())
        self._empty_wal(user_id)
        # A write that began after the fence's time (while the rows were being deleted or
        # the WAL emptied) may have landed since: it is deleted too, and the fence moved to
        # now, the last moment before the erasure answers, so that no write begun before
        # the answer lands after it.
        with self.database.writing() as session:
            self.database.lock_user(session, user_id)
            erased += erase_user_rows(session, user_id)
            fence_user(session, user_id, utcnow())
        self._empty_wal(user_id)
        return erased

    def _empty_wal(self, user_id: str) -> None:
        if not self.database.empty_wal():
            log.warning(
                "erased user %s; the WAL could not be emptied now (readers kept it "
                "busy): its checkpoint is retried until it is (see /healthz)",
                user_id,
            )

    def set_memories_enabled(
        self, user_id: str, enabled: bool, *, since: datetime | None = None
    ) -> bool:
        """Turn memory on or off for the user's chats (`since` as for `set`)."""
        with self.database.writing_connection() as connection:
            self.database.lock_user(connection, user_id)
            if since is not None:
                check_not_erased(connection, user_id, since)
            connection.execute(statements.SET_ENABLED, {"user_id": user_id, "on": enabled})
        return enabled
