"""The memory store's nouns: an entry, a user's snapshot, the outcomes of writes, and time.

The ground floor: it imports nothing of kvmem, so that a module that needs an `Entry` or
`iso` (prompts, exports, routes) does not pull in the store, its database or its rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any


def utcnow() -> datetime:
    """The current time, timezone-aware, in UTC."""
    return datetime.now(UTC)


def iso(moment: datetime) -> str:
    """`moment` as ISO 8601 in UTC with a `Z` suffix."""
    # isoformat is several times faster than strftime; the zone is dropped, not converted,
    # as strftime's format did (every stored time is UTC already).
    return moment.replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


@dataclass(frozen=True)
class Entry:
    """One stored memory."""

    key: str
    value: str
    token_count: int
    source: str
    created_at: datetime
    updated_at: datetime
    # When the entry stops being memory (None: never), and whether its `expire` change has
    # been recorded (`kvmem.memory.expirations`): an expired entry is kept, not injected.
    expires_at: datetime | None = None
    expired: bool = False
    scope: str = ""  # the layer: "" for the person's own, else the scope's name

    def live(self, now: datetime) -> bool:
        """Whether the entry is memory at `now`: not expired, nor due to."""
        return not self.expired and (self.expires_at is None or now < self.expires_at)

    def as_json(self) -> dict[str, Any]:
        """The entry as the API shows it, times in ISO 8601 UTC."""
        return {
            "key": self.key,
            "value": self.value,
            "token_count": self.token_count,
            "created_at": iso(self.created_at),
            "updated_at": iso(self.updated_at),
            "source": self.source,
            "expires_at": iso(self.expires_at) if self.expires_at is not None else None,
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
    # The recorded change; None when the value did not change or no history is kept.
    change_id: int | None = None


@dataclass(frozen=True)
class Imported:
    """The outcome of an import: entries written, entries deleted (`replace`), the total now."""

    imported: int
    deleted: int
    total_tokens: int


@dataclass(frozen=True)
class Reverted:
    """The outcome of a `revert`: the entry now (None when the key is now deleted)."""

    entry: Entry | None
    total_tokens: int
    change_id: int | None
