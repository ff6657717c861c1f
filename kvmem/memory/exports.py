"""The memory document (`kvmem.memory.v1`): what export writes and import reads.

The same document travels over REST (`GET /memory/export`, `POST /memory/import`) and the
CLI (`kvmem memory export|import`). Import needs only `memories[].key` and `.value`, and reads
`.expires_at` when given (an entry that has expired since is not imported); the other
fields (times, sources, `user`, `preferences`) are ignored, so a document can move to
another user or server. The older CLI shape `{"user", "memories"}` (no `format`) is read
too.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, StrictStr, ValidationError

from kvmem.entries import Snapshot, iso, utcnow
from kvmem.errors import BadRequest, describe_problems
from kvmem.memory.expiry import parse_expires_at

FORMAT = "kvmem.memory.v1"


def export_document(user_id: str, snapshot: Snapshot) -> dict[str, Any]:
    """The user's entries (oldest first) and opt-out switch as a `kvmem.memory.v1` document."""
    return {
        "format": FORMAT,
        "user": user_id,
        "exported_at": iso(utcnow()),
        "preferences": {"memories": snapshot.memories_enabled},
        "memories": [entry.as_json() for entry in snapshot.entries],
    }


class DocumentEntry(BaseModel):
    """One entry of an imported document: `key`, `value` and `expires_at` are read."""

    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)
    key: StrictStr
    value: StrictStr
    expires_at: StrictStr | None = None


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
