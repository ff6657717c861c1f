"""The JSON of a memory write's outcome: one shape for the REST routes, the CLI and MCP.

A set (`Written`), a revert (`Reverted`) and an accepted proposal (`Accepted`) all answer
`{"memory": <the entry now, or null once deleted>, "total_tokens", "token_limit"}`; an import
(`Imported`) answers its counts with the same totals. An answer for a scope says so with a
top-level `"scope"` (`in_layer`); the person's own layer's are as they were before scopes.
The outcomes are read through the fields they share (protocols, not the store's classes).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from kvmem.memory.rules import OWN, MemoryRules


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


def in_layer(body: dict[str, Any], scope: str) -> dict[str, Any]:
    """`body` as an answer for the layer `scope`: with a top-level `"scope"` when that is a
    scope, unchanged for the person's own layer."""
    return body if scope == OWN else {**body, "scope": scope}


def imported_layers_json(
    results: Mapping[str, ImportOutcome], rules: MemoryRules, scope: str
) -> dict[str, Any]:
    """What an import answers: the counts and totals of the layer it named (`scope`), or of
    the person's own layer and, on a server that keeps scopes, under `"scopes"` those of each
    scope the document held, by name."""
    if scope != OWN or rules.scoped is None:
        return in_layer(imported_json(results[scope], rules.layer(scope).token_limit), scope)
    return {
        **imported_json(results[OWN], rules.token_limit),
        "scopes": [
            {"scope": layer, **imported_json(results[layer], rules.layer(layer).token_limit)}
            for layer in sorted(results)
            if layer != OWN
        ],
    }
