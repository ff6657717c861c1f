"""Grouping an export's records by user with bounded memory: a temporary SQLite table.

LibreChat's and mem0's exports come in no useful order (mongoexport writes the collection's
natural order), so every record is first written to a table in a temporary file, which the
readers fill as they parse, and then read back one user at a time, ordered by user and time.
The whole file is read, and so checked, before any user is written: a bad record at its end
still writes nothing. The temporary file is removed when the import ends.
"""

from __future__ import annotations

import itertools
import sqlite3
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from kvmem.importers.records import ForeignMemory, UserMemories

BATCH = 1000
# (user id, key or None, text, at, where)
StagedRow = tuple[str, str | None, str, float, str]


class Staging:
    """Records parked in a temporary database until they are read back by user, and how many
    records belonged to no user (`unowned`: counted by the reader, never dropped silently)."""

    unowned: int = 0

    def __init__(self) -> None:
        self._folder = tempfile.TemporaryDirectory(prefix="kvmem-import-")
        self.connection = sqlite3.connect(Path(self._folder.name) / "staging.db")
        # A scratch file: nothing to keep if the process dies.
        self.connection.execute("PRAGMA journal_mode = OFF")
        self.connection.execute("PRAGMA synchronous = OFF")
        self.connection.execute(
            "CREATE TABLE staged (seq INTEGER PRIMARY KEY, user_id TEXT NOT NULL, key TEXT, "
            "text TEXT NOT NULL, at REAL NOT NULL, location TEXT NOT NULL)"
        )

    def load(self, rows: Iterable[StagedRow]) -> None:
        """Park `rows` (in batches, in one transaction), then index them by user."""
        insert = "INSERT INTO staged (user_id, key, text, at, location) VALUES (?, ?, ?, ?, ?)"
        iterator = iter(rows)
        with self.connection:
            while batch := list(itertools.islice(iterator, BATCH)):
                self.connection.executemany(insert, batch)
            self.connection.execute("CREATE INDEX staged_by_user ON staged (user_id, at, seq)")

    def user_count(self, only: str | None) -> int:
        """How many users the records belong to (1 or 0 with `only`)."""
        if only is not None:
            query = "SELECT count(*) FROM (SELECT 1 FROM staged WHERE user_id = ? LIMIT 1)"
            return int(self.connection.execute(query, (only,)).fetchone()[0])
        query = "SELECT count(DISTINCT user_id) FROM staged"
        return int(self.connection.execute(query).fetchone()[0])

    def users(self, only: str | None = None) -> Iterator[UserMemories]:
        """Each user's memories, oldest first (then in file order)."""
        where = "WHERE user_id = ?" if only is not None else ""
        cursor = self.connection.execute(
            f"SELECT user_id, key, text, at, location FROM staged {where} "
            "ORDER BY user_id, at, seq",
            (only,) if only is not None else (),
        )
        cursor.arraysize = BATCH
        rows = itertools.chain.from_iterable(iter(cursor.fetchmany, []))
        for user_id, group in itertools.groupby(rows, key=lambda row: row[0]):
            yield UserMemories(
                user_id,
                tuple(
                    ForeignMemory(text=text, at=at, where=location, key=key)
                    for _, key, text, at, location in group
                ),
            )

    def close(self) -> None:
        """Close and remove the temporary database."""
        self.connection.close()
        self._folder.cleanup()
