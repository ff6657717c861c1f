"""Imports: an import document's checks, and `ImportWrites`, the store's import transaction.

Every entry is checked against every rule of its layer and counted, and the resulting total
against that layer's `tokenLimit` (and the scopes it starts against `maxScopes`), before
anything is written; an error names the offending entry (its index and `key`), so that a
person can find it in a file of thousands. `ImportWrites` (extends `LockedWrites`, extended
by `MemoryStore`) then writes one or several layers in one transaction that holds the user's
lock, all or none. `kvmem.memory.exports` reads the document's shape.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from sqlalchemy.engine import Connection

from kvmem.db.erasure import check_not_erased
from kvmem.entries import Imported, utcnow
from kvmem.errors import BadRequest, KvmemError, MemoryFull
from kvmem.memory import write_statements as statements
from kvmem.memory.expirations import EXPIRE_BATCH, expire_due_locked
from kvmem.memory.locked_writes import LockedWrites, scopes_full
from kvmem.memory.rules import OWN, MemoryRules
from kvmem.tokens import TokenCounter

ImportMode = Literal["merge", "replace"]

# Each key's clean value and its token count, in document order.
Counted = dict[str, tuple[str, int]]


@dataclass(frozen=True)
class LayerImport:
    """What an import writes into one layer: its (key, value) items in document order, the
    values it was planned from (`expected`, see `check_unchanged`) and the keys' expiries."""

    items: Sequence[tuple[str, str]]
    expected: dict[str, str | None] | None = None
    expires: Mapping[str, datetime] = field(default_factory=dict)
    # Each item's index in the document it came from (None: its index in `items`), so that an
    # error names the entry even when the document's entries went to several layers.
    positions: Sequence[int] | None = None


class ChangedMeanwhile(Exception):  # noqa: N818 (a signal to plan again, not an error)
    """The entries an import was planned from changed before it wrote: nothing was written;
    the caller reads the entries again and plans anew."""


def check_unchanged(existing: dict[str, Any], expected: dict[str, str | None] | None) -> None:
    """`ChangedMeanwhile` unless each key of `expected` still holds its value (None: no
    entry); `existing` are the user's entry rows by key, read under their lock."""
    for key, value in (expected or {}).items():
        row = existing.get(key)
        if (row.value if row is not None else None) != value:
            raise ChangedMeanwhile(key)


def count_document(
    rules: MemoryRules,
    tokens: TokenCounter,
    items: Iterable[tuple[str, str]],
    positions: Iterable[int] | None = None,
    scope: str = "",
) -> Counted:
    """Each entry checked against every rule, cleaned and counted; a key twice is refused.
    An error names the entry by its index in the document (`positions`, else its index in
    `items`) and, in a scope's layer, the scope."""
    counted: Counted = {}
    indexed = zip(positions, items, strict=True) if positions is not None else enumerate(items)
    for index, (key, value) in indexed:
        try:
            rules.check_key(key)
            if key in counted:
                raise BadRequest(f"the key {key!r} appears more than once in the document")
            value = rules.clean_value(value)
        except KvmemError as exc:
            # Name the entry, so that a person can find it in a file of thousands.
            where = f"key {key!r}, scope {scope!r}" if scope else f"key {key!r}"
            exc.message = f"memories[{index}] ({where}): {exc.message}"
            exc.details["key"] = key
            raise
        counted[key] = (value, tokens.count(value))
    return counted


def check_import_limit(
    limit: int | None, existing: dict[str, Any], dropped: list[Any], counted: Counted
) -> None:
    """`MemoryFull` naming the entry that takes the user's total over `limit`: `existing`
    are the user's entry rows by key (with `key` and `token_count`), `dropped` those that
    the import deletes."""
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


def scopes_after(held: set[str], layers: Mapping[str, bool], mode: str) -> set[str]:
    """The scopes holding memory once an import has written: `held` those that do now,
    `layers` whether the import brings entries into each of its layers. A layer it brings
    entries to holds memory; one it brings none to is emptied by `replace`, kept by `merge`.
    The person's own layer (`""`) is no scope."""
    after = set(held)
    for scope, brings in layers.items():
        if not scope:
            continue
        if brings:
            after.add(scope)
        elif mode == "replace":
            after.discard(scope)
    return after


def import_change(
    key: str, op: str, old_value: str | None, new_value: str | None, scope: str = ""
) -> dict[str, Any]:
    """One change an import makes to the layer `scope`, as `ChangeLog.record_many` takes it."""
    return {
        "key": key,
        "op": op,
        "old_value": old_value,
        "new_value": new_value,
        "source": "import",
        "scope": scope,
    }


class ImportWrites(LockedWrites):
    """The store's imports: many entries into one or several layers in one transaction that
    holds the user's lock, all or none (the middle layer between `LockedWrites` and
    `MemoryStore`)."""

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
