"""Open WebUI's memories: its SQLite database (`webui.db`), opened read-only.

Its `memory` table holds free text per Open WebUI user id (`id`, `user_id`, `content`,
`created_at`, `updated_at`, epoch seconds); releases since mid-2026 add `type`, `path` and
`meta`, which are not needed here and may be there or not. The table is checked before anything
is read (the columns, then one pass over the types of every row, which SQLite does not
enforce), so that a bad file is refused before any user's memory is written. The rows are then
read through one cursor ordered by user and creation time, a user at a time: a database of a
gigabyte is never held in memory (SQLite sorts in its own temporary storage when the table has
no index to walk).
"""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from kvmem.importers.records import ForeignMemory, UserMemories, not_of_format

TABLE = "memory"
COLUMNS = ("id", "user_id", "content", "created_at", "updated_at")
FETCH = 1000

# A row whose values SQLite would hand back as something the importer cannot read.
_BAD_ROW = (
    "SELECT rowid, id FROM memory WHERE typeof(user_id) != 'text' "
    "OR typeof(content) NOT IN ('text', 'null') "
    "OR typeof(created_at) NOT IN ('integer', 'real', 'null') LIMIT 1"
)


class OpenWebUIDatabase:
    """Open WebUI's `webui.db`, read-only: its users' memories, one user at a time."""

    unowned = 0  # every row has its user_id (checked)

    def __init__(self, path: Path) -> None:
        self.path = path
        # mode=ro: Open WebUI may be running on it; nothing here may change it.
        uri = f"{path.resolve().as_uri()}?mode=ro"
        try:
            self.connection = sqlite3.connect(uri, uri=True)
            self._check()
        except sqlite3.DatabaseError as exc:
            raise not_of_format(
                path, None, f"not an Open WebUI database (SQLite says: {exc})"
            ) from exc

    def _check(self) -> None:
        found = self.connection.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (TABLE,)
        ).fetchone()
        if found is None:
            raise not_of_format(self.path, None, f"no table {TABLE!r}: not Open WebUI's webui.db")
        columns = {row[1] for row in self.connection.execute(f"PRAGMA table_info({TABLE})")}
        missing = [column for column in COLUMNS if column not in columns]
        if missing:
            raise not_of_format(
                self.path,
                f"table {TABLE!r}",
                f"no column {', '.join(map(repr, missing))} (Open WebUI's has {', '.join(COLUMNS)})",
            )
        bad = self.connection.execute(_BAD_ROW).fetchone()
        if bad is not None:
            raise not_of_format(
                self.path,
                f"table {TABLE!r}, row {bad[0]} (id {str(bad[1])[:80]!r})",
                "user_id must be text, content text and created_at a number of seconds",
            )

    def user_count(self, only: str | None) -> int:
        """How many users have memories (1 or 0 with `only`)."""
        if only is not None:
            query = "SELECT count(*) FROM (SELECT 1 FROM memory WHERE user_id = ? LIMIT 1)"
            return int(self.connection.execute(query, (only,)).fetchone()[0])
        return int(
            self.connection.execute("SELECT count(DISTINCT user_id) FROM memory").fetchone()[0]
        )

    def users(self, only: str | None = None) -> Iterator[UserMemories]:
        """Each user's memories, oldest first (by `created_at`, then id); empty ones left out,
        since they hold nothing to remember."""
        where = "WHERE user_id = ?" if only is not None else ""
        cursor = self.connection.execute(
            f"SELECT user_id, id, content, created_at FROM memory {where} "
            "ORDER BY user_id, created_at, id",
            (only,) if only is not None else (),
        )
        cursor.arraysize = FETCH
        rows = itertools.chain.from_iterable(iter(cursor.fetchmany, []))
        for user_id, group in itertools.groupby(rows, key=lambda row: row[0]):
            memories = tuple(
                ForeignMemory(
                    text=content, at=float(created or 0), where=f"memory id {str(row_id)[:80]}"
                )
                for _, row_id, content, created in group
                if content is not None and content.strip()
            )
            if memories:
                yield UserMemories(user_id, memories)

    def close(self) -> None:
        """Close the database."""
        self.connection.close()
