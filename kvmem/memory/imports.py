"""Checking an import document before `MemoryStore.import_document` writes it.

Every entry is checked against every rule and counted, and the resulting total against
`tokenLimit`, before anything is written; an error names the offending entry (its index
and `key`), so that a person can find it in a file of thousands. It reads and writes no
database (the rows it weighs are the store's); `kvmem.memory.exports` reads the document's shape.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kvmem.errors import BadRequest, KvmemError, MemoryFull
from kvmem.memory.rules import MemoryRules
from kvmem.tokens import TokenCounter

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
