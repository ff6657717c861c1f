"""LibreChat's memories: `mongoexport --collection memoryentries` output.

One document per line (the default) or one array (`--jsonArray`), in MongoDB's extended JSON,
relaxed (`{"$date": "2026-06-01T10:00:00.123Z"}`, mongoexport's default) or canonical
(`{"$date": {"$numberLong": "..."}}`, `{"$numberInt": "12"}`). Of each entry: `userId`
(`{"$oid": hex}`, or a string), `key`, `value`, `updated_at`, `tokenCount` (checked, not used:
kvmem counts tokens itself). Other fields (`_id`, `__v`, `tenantId`) are ignored. The user id
is the `userId` hex, which is what LibreChat's `{{LIBRECHAT_USER_ID}}` sends kvmem.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kvmem.importers.json_stream import Located, first_byte, json_items, json_lines
from kvmem.importers.records import epoch, not_of_format
from kvmem.importers.staging import StagedRow, Staging

OBJECT_ID = re.compile(r"[0-9a-fA-F]{24}")
NUMBER_KEYS = ("$numberInt", "$numberLong", "$numberDouble", "$numberDecimal")


class FieldProblem(ValueError):
    """One field of a record is not what LibreChat writes."""


def read_librechat(path: Path, on_read: Callable[[int], None]) -> Staging:
    """Every entry of the export, checked and parked by user (see `staging`)."""
    staging = Staging()
    try:
        staging.load(_rows(path, on_read))
    except BaseException:
        staging.close()
        raise
    return staging


def _rows(path: Path, on_read: Callable[[int], None]) -> Iterator[StagedRow]:
    with path.open("rb") as file:
        first = first_byte(file)
        if first == b"[":
            records: Iterator[Located] = json_items(path, file, "item", on_read)
        elif first in (b"{", b""):  # mongoexport writes nothing for an empty collection
            records = json_lines(path, file, on_read)
        else:
            raise not_of_format(
                path, None, "not a mongoexport file (JSON lines or one JSON array of entries)"
            )
        for where, record in records:
            try:
                yield entry_row(record, where)
            except FieldProblem as exc:
                raise not_of_format(path, where, f"{exc} (a LibreChat memory entry)") from exc


def entry_row(record: Any, where: str) -> StagedRow:
    """One `memoryentries` document as a staged row, or `FieldProblem`."""
    if not isinstance(record, dict):
        raise FieldProblem("not a JSON object")
    key, value = record.get("key"), record.get("value")
    if not isinstance(key, str):
        raise FieldProblem('"key" must be a string')
    if not isinstance(value, str):
        raise FieldProblem('"value" must be a string')
    if "tokenCount" in record:
        _number(record["tokenCount"], "tokenCount")
    return (_user_id(record.get("userId")), key, value, _date(record.get("updated_at")), where)


def _user_id(value: Any) -> str:
    if isinstance(value, dict) and set(value) == {"$oid"}:
        value = value["$oid"]
        if isinstance(value, str) and OBJECT_ID.fullmatch(value):
            return value.lower()
        raise FieldProblem('"userId" {"$oid": ...} must hold 24 hexadecimal digits')
    if isinstance(value, str) and value:
        return value
    raise FieldProblem('"userId" must be {"$oid": "<24 hex digits>"} or a string')


def _date(value: Any) -> float:
    """`updated_at` as epoch seconds (0 when absent)."""
    if value is None:
        return 0.0
    if isinstance(value, dict) and set(value) == {"$date"}:
        value = value["$date"]
        if isinstance(value, dict) and set(value) == {"$numberLong"}:
            value = _number(value, "updated_at")
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value) / 1000  # milliseconds since the epoch
    seconds = epoch(value) if isinstance(value, str) else None
    if seconds is not None:
        return seconds
    raise FieldProblem('"updated_at" must be {"$date": "<ISO 8601>"} or {"$date": milliseconds}')


def _number(value: Any, field: str) -> float:
    if isinstance(value, dict) and len(value) == 1 and next(iter(value)) in NUMBER_KEYS:
        value = next(iter(value.values()))
        try:
            return float(value)
        except (TypeError, ValueError):
            pass
    elif isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise FieldProblem(f'"{field}" must be a number')
