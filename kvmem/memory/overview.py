"""A user's memory usage, as `GET /memory` and `kvmem memory list` report it: one layer at a
time (the person's own, or a scope's, with that layer's limits and keys)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvmem.config import Config
from kvmem.entries import Entry, Snapshot
from kvmem.memory.rules import OWN, MemoryRules


def memory_overview(
    snapshot: Snapshot,
    config: Config,
    with_expired: Sequence[Entry] | None = None,
    *,
    scope: str = OWN,
) -> dict[str, Any]:
    """The body of `GET /memory` (and `kvmem memory list`): entries newest first, usage.
    `with_expired` (`?include_expired=true`): every entry row, each marked `expired` or not;
    the usage is the snapshot's all the same. `snapshot` holds one layer: the person's own,
    or (`scope`) a scope's, whose body says its `scope` and the scoped layer's limits."""
    valid_keys: list[str] | None = config.memory.valid_keys
    rules = MemoryRules.from_config(config.memory)
    if scope != OWN:
        rules = rules.layer(scope)
        valid_keys = list(rules.valid_keys or ())
    limit = rules.token_limit
    total = snapshot.total_tokens
    if with_expired is None:
        memories = [entry.as_json() for entry in reversed(snapshot.entries)]
    else:
        live = {entry.key for entry in snapshot.entries}
        memories = [
            {**entry.as_json(), "expired": entry.key not in live}
            for entry in reversed(with_expired)
        ]
    overview = {
        "memories": memories,
        "total_tokens": total,
        "token_limit": limit,
        "char_limit": rules.char_limit,
        "usage_percentage": usage_percentage(total, limit),
        "valid_keys": valid_keys,
        "enabled": not config.memory.disabled and snapshot.memories_enabled,
    }
    if scope != OWN:
        overview["scope"] = scope
    return overview


def usage_percentage(total: int, limit: int | None) -> float | None:
    """`total` as a percentage of `limit`, one decimal; above 100 if the limit was lowered."""
    if limit is None:
        return None
    if limit == 0:
        return 0.0 if total == 0 else 100.0
    return round(100 * total / limit, 1)
