"""Reading an export's JSON record by record, never the whole file at once.

Three shapes: one JSON document per line (what `mongoexport` writes by default), one array
(`mongoexport --jsonArray`, mem0's list), or an object whose one list holds the records (mem0's
`{"results": [...]}`). Arrays and objects are parsed incrementally (ijson, its C backend), so a
file of a gigabyte costs a record's memory, not the file's. Each record comes with where it is
(`line N`, `record N`), for an error that a person can find in the file.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import ijson

from kvmem.importers.records import not_of_format

# (where in the file, the record)
Located = tuple[str, Any]


def first_byte(file: BinaryIO) -> bytes:
    """The first byte that is not whitespace (or a UTF-8 byte order mark); the file is left
    at its start (after the mark)."""
    start = 3 if file.read(3) == b"\xef\xbb\xbf" else 0
    file.seek(start)
    while chunk := file.read(4096):
        stripped = chunk.lstrip()
        if stripped:
            file.seek(start)
            return stripped[:1]
    file.seek(start)
    return b""


def json_lines(path: Path, file: BinaryIO, on_read: Callable[[int], None]) -> Iterator[Located]:
    """One JSON document per line; blank lines are skipped."""
    for number, line in enumerate(file, 1):
        if number % 1000 == 0:
            on_read(file.tell())
        if not line.strip():
            continue
        try:
            yield f"line {number}", json.loads(line)
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
            raise not_of_format(
                path, f"line {number}", f"not a JSON document ({exc}); expected one per line"
            ) from exc
    on_read(file.tell())


def json_items(
    path: Path, file: BinaryIO, prefix: str, on_read: Callable[[int], None]
) -> Iterator[Located]:
    """The items of the array at `prefix` (`item`: the top-level array; `results.item`: the
    list under the top-level key `results`), parsed incrementally."""
    number = 0
    try:
        for number, item in enumerate(ijson.items(file, prefix, use_float=True), 1):
            if number % 1000 == 0:
                on_read(file.tell())
            yield f"record {number}", item
    except (ijson.JSONError, UnicodeDecodeError) as exc:
        raise not_of_format(path, f"after record {number}", f"not valid JSON ({exc})") from exc
    on_read(file.tell())


def has_top_key(path: Path, key: str) -> bool:
    """Whether the top-level object of the JSON file holds `key` (read as a stream)."""
    with path.open("rb") as file:
        try:
            for prefix, event, value in ijson.parse(file):
                if prefix == "" and event == "map_key" and value == key:
                    return True
        except (ijson.JSONError, UnicodeDecodeError) as exc:
            raise not_of_format(path, None, f"not valid JSON ({exc})") from exc
    return False
