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
`LockedWrites`' (`kvmem.memory.locked_writes`), which this class extends.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any, Literal

import anyio.to_thread
from sqlalchemy.engine import Connection

from kvmem.db.driver_connection import Executor
from kvmem.db.engine import Database, rowcount
from kvmem.db.erasure import Erased, check_not_erased, erase_user_rows, fence_user
from kvmem.entries import Entry, Imported, Reverted, Written, utcnow
from kvmem.errors import NotFound
from kvmem.memory import write_statements as statements
from kvmem.memory.expirations import (
    EXPIRE_BATCH,
    expire_due_locked,
)
from kvmem.memory.expiry import check_future
from kvmem.memory.group_commit import GroupCommit, Prepare
from kvmem.memory.history import ChangeLog, ChangeSource
from kvmem.memory.imports import (
    Counted,
    LayerImport,
    check_import_limit,
    check_unchanged,
    count_document,
    import_change,
    scopes_after,
)
from kvmem.memory.locked_writes import LockedWrites, scopes_full
from kvmem.memory.rules import OWN, MemoryRules
from kvmem.memory.snapshots import ENTRY_AT_KEY
from kvmem.tokens import TokenCounter

log = logging.getLogger("kvmem.store")

ImportMode = Literal["merge", "replace"]


class MemoryStore(LockedWrites):
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

    def import_document(
        self,
        user_id: str,
        items: Iterable[tuple[str, str]],
        *,
        mode: ImportMode = "merge",
        expected: dict[str, str | None] | None = None,
        expires: Mapping[str, datetime] | None = None,
        since: datetime | None = None,
        scope: str = "",
    ) -> Imported:
        """Write many entries into one layer (`scope`; "" the user's own) at once, all or
        none, with source `import`.

        Every entry is checked against every rule of the layer, and the resulting total
        against its `tokenLimit`, before anything is written; the error names the offending
        `key` in its details. A key twice in one document is refused. `merge` keeps the
        layer's other entries; `replace` deletes them (each delete recorded). With `expected`
        (key: the value it was read with, None for none), `ChangedMeanwhile` unless each still
        holds it (an expired entry holds none). `expires` gives keys their expiry; an entry
        whose expiry has passed is not imported (it is no memory any more). `since` as for
        `set`.
        """
        layer = LayerImport(list(items), expected, expires or {})
        return self.import_layers(user_id, {scope: layer}, mode=mode, since=since)[scope]

    def import_layers(
        self,
        user_id: str,
        layers: Mapping[str, LayerImport],
        *,
        mode: ImportMode = "merge",
        since: datetime | None = None,
    ) -> dict[str, Imported]:
        """`import_document` for several layers in one transaction, all or none (restoring an
        export that holds the user's own entries and their scopes'); each layer's result."""
        moment = self.clock()
        counted: dict[str, tuple[Counted, dict[str, datetime]]] = {}
        for scope, layer in layers.items():
            expires = {key: at for key, at in layer.expires.items() if at > moment}
            past = layer.expires.keys() - expires.keys()
            positions = layer.positions if layer.positions is not None else range(len(layer.items))
            kept = [
                (position, item)
                for position, item in zip(positions, layer.items, strict=True)
                if item[0] not in past
            ]
            rules = self.rules.layer(scope)
            items = [item for _, item in kept]
            at = [position for position, _ in kept]
            counted[scope] = (count_document(rules, self.tokens, items, at, scope), expires)
        with self.database.writing_connection() as connection:
            self.database.lock_user(connection, user_id)
            if since is not None:
                check_not_erased(connection, user_id, since)
            while expire_due_locked(connection, self.history_log, user_id, moment) == EXPIRE_BATCH:
                pass  # every due entry marked: what is left unmarked is memory
            self._check_import_scopes(connection, user_id, counted, mode, moment)
            results = {
                scope: self._import_locked(
                    connection, user_id, scope, *counted[scope], layers[scope].expected, mode
                )
                for scope in layers
            }
        return results

    def _check_import_scopes(
        self,
        connection: Connection,
        user_id: str,
        counted: Mapping[str, tuple[Counted, dict[str, datetime]]],
        mode: ImportMode,
        moment: datetime,
    ) -> None:
        """`MemoryFull` if the import starts a scope the user does not hold and leaves them
        more than `memory.scopes.maxScopes` (before anything is written: all or nothing)."""
        scoped = self.rules.scoped
        if scoped is None or scoped.max_scopes is None or counted.keys() <= {OWN}:
            return
        rows = connection.execute(statements.SCOPES_HELD_NAMES, {"user_id": user_id, "now": moment})
        held = {row.scope for row in rows}
        after = scopes_after(held, {scope: bool(c) for scope, (c, _) in counted.items()}, mode)
        started = sorted(after - held)
        if started and len(after) > scoped.max_scopes:
            if len(started) == 1:
                doing = f"importing into scope {started[0]!r}"
            else:
                named = ", ".join(repr(scope) for scope in started[:3])
                more = ", ..." if len(started) > 3 else ""
                doing = f"importing into {len(started)} new scopes ({named}{more})"
            raise scopes_full(doing, scoped.max_scopes, len(held), len(after))

    def _import_locked(
        self,
        connection: Connection,
        user_id: str,
        scope: str,
        counted: Counted,
        expires: dict[str, datetime],
        expected: dict[str, str | None] | None,
        mode: ImportMode,
    ) -> Imported:
        """One layer of `import_layers`, in its transaction (the user's lock held)."""
        layer = {"user_id": user_id, "scope": scope}
        existing = {}
        for stored in connection.execute(statements.ENTRIES_OF_USER, layer):
            if not stored.expired:
                existing[stored.key] = stored
            elif mode == "replace" or stored.key in counted:  # gone already: no change
                connection.execute(statements.DELETE_ENTRY, {"entry_id": stored.id})
        check_unchanged(existing, expected)
        dropped = [row for key, row in existing.items() if key not in counted]
        check_import_limit(
            self.rules.layer(scope).token_limit,
            existing,
            dropped if mode == "replace" else [],
            counted,
        )
        changes: list[dict[str, Any]] = []
        for gone in dropped if mode == "replace" else []:
            changes.append(import_change(gone.key, "delete", gone.value, None, scope))
            connection.execute(statements.DELETE_ENTRY, {"entry_id": gone.id})
        now = utcnow()
        inserts: list[dict[str, Any]] = []  # one executemany: a new user's import is all new
        for key, (value, tokens) in counted.items():
            row = existing.get(key)
            if row is not None and row.value == value:
                if row.expires_at != expires.get(key):
                    connection.execute(
                        statements.SET_EXPIRY,
                        {"entry_id": row.id, "expires_at": expires.get(key)},
                    )
                    connection.execute(statements.BUMP, {"user_id": user_id})
                continue
            changes.append(import_change(key, "set", row.value if row else None, value, scope))
            if row is None:
                inserts.append(
                    {
                        "user_id": user_id,
                        "key": key,
                        "value": value,
                        "token_count": tokens,
                        "source": "import",
                        "created_at": now,
                        "updated_at": now,
                        "expires_at": expires.get(key),
                        "scope": scope,
                    },
                )
            else:
                connection.execute(
                    statements.REPLACE_ENTRY,
                    {
                        "entry_id": row.id,
                        "value": value,
                        "token_count": tokens,
                        "source": "import",
                        "updated_at": now,
                        "expires_at": expires.get(key),
                    },
                )
        if inserts:
            connection.execute(statements.INSERT_ENTRY, inserts)
        if changes:
            self.history_log.prune(connection, user_id)
            self.history_log.record_many(connection, user_id, changes)
            connection.execute(statements.BUMP, {"user_id": user_id})
        return Imported(
            imported=len(counted),
            deleted=len(dropped) if mode == "replace" else 0,
            total_tokens=self._total(connection, user_id, scope),
        )

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
