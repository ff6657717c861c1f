"""Filling a kvmem database with many users fast, straight into the tables (for
`tests.bench.scale`): executemany on SQLite, COPY on PostgreSQL, the schema from the
migrations. Each user has the same shape: entries near `tokenLimit`, a history of which
most is past `keep_days`, and conversations with their messages. Ids grow with time, as
kvmem writes them: every expired change is inserted before every kept one.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

from kvmem.db.migrate import upgrade

CHUNK = 5_000  # users per executemany / COPY call


@dataclass(frozen=True)
class Shape:
    """What each user holds."""

    entries: int = 5
    changes: int = 15
    expired: int = 10  # of `changes`, past keep_days
    conversations: int = 2
    messages: int = 10  # per conversation
    keep_days: int = 90
    entry_value: str = ""
    entry_tokens: int = 0
    change_value: str = ""  # the old and new value of each change
    # Every this-many users (0: none) have an entry already due to expire (an hour ago: the
    # sweep at start expires it) and one that expires in a day (the reads check it).
    expiring_every: int = 0
    message: str = "Could you suggest a quick dinner with what is in my fridge? " * 3

    @property
    def rows_per_user(self) -> int:
        """Rows one user adds over all tables."""
        return 1 + self.entries + self.changes + self.conversations * (1 + self.messages)


def user_id(number: int) -> str:
    """The id of filled user `number`."""
    return f"u{number:08d}"


def conversation_id(number: int, index: int, shape: Shape) -> str:
    """The id of conversation `index` of user `number` (a canonical UUID, as kvmem's)."""
    return str(uuid.UUID(int=number * shape.conversations + index + 1))


def _chunks(numbers: Sequence[int]) -> Iterator[Sequence[int]]:
    for start in range(0, len(numbers), CHUNK):
        yield numbers[start : start + CHUNK]


def _tables(
    numbers: Sequence[int],
    shape: Shape,
    now: datetime,
    time: Any = lambda t: t,
) -> Iterator[tuple[str, list[str], Iterable[tuple[Any, ...]]]]:
    """(table, columns, rows) in insertion order, a chunk of users at a time; times as
    `time` makes them (SQLite's text, once per distinct moment)."""
    recent = time(now - timedelta(days=1))
    old = time(now - timedelta(days=shape.keep_days + 30))
    hours = [time(now - timedelta(days=1, hours=c)) for c in range(shape.conversations)]
    kept = shape.changes - shape.expired
    due, later = time(now - timedelta(hours=1)), time(now + timedelta(days=1))

    def expires(number: int, entry: int) -> Any:
        if not shape.expiring_every or number % shape.expiring_every:
            return None
        return {shape.entries - 1: due, shape.entries - 2: later}.get(entry)

    for chunk in _chunks(numbers):
        yield (
            "users",
            ["id", "created_at", "memories_enabled", "memory_version"],
            ((user_id(n), old, True, 0) for n in chunk),
        )
        yield (
            "memory_entries",
            [
                "user_id",
                "key",
                "value",
                "token_count",
                "source",
                "created_at",
                "updated_at",
                "expires_at",
            ],
            (
                (
                    user_id(n),
                    f"k{e}",
                    shape.entry_value,
                    shape.entry_tokens,
                    "manual",
                    old,
                    recent,
                    expires(n, e),
                )
                for n in chunk
                for e in range(shape.entries)
            ),
        )
        yield (
            "conversations",
            ["id", "user_id", "title", "created_at", "updated_at"],
            (
                (conversation_id(n, c, shape), user_id(n), f"Dinner ideas {c}", old, hours[c])
                for n in chunk
                for c in range(shape.conversations)
            ),
        )
        yield (
            "messages",
            ["conversation_id", "role", "content", "created_at"],
            (
                (
                    conversation_id(n, c, shape),
                    "user" if m % 2 == 0 else "assistant",
                    shape.message,
                    recent,
                )
                for n in chunk
                for c in range(shape.conversations)
                for m in range(shape.messages)
            ),
        )
    for at, count in ((old, shape.expired), (recent, kept)):
        for chunk in _chunks(numbers):
            yield (
                "memory_changes",
                [
                    "user_id",
                    "key",
                    "op",
                    "old_value",
                    "new_value",
                    "source",
                    "conversation_id",
                    "at",
                ],
                (
                    (
                        user_id(n),
                        f"k{j % max(shape.entries, 1)}",
                        "set",
                        shape.change_value,
                        shape.change_value,
                        "manual",
                        None,
                        at,
                    )
                    for n in chunk
                    for j in range(count)
                ),
            )


def fill(url: str, numbers: Sequence[int], shape: Shape, now: datetime | None = None) -> None:
    """Migrate the database at `url`, then add users `numbers` with `shape`."""
    engine = create_engine(url)
    try:
        upgrade(engine)
    finally:
        engine.dispose()
    now = now or datetime.now(UTC)
    if make_url(url).get_backend_name() == "sqlite":
        _fill_sqlite(make_url(url).database or "", numbers, shape, now)
    else:
        _fill_postgres(url, numbers, shape, now)


def _sqlite_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def _fill_sqlite(path: str, numbers: Sequence[int], shape: Shape, now: datetime) -> None:
    """The rows are made by SQLite itself (`INSERT ... SELECT` over a table of user numbers
    and a small sequence), with the indexes built once at the end: no Python per row."""
    recent = _sqlite_time(now - timedelta(days=1))
    old = _sqlite_time(now - timedelta(days=shape.keep_days + 30))
    width = max(shape.entries, shape.changes, shape.conversations, shape.messages, 1)
    uid = "printf('u%08d', n)"
    cid = f"printf('00000000-0000-0000-0000-%012x', n * {shape.conversations} + c.i + 1)"
    values = {
        "value": shape.entry_value,
        "tokens": shape.entry_tokens,
        "old": old,
        "change": shape.change_value,
        "recent": recent,
        "message": shape.message,
        "due": _sqlite_time(now - timedelta(hours=1)),
        "later": _sqlite_time(now + timedelta(days=1)),
        "every": shape.expiring_every,
    }
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=OFF")
        connection.execute("PRAGMA cache_size=-262144")  # 256 MiB
        connection.execute("BEGIN")
        indexes = connection.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"
        ).fetchall()
        for name, _sql in indexes:
            connection.execute(f'DROP INDEX "{name}"')
        connection.execute("CREATE TEMP TABLE nums (n INTEGER PRIMARY KEY)")
        connection.executemany("INSERT INTO nums VALUES (?)", ((n,) for n in numbers))
        connection.execute("CREATE TEMP TABLE seq (i INTEGER PRIMARY KEY, at TEXT)")
        connection.executemany(
            "INSERT INTO seq VALUES (?, ?)",
            ((i, _sqlite_time(now - timedelta(days=1, hours=i))) for i in range(width)),
        )
        statements = [
            f"INSERT INTO users (id, created_at, memories_enabled, memory_version) "
            f"SELECT {uid}, :old, 1, 0 FROM nums ORDER BY n",
            f"INSERT INTO memory_entries (user_id, key, value, token_count, source, created_at, "
            f"updated_at, expires_at) SELECT {uid}, 'k' || e.i, :value, :tokens, 'manual', :old, "
            f":recent, CASE WHEN :every = 0 OR n % :every THEN NULL "
            f"WHEN e.i = {shape.entries - 1} THEN :due WHEN e.i = {shape.entries - 2} THEN :later "
            f"END FROM nums, seq AS e WHERE e.i < {shape.entries} ORDER BY n, e.i",
            f"INSERT INTO conversations (id, user_id, title, created_at, updated_at) "
            f"SELECT {cid}, {uid}, 'Dinner ideas ' || c.i, :old, c.at "
            f"FROM nums, seq AS c WHERE c.i < {shape.conversations} ORDER BY n, c.i",
            f"INSERT INTO messages (conversation_id, role, content, created_at) "
            f"SELECT {cid}, CASE WHEN m.i % 2 THEN 'assistant' ELSE 'user' END, :message, :recent "
            f"FROM nums, seq AS c, seq AS m WHERE c.i < {shape.conversations} "
            f"AND m.i < {shape.messages} ORDER BY n, c.i, m.i",
        ]
        changes = (
            f"INSERT INTO memory_changes (user_id, key, op, old_value, new_value, source, "
            f"conversation_id, at) SELECT {uid}, 'k' || (j.i % {max(shape.entries, 1)}), 'set', "
            f":change, :change, 'manual', NULL, {{at}} FROM nums, seq AS j WHERE j.i < {{count}} "
            f"ORDER BY n, j.i"
        )
        # Every expired change before every kept one: ids grow with time.
        statements.append(changes.format(at=":old", count=shape.expired))
        statements.append(changes.format(at=":recent", count=shape.changes - shape.expired))
        for statement in statements:
            connection.execute(statement, values)
        for _name, sql in indexes:
            connection.execute(sql)
        connection.execute("COMMIT")
        connection.execute("ANALYZE")
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        connection.close()


def _fill_postgres(url: str, numbers: Sequence[int], shape: Shape, now: datetime) -> None:
    import psycopg

    address = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(address) as connection, connection.cursor() as cursor:
        for table, columns, rows in _tables(numbers, shape, now):
            with cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
        connection.commit()
        connection.autocommit = True
        cursor.execute("ANALYZE")
