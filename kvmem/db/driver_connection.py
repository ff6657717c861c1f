"""SQLite's writes without SQLAlchemy's per-statement work: prebuilt Core statements, compiled
once, run straight on the pooled sqlite3 connection.

SQLite has one writer at a time, so whatever a write spends while it holds the writer lock
is spent by every write queued behind it. Through SQLAlchemy's `Connection.execute` a write's
eight or so statements cost ~1 ms of Python (execution context, events, result objects)
around ~0.1 ms of SQL. `DriverConnection` offers the part of `Connection` that the writes
use, `execute(statement, params)` and a result with `first`, `scalar`, `scalar_one`, `all`,
`rowcount` and `inserted_primary_key`, so the same write code (`MemoryStore`'s, `lock_user`,
`ChangeLog.record`/`prune`, `check_not_erased`) runs on either. Each statement is compiled
once (per set of parameter names); values go through the column types' bind and result
processors, as SQLAlchemy applies them; the driver's errors are raised as SQLAlchemy's
(`DBAPIError.instance`), so callers see the same exceptions. Only statements with bound
parameters belong here (no `IN` lists, no executemany). `Database.writing_prebuilt` hands
it out; it knows nothing of memory entries.
"""

from __future__ import annotations

import functools
import sqlite3
from collections import namedtuple
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.exc import DBAPIError, NoResultFound
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler


@dataclass(frozen=True)
class _Compiled:
    """One statement as SQLite text, and how to bind and read it."""

    sql: str
    # Per `?`, in order: the parameter's name and bind processor, or (None, a fixed value).
    binds: tuple[tuple[str | None, Any, Callable[[Any], Any] | None], ...]
    row: Callable[..., tuple[Any, ...]] | None  # a named tuple type for a SELECT's rows
    results: tuple[Callable[[Any], Any] | None, ...]


@functools.cache
def _compile(statement: ClauseElement, keys: tuple[str, ...], dialect: Dialect) -> _Compiled:
    """`statement` compiled for SQLite with parameters `keys` (an INSERT without `values`
    names its columns by them)."""
    compiled = cast(SQLCompiler, statement.compile(dialect=dialect, column_keys=list(keys)))
    binds: list[tuple[str | None, Any, Callable[[Any], Any] | None]] = []
    for name in compiled.positiontup or ():
        bind = compiled.binds[name]
        process = bind.type.dialect_impl(dialect).bind_processor(dialect)
        if name in keys:
            binds.append((name, None, process))
        else:  # a literal of the statement's own (`memory_version + 1`)
            binds.append((None, process(bind.value) if process else bind.value, None))
    columns = getattr(statement, "selected_columns", None)
    if not getattr(statement, "is_select", False) or columns is None:
        return _Compiled(str(compiled), tuple(binds), None, ())
    row = namedtuple("Row", [column.key or "_" for column in columns], rename=True)  # type: ignore[misc]
    results = tuple(
        column.type.dialect_impl(dialect).result_processor(dialect, None) for column in columns
    )
    return _Compiled(str(compiled), tuple(binds), row, results)


class DriverResult:
    """What `DriverConnection.execute` returns: the rows read, or the rows changed."""

    def __init__(self, rows: list[tuple[Any, ...]], rowcount: int, lastrowid: int | None) -> None:
        self._rows = rows
        self.rowcount = rowcount
        self.inserted_primary_key = (lastrowid,)

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self._rows)

    def all(self) -> list[tuple[Any, ...]]:
        """Every row."""
        return self._rows

    def first(self) -> Any:
        """The first row, or None."""
        return self._rows[0] if self._rows else None

    def scalar(self) -> Any:
        """The first column of the first row, or None."""
        return self._rows[0][0] if self._rows else None

    def scalar_one(self) -> Any:
        """The first column of the one row; `NoResultFound` when there is none."""
        if not self._rows:
            raise NoResultFound("no row was found when one was required")
        return self._rows[0][0]


class DriverConnection:
    """A sqlite3 connection in a write transaction, running prebuilt Core statements."""

    def __init__(self, driver: sqlite3.Connection, dialect: Dialect) -> None:
        self.driver = driver
        self.dialect = dialect

    def execute(self, statement: ClauseElement, params: Mapping[str, Any]) -> DriverResult:
        """Run `statement` with `params`, as `Connection.execute` would."""
        compiled = _compile(statement, tuple(params), self.dialect)
        values = [
            (process(params[name]) if process else params[name]) if name is not None else fixed
            for name, fixed, process in compiled.binds
        ]
        try:
            cursor = self.driver.execute(compiled.sql, values)
            raw = cursor.fetchall() if compiled.row is not None else []
        except sqlite3.Error as exc:
            raise _wrapped(compiled.sql, values, exc) from exc
        if compiled.row is None:
            return DriverResult([], cursor.rowcount, cursor.lastrowid)
        make, results = compiled.row, compiled.results
        rows = [
            make(
                *(
                    process(value) if process else value
                    for process, value in zip(results, row, strict=True)
                )
            )
            for row in raw
        ]
        return DriverResult(rows, -1, None)

    def run(self, sql: str) -> None:
        """Run a statement of the transaction's own (BEGIN, SAVEPOINT, COMMIT...)."""
        try:
            self.driver.execute(sql)
        except sqlite3.Error as exc:
            raise _wrapped(sql, (), exc) from exc


# A connection that the prebuilt write statements run on: SQLAlchemy's or the driver's.
Executor = Connection | DriverConnection


def _wrapped(sql: str, values: Any, exc: sqlite3.Error) -> DBAPIError:
    """The driver's error as SQLAlchemy raises it (`IntegrityError`, `OperationalError`...)."""
    # `instance` is typed as any StatementError; given a driver error it makes a DBAPIError.
    return cast(DBAPIError, DBAPIError.instance(sql, values, exc, sqlite3.Error))
