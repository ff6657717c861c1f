"""A user's memory usage, as `GET /memory` and `kvmem memory list` report it."""

from __future__ import annotations

from typing import Any

from kvmem.config import Config
from kvmem.entries import Snapshot


def memory_overview(snapshot: Snapshot, config: Config) -> dict[str, Any]:
    """The body of `GET /memory` (and `kvmem memory list`): entries newest first, usage."""
    limit = config.memory.token_limit
    total = snapshot.total_tokens
    return {
        "memories": [entry.as_json() for entry in reversed(snapshot.entries)],
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
