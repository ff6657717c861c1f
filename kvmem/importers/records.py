"""The nouns every reader shares: one memory of another system, one user's memories, and the
error for a file that is not of the format named.

Imports nothing of kvmem but the error tree, so each reader stands on it alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from kvmem.errors import NotOfFormat

SourceName = Literal["openwebui", "librechat", "mem0"]


def not_of_format(path: Path, where: str | None, problem: str) -> NotOfFormat:
    """The error naming the file, the place in it (a line, a record, a table) and the problem."""
    place = f"{path}, {where}" if where else str(path)
    return NotOfFormat(f"{place}: {problem}")


def epoch(text: str) -> float | None:
    """An ISO 8601 time as epoch seconds (a time without offset taken as UTC), or None."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


@dataclass(frozen=True)
class ForeignMemory:
    """One memory as another system holds it.

    `key` is None for free text (Open WebUI, mem0), which goes into one key line by line;
    LibreChat's entries carry their own. `at` orders a user's memories (epoch seconds, the
    time it was written, 0 when unknown); `where` says where it is in the file, for a report.
    """

    text: str
    at: float
    where: str
    key: str | None = None


@dataclass(frozen=True)
class UserMemories:
    """All of one user's memories in the file, oldest first."""

    user_id: str
    memories: tuple[ForeignMemory, ...]
