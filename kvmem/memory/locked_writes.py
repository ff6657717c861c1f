"""The writes inside a user's locked transaction: set and delete under every write rule.

`LockedWrites` is the middle layer of `kvmem.memory.store.MemoryStore`: below it the reads
(`MemoryReader`), above it the transactions that take the user's lock and call these. Each
runs prebuilt Core statements (`kvmem.memory.write_statements`) on the transaction's
connection, SQLAlchemy's or SQLite's bare one, checks `tokenLimit` against the user's total
(expired entries count for nothing), records the change in the same transaction and bumps
the user's memory version. An entry found expired is dropped first, so a write on its key
starts the key anew (`kvmem.memory.expirations`). It opens no transaction itself.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any, Literal

from sqlalchemy.orm import Session

from kvmem.db.driver_connection import Executor
from kvmem.entries import Entry, Written, utcnow
from kvmem.errors import MemoryFull
from kvmem.memory import write_statements as statements
from kvmem.memory.expirations import drop_expired, expire_user_due
from kvmem.memory.history import ChangeSource
from kvmem.memory.snapshots import ENTRY_AT_KEY, MemoryReader
from kvmem.tokens import TokenCounter


class LockedWrites(MemoryReader):
    """Set and delete inside a transaction that holds the user's lock (see the module)."""

    tokens: TokenCounter

    def write_locked(
        self,
        session: Session,
        user_id: str,
        key: str,
        value: str | None,
        source: ChangeSource,
        *,
        conversation_id: str | None = None,
        expires_at: datetime | None = None,
        scope: str = "",
    ) -> tuple[Entry | None, int]:
        """Set `key` to `value` (or delete it when `value` is None) in the layer `scope` under
        every write rule, inside the caller's transaction, which already holds the user's
        lock: for a caller that changes another table in the same transaction (accepting a
        proposal). The entry now (None once deleted; a delete of a missing key changes
        nothing) and the layer's total."""
        connection = session.connection()
        rules = self.rules.layer(scope)
        if value is not None:
            rules.check_key(key)
            clean = rules.clean_value(value)
            written = self._set_locked(
                connection,
                user_id,
                key,
                clean,
                self.tokens.count(clean),
                source,
                conversation_id,
                expires_at,
                scope,
            )
            return written.entry, written.total_tokens
        rules.check_key_format(key)
        at_key = {"user_id": user_id, "scope": scope, "key": key}
        row = connection.execute(ENTRY_AT_KEY, at_key).first()
        if row is not None:
            self._delete_locked(connection, user_id, row, source, conversation_id)
        return None, self._total(connection, user_id, scope)

    def _set_locked(
        self,
        connection: Executor,
        user_id: str,
        key: str,
        value: str,
        tokens: int,
        source: ChangeSource,
        conversation_id: str | None,
        expires_at: datetime | None = None,
        scope: str = "",
    ) -> Written:
        """`set` in the layer `scope` inside a transaction that holds the user's lock (the
        value already clean, the key checked against the layer's rules)."""
        at_key = {"user_id": user_id, "scope": scope, "key": key}
        row = connection.execute(ENTRY_AT_KEY, at_key).first()
        total = self._total(connection, user_id, scope)
        if row is not None and not Entry(*row[1:]).live(self.clock()):
            # An expired entry is gone from memory: the write starts the key anew.
            drop_expired(connection, self.history_log, user_id, row)
            row = None
        if row is not None and row.value == value:
            entry = Entry(*row[1:])
            if row.expires_at != expires_at:  # the same value, another expiry
                connection.execute(
                    statements.SET_EXPIRY, {"entry_id": row.id, "expires_at": expires_at}
                )
                connection.execute(statements.BUMP, {"user_id": user_id})
                entry = dataclasses.replace(entry, expires_at=expires_at)
            return Written(entry=entry, created=False, total_tokens=total)
        replaced = row.token_count if row else 0
        self._check_limit(total, tokens, replaced=replaced, scope=scope)
        if scope and total == 0:
            # Every value has a token at least, so a layer of none holds no memory: this write
            # starts a scope (the person's own layer, and a scope they hold, need no count).
            self._check_scopes(connection, user_id, scope)
        now = utcnow()
        if row is None:
            entry = Entry(key, value, tokens, source, now, now, expires_at, scope=scope)
            connection.execute(
                statements.INSERT_ENTRY,
                {
                    "user_id": user_id,
                    "key": key,
                    "value": value,
                    "token_count": tokens,
                    "source": source,
                    "created_at": now,
                    "updated_at": now,
                    "expires_at": expires_at,
                    "scope": scope,
                },
            )
        else:
            entry = Entry(key, value, tokens, source, row.created_at, now, expires_at, scope=scope)
            connection.execute(
                statements.REPLACE_ENTRY,
                {
                    "entry_id": row.id,
                    "value": value,
                    "token_count": tokens,
                    "source": source,
                    "updated_at": now,
                    "expires_at": expires_at,
                },
            )
        change_id = self._record(
            connection,
            user_id,
            key,
            "set",
            row.value if row else None,
            value,
            source,
            conversation_id,
            scope,
        )
        connection.execute(statements.BUMP, {"user_id": user_id})
        return Written(
            entry=entry,
            created=row is None,
            total_tokens=total - replaced + tokens,
            change_id=change_id,
        )

    def _delete_locked(
        self,
        connection: Executor,
        user_id: str,
        row: Any,
        source: ChangeSource,
        conversation_id: str | None,
    ) -> tuple[Entry, int | None]:
        """`delete` of the entry `row` (an `ENTRY_AT_KEY` row) inside a transaction that holds
        the user's lock; the entry and change id. An expired entry is removed with no change
        of its own (its `expire` change already says it left memory)."""
        entry = Entry(*row[1:])
        if not entry.live(self.clock()):
            drop_expired(connection, self.history_log, user_id, row)
            return entry, None
        connection.execute(statements.DELETE_ENTRY, {"entry_id": row.id})
        change_id = self._record(
            connection,
            user_id,
            row.key,
            "delete",
            row.value,
            None,
            source,
            conversation_id,
            row.scope,
        )
        connection.execute(statements.BUMP, {"user_id": user_id})
        return entry, change_id

    def _total(self, connection: Executor, user_id: str, scope: str = "") -> int:
        """The tokens of the user's layer `scope` now (expired entries count for nothing)."""
        total: int = connection.execute(
            statements.TOTAL, {"user_id": user_id, "scope": scope, "now": self.clock()}
        ).scalar_one()
        return total

    def expire_due(self, user_id: str, now: datetime) -> int:
        """Expire the user's entries due at `now` (`kvmem.memory.expirations`); how many."""
        return expire_user_due(self.database, self.history_log, user_id, now)

    def _record(
        self,
        connection: Executor,
        user_id: str,
        key: str,
        op: Literal["set", "delete"],
        old_value: str | None,
        new_value: str | None,
        source: ChangeSource,
        conversation_id: str | None,
        scope: str = "",
    ) -> int | None:
        """Record a change and drop the user's expired ones, in the write's transaction."""
        self.history_log.prune(connection, user_id)
        return self.history_log.record(
            connection,
            user_id,
            key,
            op,
            old_value,
            new_value,
            source,
            conversation_id,
            scope=scope,
        )

    def _check_scopes(self, connection: Executor, user_id: str, scope: str) -> None:
        """`MemoryFull` if the user already holds `memory.scopes.maxScopes` scopes, which
        starting `scope` (one they do not hold) would pass."""
        limit = self.rules.layer(scope).max_scopes
        if limit is None:
            return
        held: int = connection.execute(
            statements.SCOPES_HELD, {"user_id": user_id, "now": self.clock()}
        ).scalar_one()
        if held >= limit:
            raise scopes_full(f"storing into scope {scope!r}", limit, held, held + 1)

    def _check_limit(self, total: int, requested: int, *, replaced: int, scope: str = "") -> None:
        limit = self.rules.layer(scope).token_limit
        if limit is not None and total - replaced + requested > limit:
            raise MemoryFull(
                f"storing {requested} tokens would take "
                + (f"scope {scope!r}" if scope else "memory")
                + f" to {total - replaced + requested} tokens, over the limit of {limit}",
                token_limit=limit,
                total_tokens=total,
                requested_tokens=requested,
            )


def scopes_full(doing: str, limit: int, held: int, after: int) -> MemoryFull:
    """The refusal of `doing` (a write, an import), which would take a user holding `held`
    scopes to `after`, over `limit` (`memory.scopes.maxScopes`)."""
    return MemoryFull(
        f"{doing} would take this user to {after} scopes, over the limit of {limit} "
        "(memory.scopes.maxScopes); write into a scope that holds memory, or clear one",
        max_scopes=limit,
        scopes=held,
    )
