"""The JSON of a memory write's outcome: one shape for the REST routes, the CLI and MCP.

A set (`Written`), a revert (`Reverted`) and an accepted proposal (`Accepted`) all answer
`{"memory": <the entry now, or null once deleted>, "total_tokens", "token_limit"}`; an import
(`Imported`) answers its counts with the same totals. The outcomes are read through the
fields they share (protocols, not the store's classes), so this module imports nothing of
kvmem and sits on the ground floor.
"""

from __future__ import annotations

from typing import Any, Protocol


class _Entry(Protocol):
    def as_json(self) -> dict[str, Any]: ...


class WriteOutcome(Protocol):
    """What a set, a revert and an accepted proposal share."""

    @property
    def entry(self) -> _Entry | None: ...

    @property
    def total_tokens(self) -> int: ...


class ImportOutcome(Protocol):
    """What an import reports."""

    @property
    def imported(self) -> int: ...

    @property
    def deleted(self) -> int: ...

    @property
    def total_tokens(self) -> int: ...


def written_json(outcome: WriteOutcome, token_limit: int | None) -> dict[str, Any]:
    """The entry now (None when the write deleted it), the user's total and the limit (None:
    no limit)."""
    return {
        "memory": outcome.entry.as_json() if outcome.entry is not None else None,
        "total_tokens": outcome.total_tokens,
        "token_limit": token_limit,
    }


def imported_json(outcome: ImportOutcome, token_limit: int | None) -> dict[str, Any]:
    """How many entries an import wrote and deleted, the user's total and the limit."""
    return {
        "imported": outcome.imported,
        "deleted": outcome.deleted,
        "total_tokens": outcome.total_tokens,
        "token_limit": token_limit,
    }
