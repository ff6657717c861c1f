"""The memory document (`kvmem.memory.v1`): what export writes and import reads.

The same document travels over REST (`GET /memory/export`, `POST /memory/import`) and the
CLI (`kvmem memory export|import`). Import needs only `memories[].key` and `.value`, and reads
`.expires_at` when given (an entry that has expired since is not imported) and `.scope` (the
layer it belongs to: null or absent for the person's own; `read_layers`); the other
fields (times, sources, `user`, `preferences`) are ignored, so a document can move to
another user or server. The older CLI shape `{"user", "memories"}` (no `format`) is read
too.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, StrictStr, ValidationError

from kvmem.entries import Entry, Snapshot, iso, utcnow
from kvmem.errors import BadRequest, describe_problems
from kvmem.memory.expiry import parse_expires_at
from kvmem.memory.imports import LayerImport
from kvmem.memory.rules import OWN, MemoryRules

FORMAT = "kvmem.memory.v1"


def export_document(user_id: str, snapshot: Snapshot, *, scoped: bool = False) -> dict[str, Any]:
    """The user's entries (oldest first) and opt-out switch as a `kvmem.memory.v1` document;
    `scoped` (a server that keeps scopes): each entry says its `scope` (null: the person's
    own), so that an import puts it back where it was."""
    return {
        "format": FORMAT,
        "user": user_id,
        "exported_at": iso(utcnow()),
        "preferences": {"memories": snapshot.memories_enabled},
        "memories": [_exported(entry, scoped) for entry in snapshot.entries],
    }


def _exported(entry: Entry, scoped: bool) -> dict[str, Any]:
    shown = entry.as_json()
    if scoped:
        shown["scope"] = entry.scope or None
    return shown


class DocumentEntry(BaseModel):
    """One entry of an imported document: `key`, `value` and `expires_at` are read."""

    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)
    key: StrictStr
    value: StrictStr
    expires_at: StrictStr | None = None
    scope: StrictStr | None = None


class MemoryDocument(BaseModel):
    """An imported document: `memories` is required, `format` (when given) must be ours."""

    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)
    format: Literal["kvmem.memory.v1"] | None = None
    memories: list[DocumentEntry]


def read_document(data: Any) -> list[tuple[str, str]]:
    """The (key, value) pairs of a parsed JSON document, or `BadRequest` saying what is wrong."""
    return [(entry.key, entry.value) for entry in _document(data).memories]


def read_expiries(data: Any) -> dict[str, datetime]:
    """When the document's entries expire, by key (those that do); `BadRequest` for a time
    that is neither a date nor an RFC 3339 date-time."""
    return {
        entry.key: parse_expires_at(entry.expires_at, f"memories[{index}].expires_at")
        for index, entry in enumerate(_document(data).memories)
        if entry.expires_at is not None
    }


def read_layers(data: Any, rules: MemoryRules, scope: str | None) -> dict[str, LayerImport]:
    """The document's entries by layer, in document order: each in the layer its `scope`
    names (null or absent: the person's own), or, when the request names a `scope`, all in
    that one (an entry naming another is refused). `BadRequest` for a malformed scope, or
    any scope on a server that keeps none (`MemoryRules.scope`)."""
    document = _document(data)
    named_here = None if scope is None else rules.scope(scope)
    # A whole document speaks for the own layer, even empty; a scoped one for its scope.
    items: dict[str, list[tuple[str, str]]] = {named_here if named_here is not None else OWN: []}
    positions: dict[str, list[int]] = {}
    expires: dict[str, dict[str, datetime]] = {}
    for index, entry in enumerate(document.memories):
        try:
            layer = rules.scope(entry.scope)
        except BadRequest as exc:
            raise BadRequest(f"memories[{index}].scope: {exc.message}") from exc
        if named_here is not None:
            if entry.scope is not None and layer != named_here:
                raise BadRequest(
                    f"memories[{index}] belongs to scope {entry.scope!r}, not to {scope!r}, "
                    "the scope this import names"
                )
            layer = named_here
        items.setdefault(layer, []).append((entry.key, entry.value))
        positions.setdefault(layer, []).append(index)
        if entry.expires_at is not None:
            at = parse_expires_at(entry.expires_at, f"memories[{index}].expires_at")
            expires.setdefault(layer, {})[entry.key] = at
    return {
        layer: LayerImport(
            layer_items, expires=expires.get(layer, {}), positions=positions.get(layer, [])
        )
        for layer, layer_items in items.items()
    }


def _document(data: Any) -> MemoryDocument:
    if not isinstance(data, dict):
        raise BadRequest(
            f'the document must be a JSON object {{"format": "{FORMAT}", "memories": '
            '[{"key": ..., "value": ...}, ...]}'
        )
    try:
        document = MemoryDocument.model_validate(data)
    except ValidationError as exc:
        raise BadRequest(f"invalid memory document: {describe_problems(exc, 'document')}") from exc
    return document
