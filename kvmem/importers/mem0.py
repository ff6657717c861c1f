"""mem0's memories: the JSON of `Memory.get_all` (`{"results": [...]}`) or a list of them.

Each memory: `{"id", "memory", "user_id", "created_at", "updated_at", ...}` (ISO 8601 times;
`hash`, `metadata`, `agent_id`, `run_id` and the like are ignored). The text is free, as
Open WebUI's is. A memory without `user_id` belongs to an agent or a run, not to a person: it
cannot be placed, and is counted as left out (`unowned`), never dropped silently.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kvmem.importers.json_stream import Located, first_byte, has_top_key, json_items
from kvmem.importers.records import epoch, not_of_format
from kvmem.importers.staging import StagedRow, Staging


def read_mem0(path: Path, on_read: Callable[[int], None]) -> Staging:
    """Every memory of the file, checked and parked by user (see `staging`)."""
    export = Staging()
    try:
        export.load(_rows(path, export, on_read))
    except BaseException:
        export.close()
        raise
    return export


def _rows(path: Path, export: Staging, on_read: Callable[[int], None]) -> Iterator[StagedRow]:
    with path.open("rb") as file:
        first = first_byte(file)
        if first == b"[":
            records: Iterator[Located] = json_items(path, file, "item", on_read)
        elif first == b"{":
            if not has_top_key(path, "results"):
                raise not_of_format(path, None, 'no "results" list (mem0\'s get_all answer)')
            records = json_items(path, file, "results.item", on_read)
        else:
            raise not_of_format(path, None, 'not mem0\'s JSON ({"results": [...]} or a list)')
        for where, record in records:
            problem = _problem(record)
            if problem:
                raise not_of_format(path, where, f"{problem} (a mem0 memory)")
            if record.get("user_id") is None:
                export.unowned += 1
                continue
            yield (record["user_id"], None, record["memory"], _time(record), where)


def _problem(record: Any) -> str | None:
    if not isinstance(record, dict):
        return "not a JSON object"
    if not isinstance(record.get("memory"), str):
        return '"memory" must be a string'
    user_id = record.get("user_id")
    if user_id is not None and not (isinstance(user_id, str) and user_id):
        return '"user_id" must be a string'
    for field in ("created_at", "updated_at"):
        value = record.get(field)
        if value is not None and (not isinstance(value, str) or epoch(value) is None):
            return f'"{field}" must be an ISO 8601 time'
    return None


def _time(record: dict[str, Any]) -> float:
    """When the memory was made (epoch seconds; 0 when mem0 did not say)."""
    created = record.get("created_at")
    return (epoch(created) or 0.0) if created is not None else 0.0
