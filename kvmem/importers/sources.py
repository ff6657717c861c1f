"""The three sources behind one shape: a file opened as `--from` names it, giving its users'
memories one user at a time (`Source`), or `NotOfFormat` before anything is written."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

from kvmem.importers.librechat import read_librechat
from kvmem.importers.mem0 import read_mem0
from kvmem.importers.openwebui import OpenWebUIDatabase
from kvmem.importers.records import SourceName, UserMemories

FREE_TEXT: frozenset[SourceName] = frozenset({"openwebui", "mem0"})


class Source(Protocol):
    """A file's memories, grouped by user."""

    unowned: int  # memories that belong to no user (mem0's of an agent or a run), left out

    def user_count(self, only: str | None) -> int:
        """How many users it holds memories of (1 or 0 with `only`)."""
        ...

    def users(self, only: str | None = None) -> Iterator[UserMemories]:
        """Each user's memories, oldest first (only `only`'s, when given)."""
        ...

    def close(self) -> None:
        """Let go of the file and anything made to read it."""
        ...


def open_source(name: SourceName, path: Path, on_read: Callable[[int], None]) -> Source:
    """The file at `path` read as `name`'s format; `on_read` hears how many bytes of an export
    have been read (Open WebUI's database is queried, not read through)."""
    if name == "openwebui":
        return OpenWebUIDatabase(path)
    if name == "librechat":
        return read_librechat(path, on_read)
    return read_mem0(path, on_read)
