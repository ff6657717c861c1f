"""SQLite's writes on the bare sqlite3 connection (`kvmem.db.driver_connection`): the same
statements store and read back exactly what they do through SQLAlchemy, fail with the same
exception classes, and `Database.writing_prebuilt` commits or rolls back as a whole."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import bindparam, insert, select, update
from sqlalchemy.exc import IntegrityError

from kvmem.db.driver_connection import DriverConnection
from kvmem.db.engine import Database
from kvmem.db.tables import MemoryEntry, User

pytestmark = pytest.mark.sqlite_only  # PostgreSQL's writes stay on SQLAlchemy's connection

MOMENT = datetime(2026, 3, 4, 5, 6, 7, 890123, tzinfo=UTC)
INSERT_ENTRY = insert(MemoryEntry)
ENTRY = select(
    MemoryEntry.key, MemoryEntry.value, MemoryEntry.token_count, MemoryEntry.created_at
).where(MemoryEntry.user_id == bindparam("user_id"))
BUMP = (
    update(User)
    .where(User.id == bindparam("user_id"))
    .values(memory_version=User.memory_version + 1)
)


def entry(user_id: str) -> dict[str, Any]:
    return {
        "user_id": user_id,
        "key": "drink",
        "value": "tea",
        "token_count": 1,
        "source": "manual",
        "created_at": MOMENT,
        "updated_at": MOMENT,
    }


def raw_rows(database: Database, sql: str) -> list[tuple[Any, ...]]:
    connection = database.engine.raw_connection()
    try:
        return list(connection.cursor().execute(sql).fetchall())
    finally:
        connection.close()


def add_users(database: Database, *user_ids: str) -> None:
    with database.writing_connection() as connection:
        for user_id in user_ids:
            database.lock_user(connection, user_id)


def test_a_row_is_stored_and_read_back_as_through_sqlalchemy(database: Database) -> None:
    add_users(database, "core", "driver")
    with database.writing_connection() as connection:
        connection.execute(INSERT_ENTRY, entry("core"))
        core = connection.execute(ENTRY, {"user_id": "core"}).all()
    with database.writing_prebuilt() as driver:
        assert isinstance(driver, DriverConnection)
        driver.execute(INSERT_ENTRY, entry("driver"))
        read = driver.execute(ENTRY, {"user_id": "driver"}).all()
    assert (
        [tuple(row) for row in read]
        == [tuple(row) for row in core]
        == [("drink", "tea", 1, MOMENT)]
    )
    assert read[0].created_at == MOMENT  # rows are named as SQLAlchemy's are
    stored = raw_rows(
        database,
        "SELECT user_id, key, value, token_count, source, created_at, "
        "updated_at FROM memory_entries ORDER BY id",
    )
    assert [row[1:] for row in stored] == [
        ("drink", "tea", 1, "manual", "2026-03-04 05:06:07.890123", "2026-03-04 05:06:07.890123")
    ] * 2


def test_a_statement_keeps_its_own_literals(database: Database) -> None:
    add_users(database, "ada")
    with database.writing_prebuilt() as driver:
        assert driver.execute(BUMP, {"user_id": "ada"}).rowcount == 1
        driver.execute(BUMP, {"user_id": "ada"})
    assert raw_rows(database, "SELECT id, memory_version FROM users") == [("ada", 2)]


def test_driver_errors_are_sqlalchemys_and_nothing_of_the_transaction_stays(
    database: Database,
) -> None:
    add_users(database, "ada")
    with (
        pytest.raises(IntegrityError, match="UNIQUE constraint failed") as caught,
        database.writing_prebuilt() as driver,
    ):
        driver.execute(BUMP, {"user_id": "ada"})
        driver.execute(INSERT_ENTRY, entry("ada"))
        driver.execute(INSERT_ENTRY, entry("ada"))  # the same key again
    assert isinstance(caught.value.orig, sqlite3.IntegrityError)
    assert raw_rows(database, "SELECT count(*) FROM memory_entries") == [(0,)]
    assert raw_rows(database, "SELECT memory_version FROM users") == [(0,)]


def test_a_scalar_and_the_inserted_id(database: Database) -> None:
    add_users(database, "ada")
    with database.writing_prebuilt() as driver:
        inserted = driver.execute(INSERT_ENTRY, entry("ada")).inserted_primary_key[0]
        found = driver.execute(
            select(MemoryEntry.id).where(MemoryEntry.user_id == bindparam("user_id")),
            {"user_id": "ada"},
        ).scalar_one()
        missing = driver.execute(ENTRY, {"user_id": "nobody"})
        assert missing.first() is None and missing.scalar() is None
    assert found == inserted == raw_rows(database, "SELECT id FROM memory_entries")[0][0]
