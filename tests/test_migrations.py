"""The Alembic migrations are the schema: migrate a blank database and look at what is there.

Model: simonw/llm tests/test_migrate.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from kvmem.config import DatabaseConfig
from kvmem.db import Database
from kvmem.migrate import (
    HEAD,
    alembic_config,
    current_revision,
    ensure_current,
    head_revision,
    upgrade,
)
from kvmem.tables import Base

FOUNDATION_TABLES = {"alembic_version", "users", "memory_entries", "api_keys"}


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    """A blank SQLite database, through kvmem's own engine setup."""
    database = Database.from_config(DatabaseConfig(url=f"sqlite:///{tmp_path / 'blank.db'}"))
    yield database.engine
    database.dispose()


def columns(engine: Engine, table: str) -> list[tuple[str, str, bool, Any]]:
    return [
        (c["name"], str(c["type"]), c["nullable"], c.get("default"))
        for c in inspect(engine).get_columns(table)
    ]


def test_blank_database_has_no_revision(engine: Engine) -> None:
    assert current_revision(engine) is None
    assert inspect(engine).get_table_names() == []


def test_first_revision_creates_the_foundation_schema(engine: Engine) -> None:
    upgrade(engine, "0001")
    assert current_revision(engine) == "0001"
    inspector = inspect(engine)
    assert set(inspector.get_table_names()) == FOUNDATION_TABLES


def test_upgrade_to_head_creates_the_memory_tables(engine: Engine) -> None:
    upgrade(engine)
    assert current_revision(engine) == HEAD
    inspector = inspect(engine)
    assert FOUNDATION_TABLES <= set(inspector.get_table_names())

    assert columns(engine, "users") == [
        ("id", "VARCHAR(128)", False, None),
        ("memories_enabled", "BOOLEAN", False, "1"),
        ("created_at", "DATETIME", False, None),
        ("memory_version", "INTEGER", False, "'0'"),
    ]
    assert inspector.get_pk_constraint("users") == {"constrained_columns": ["id"], "name": "pk_users"}

    assert columns(engine, "memory_entries") == [
        ("id", "INTEGER", False, None),
        ("user_id", "VARCHAR(128)", False, None),
        ("key", "VARCHAR(128)", False, None),
        ("value", "TEXT", False, None),
        ("token_count", "INTEGER", False, None),
        ("source", "VARCHAR(16)", False, None),
        ("created_at", "DATETIME", False, None),
        ("updated_at", "DATETIME", False, None),
    ]
    assert inspector.get_pk_constraint("memory_entries") == {
        "constrained_columns": ["id"],
        "name": "pk_memory_entries",
    }
    assert inspector.get_unique_constraints("memory_entries") == [
        {"name": "uq_memory_entries_user_id", "column_names": ["user_id", "key"]}
    ]
    assert inspector.get_indexes("memory_entries") == [
        {
            "name": "ix_memory_entries_user_updated",
            "column_names": ["user_id", "updated_at"],
            "unique": 0,
            "dialect_options": {},
        }
    ]
    assert inspector.get_foreign_keys("memory_entries") == [
        {
            "name": "fk_memory_entries_user_id_users",
            "constrained_columns": ["user_id"],
            "referred_schema": None,
            "referred_table": "users",
            "referred_columns": ["id"],
            "options": {"ondelete": "CASCADE"},
        }
    ]

    assert columns(engine, "api_keys") == [
        ("id", "VARCHAR(32)", False, None),
        ("user_id", "VARCHAR(128)", False, None),
        ("prefix", "VARCHAR(16)", False, None),
        ("key_hash", "VARCHAR(64)", False, None),
        ("created_at", "DATETIME", False, None),
        ("revoked_at", "DATETIME", True, None),
    ]
    assert inspector.get_unique_constraints("api_keys") == [
        {"name": "uq_api_keys_key_hash", "column_names": ["key_hash"]}
    ]
    assert inspector.get_indexes("api_keys") == [
        {"name": "ix_api_keys_user_id", "column_names": ["user_id"], "unique": 0, "dialect_options": {}}
    ]
    assert [fk["name"] for fk in inspector.get_foreign_keys("api_keys")] == ["fk_api_keys_user_id_users"]


def test_unique_key_per_user_is_enforced_by_the_database(engine: Engine) -> None:
    upgrade(engine)
    insert = (
        "INSERT INTO memory_entries (user_id, key, value, token_count, source, created_at, updated_at) "
        "VALUES ('alice', 'k', 'v', 1, 'manual', '2026-01-01', '2026-01-01')"
    )
    with engine.begin() as connection:
        connection.exec_driver_sql("INSERT INTO users (id, created_at) VALUES ('alice', '2026-01-01')")
        connection.exec_driver_sql(insert)
        assert connection.exec_driver_sql("SELECT memories_enabled FROM users").scalar() == 1
    with pytest.raises(IntegrityError), engine.begin() as connection:
        connection.exec_driver_sql(insert)
    # Entries need their user (foreign keys are on).
    with pytest.raises(IntegrityError), engine.begin() as connection:
        connection.exec_driver_sql(insert.replace("'alice'", "'nobody'"))


def test_head_constant_is_alembics_head(engine: Engine) -> None:
    script = ScriptDirectory.from_config(alembic_config(engine))
    assert script.get_heads() == [HEAD]
    assert head_revision(engine) == HEAD


def test_models_agree_with_the_migrated_schema(engine: Engine) -> None:
    upgrade(engine)
    with engine.connect() as connection:
        context = MigrationContext.configure(
            connection, opts={"compare_type": True, "compare_server_default": True}
        )
        assert compare_metadata(context, Base.metadata) == []


def test_downgrade_to_base_and_back(engine: Engine) -> None:
    config = alembic_config(engine)
    upgrade(engine)
    command.downgrade(config, "base")
    assert current_revision(engine) is None
    assert set(inspect(engine).get_table_names()) == {"alembic_version"}
    upgrade(engine)
    assert current_revision(engine) == HEAD
    assert FOUNDATION_TABLES <= set(inspect(engine).get_table_names())
    with engine.connect() as connection:
        context = MigrationContext.configure(connection)
        assert compare_metadata(context, Base.metadata) == []


def test_ensure_current_migrates_once(engine: Engine) -> None:
    ensure_current(engine)
    assert current_revision(engine) == HEAD
    ensure_current(engine)  # already current: nothing to do, nothing fails
    assert current_revision(engine) == HEAD
