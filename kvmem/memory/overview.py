"""A user's memory usage, as `GET /memory` and `kvmem memory list` report it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvmem.config import Config
from kvmem.entries import Entry, Snapshot


def memory_overview(
    snapshot: Snapshot, config: Config, with_expired: Sequence[Entry] | None = None
) -> dict[str, Any]:
    """The body of `GET /memory` (and `kvmem memory list`): entries newest first, usage.
    `with_expired` (`?include_expired=true`): every entry row, each marked `expired` or not;
    the usage is the snapshot's all the same."""
    limit = config.memory.token_limit
    total = snapshot.total_tokens
    if with_expired is None:
        memories = [entry.as_json() for entry in reversed(snapshot.entries)]
    else:
        live = {entry.key for entry in snapshot.entries}
        memories = [
            {**entry.as_json(), "expired": entry.key not in live}
            for entry in reversed(with_expired)
        ]
    return {
        "memories": memories,
        "total_tokens": total,
        "token_limit": limit,
        "char_limit": config.memory.char_limit,
        "usage_percentage": usage_percentage(total, limit),
        "valid_keys": config.memory.valid_keys,
        "enabled": not config.memory.disabled and snapshot.memories_enabled,
    }


def usage_percentage(total: int, limit: int | None) -> float | None:
    """`total` as a percentage of `limit`, one decimal; above 100 if the limit was lowered."""
    if limit is None:
        return None
    if limit == 0:
        return 0.0 if total == 0 else 100.0
    return round(100 * total / limit, 1)
