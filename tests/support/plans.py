"""Query plans: the statements some code runs, captured, and the whole-table scans in their plans.

On SQLite every statement is captured by sqlite3's trace callback on each pooled connection
(set when the pool hands it out), so the raw-sqlite3 fast paths (`MemoryStore.snapshot`,
group commit's savepoints) are seen as well as SQLAlchemy's; each is then explained with
`EXPLAIN QUERY PLAN`, where `SCAN <table>` (with or without an index) reads a whole table.
On PostgreSQL statements are captured with their parameters by SQLAlchemy's
`before_cursor_execute` and explained with sequential scans disabled: a `Seq Scan` left in
such a plan is one no index can avoid, and an index scan without an `Index Cond` reads a
whole index.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.pool import Pool

DML = ("select", "insert", "update", "delete", "with")
INDEX_SCANS = {"Index Scan", "Index Only Scan", "Bitmap Index Scan"}


@dataclass(frozen=True)
class Statement:
    """One captured statement (with its parameters on PostgreSQL)."""

    sql: str
    parameters: Any = None


# The callbacks of the `sqlite_trace` blocks now open (sqlite3 takes one per connection).
_TRACERS: list[Callable[[str], None]] = []


def _dispatch(sql: str) -> None:
    for on_statement in list(_TRACERS):
        on_statement(sql)


@contextmanager
def sqlite_trace(on_statement: Callable[[str], None]) -> Iterator[None]:
    """Call `on_statement` with every statement's SQL run on a sqlite3 connection that the
    pool hands out while the block runs: SQLAlchemy's and the raw-sqlite3 paths' alike
    (`MemoryStore.snapshot`, `Database.writing_prebuilt`), transaction statements included.
    Blocks may nest."""
    traced: list[sqlite3.Connection] = []

    def on_checkout(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        if isinstance(dbapi_connection, sqlite3.Connection):
            dbapi_connection.set_trace_callback(_dispatch)
            traced.append(dbapi_connection)

    _TRACERS.append(on_statement)
    event.listen(Pool, "checkout", on_checkout)
    try:
        yield
    finally:
        event.remove(Pool, "checkout", on_checkout)
        _TRACERS.remove(on_statement)
        if not _TRACERS:
            for connection in traced:
                connection.set_trace_callback(None)


@contextmanager
def captured_statements(engine: Engine) -> Iterator[list[Statement]]:
    """Every data statement run on `engine`'s database while the block runs."""
    statements: list[Statement] = []
    if engine.dialect.name == "sqlite":

        def trace(sql: str) -> None:
            if sql.lstrip().lower().startswith(DML):
                statements.append(Statement(sql))

        with sqlite_trace(trace):
            yield statements
        return

    def before(
        _conn: Any, _cursor: Any, sql: str, parameters: Any, _context: Any, executemany: bool
    ) -> None:
        if sql.lstrip().lower().startswith(DML):
            # An executemany (or an "insertmanyvalues" batch) is explained with its first row.
            many = executemany and isinstance(parameters, (list, tuple))
            statements.append(Statement(sql, parameters[0] if many else parameters))

    event.listen(engine, "before_cursor_execute", before)
    try:
        yield statements
    finally:
        event.remove(engine, "before_cursor_execute", before)


def table_scans(engine: Engine, statements: list[Statement]) -> dict[str, list[str]]:
    """The statements whose plan reads a whole table, with the plan lines that do."""
    found: dict[str, list[str]] = {}
    raw = engine.raw_connection()
    try:
        cursor = raw.cursor()
        if engine.dialect.name == "postgresql":
            cursor.execute("SET enable_seqscan = off")
        for statement in {(s.sql, _key(s.parameters)): s for s in statements}.values():
            scans = (
                _sqlite_scans(cursor, statement)
                if engine.dialect.name == "sqlite"
                else _postgres_scans(cursor, statement)
            )
            if scans:
                found[statement.sql] = scans
        if engine.dialect.name == "postgresql":
            raw.rollback()
    finally:
        raw.close()
    return found


def _key(parameters: Any) -> str:
    return json.dumps(parameters, default=str, sort_keys=True)


def _sqlite_scans(cursor: Any, statement: Statement) -> list[str]:
    rows = cursor.execute("EXPLAIN QUERY PLAN " + statement.sql).fetchall()
    # `SCAN (subquery-1)` and `SCAN CONSTANT ROW` read no table.
    return [
        detail
        for *_, detail in rows
        if detail.startswith("SCAN ") and not detail.startswith(("SCAN (", "SCAN CONSTANT ROW"))
    ]


def _postgres_scans(cursor: Any, statement: Statement) -> list[str]:
    cursor.execute("EXPLAIN (FORMAT JSON) " + statement.sql, statement.parameters)
    (plan,) = cursor.fetchone()
    if isinstance(plan, str):
        plan = json.loads(plan)
    scans: list[str] = []

    def walk(node: dict[str, Any]) -> None:
        kind = node.get("Node Type")
        if kind == "Seq Scan":
            scans.append(f"Seq Scan on {node.get('Relation Name')}")
        elif kind in INDEX_SCANS and "Index Cond" not in node:  # the whole index, in order
            scans.append(f"{kind} on {node.get('Relation Name')} using {node.get('Index Name')}")
        for child in node.get("Plans", []):
            walk(child)

    walk(plan[0]["Plan"])
    return scans
