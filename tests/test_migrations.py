"""The Alembic migrations are the schema: migrate a blank database and look at what is there.

Model: simonw/llm tests/test_migrate.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
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

from kvmem.config import DatabaseConfig, MemoryConfig
from kvmem.db.engine import Database
from kvmem.db.migrate import (
    HEAD,
    alembic_config,
    current_revision,
    downgrade,
    ensure_current,
    head_revision,
    upgrade,
)
from kvmem.db.tables import Base
from kvmem.entries import utcnow
from kvmem.memory.rules import MemoryRules
from kvmem.memory.store import MemoryStore
from kvmem.tokens import TokenCounter

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
    assert set(inspector.get_table_names()) >= FOUNDATION_TABLES

    assert columns(engine, "users") == [
        ("id", "VARCHAR(128)", False, None),
        ("memories_enabled", "BOOLEAN", False, "1"),
        ("created_at", "DATETIME", False, None),
        ("memory_version", "INTEGER", False, "'0'"),
        ("review", "BOOLEAN", False, "'0'"),
    ]
    assert inspector.get_pk_constraint("users") == {
        "constrained_columns": ["id"],
        "name": "pk_users",
    }

    assert columns(engine, "memory_entries") == [
        ("id", "INTEGER", False, None),
        ("user_id", "VARCHAR(128)", False, None),
        ("key", "VARCHAR(128)", False, None),
        ("value", "TEXT", False, None),
        ("token_count", "INTEGER", False, None),
        ("source", "VARCHAR(16)", False, None),
        ("created_at", "DATETIME", False, None),
        ("updated_at", "DATETIME", False, None),
        ("expires_at", "DATETIME", True, None),
        ("expired", "BOOLEAN", False, "'0'"),
        ("scope", "VARCHAR(128)", False, "''"),
    ]
    assert inspector.get_pk_constraint("memory_entries") == {
        "constrained_columns": ["id"],
        "name": "pk_memory_entries",
    }
    assert inspector.get_unique_constraints("memory_entries") == [
        {"name": "uq_memory_entries_user_scope_key", "column_names": ["user_id", "scope", "key"]}
    ]
    assert inspector.get_indexes("memory_entries") == [
        {
            "name": "ix_memory_entries_expiry",
            "column_names": ["expired", "expires_at"],
            "unique": 0,
            "dialect_options": {},
        },
        {
            "name": "ix_memory_entries_user_scope_updated",
            "column_names": ["user_id", "scope", "updated_at"],
            "unique": 0,
            "dialect_options": {},
        },
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
        {
            "name": "ix_api_keys_user_id",
            "column_names": ["user_id"],
            "unique": 0,
            "dialect_options": {},
        }
    ]
    assert [fk["name"] for fk in inspector.get_foreign_keys("api_keys")] == [
        "fk_api_keys_user_id_users"
    ]


def test_unique_key_per_user_is_enforced_by_the_database(engine: Engine) -> None:
    upgrade(engine)
    insert = (
        "INSERT INTO memory_entries (user_id, key, value, token_count, source, created_at, updated_at) "
        "VALUES ('alice', 'k', 'v', 1, 'manual', '2026-01-01', '2026-01-01')"
    )
    with engine.begin() as connection:
        connection.exec_driver_sql(
            "INSERT INTO users (id, created_at) VALUES ('alice', '2026-01-01')"
        )
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
    assert set(inspect(engine).get_table_names()) >= FOUNDATION_TABLES
    with engine.connect() as connection:
        context = MigrationContext.configure(connection)
        assert compare_metadata(context, Base.metadata) == []


def test_ensure_current_migrates_once(engine: Engine) -> None:
    ensure_current(engine)
    assert current_revision(engine) == HEAD
    ensure_current(engine)  # already current: nothing to do, nothing fails
    assert current_revision(engine) == HEAD


def test_replicas_starting_together_on_sqlite_migrate_once(tmp_path: Path) -> None:
    """Replicas that start at once on a blank file each run the upgrade: the others must find
    the work done, not run a migration again (one failed with "duplicate column name" when
    each migration committed alone and another process took the lock in between). Processes,
    as replicas are: Alembic's `context` is one per process."""
    config = tmp_path / "memory.yaml"
    config.write_text(f"database:\n  url: sqlite:///{tmp_path / 'shared.db'}\n", "utf-8")
    command = [sys.executable, "-m", "kvmem", "db", "--config", str(config), "upgrade"]
    processes = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(4)
    ]
    outputs = [process.communicate(timeout=120)[0] for process in processes]
    assert [process.returncode for process in processes] == [0] * 4, outputs
    database = Database.from_config(DatabaseConfig(url=f"sqlite:///{tmp_path / 'shared.db'}"))
    try:
        assert current_revision(database.engine) == HEAD
    finally:
        database.dispose()


@pytest.fixture
def any_engine(backend: str, tmp_path: Path) -> Iterator[Engine]:
    """A blank database on either backend (PostgreSQL: a fresh database of its own)."""
    if backend == "sqlite":
        database = Database.from_config(DatabaseConfig(url=f"sqlite:///{tmp_path / 'old.db'}"))
        yield database.engine
        database.dispose()
        return
    from tests.support.pg import POSTGRES_ENV, fresh_database

    with fresh_database(os.environ[POSTGRES_ENV], "kvmem_migrate") as url:
        database = Database.from_config(DatabaseConfig(url=url))
        yield database.engine
        database.dispose()


def test_upgrading_a_0003_database_with_data_keeps_it_and_records_history(
    any_engine: Engine, tokens: TokenCounter
) -> None:
    """A database of the first release (0003) with users, entries, keys and conversations in
    it upgrades to head: every row is kept, and new writes are recorded in the history."""
    upgrade(any_engine, "0003")
    rows = {
        "users": "INSERT INTO users (id, memories_enabled, created_at, memory_version) "
        "VALUES ('alice', false, '2026-01-01 00:00:00', 7)",
        "memory_entries": "INSERT INTO memory_entries (user_id, key, value, token_count, source, "
        "created_at, updated_at) VALUES ('alice', 'likes', 'tea', 1, 'manual', "
        "'2026-01-01 00:00:00', '2026-01-02 00:00:00')",
        "api_keys": "INSERT INTO api_keys (id, user_id, prefix, key_hash, created_at) VALUES "
        "('key_1', 'alice', 'kvm_abc', 'h1', '2026-01-01 00:00:00')",
        "conversations": "INSERT INTO conversations (id, user_id, title, created_at, updated_at) "
        "VALUES ('c1', 'alice', 'hi', '2026-01-01 00:00:00', '2026-01-01 00:00:00')",
        "messages": "INSERT INTO messages (conversation_id, role, content, created_at) VALUES "
        "('c1', 'user', 'hello', '2026-01-01 00:00:00')",
    }
    with any_engine.begin() as connection:
        for statement in rows.values():
            connection.exec_driver_sql(statement)

    upgrade(any_engine)
    assert current_revision(any_engine) == HEAD
    assert {"memory_changes", "sessions", "agent_runs"} <= set(
        inspect(any_engine).get_table_names()
    )
    with any_engine.connect() as connection:
        counts = {
            table: connection.exec_driver_sql(f"SELECT COUNT(*) FROM {table}").scalar()
            for table in [*rows, "memory_changes"]
        }
    assert counts == {**dict.fromkeys(rows, 1), "memory_changes": 0}

    store = MemoryStore(Database(any_engine), MemoryRules(), tokens)
    snapshot = store.snapshot("alice")
    assert [(e.key, e.value, e.source) for e in snapshot.entries] == [("likes", "tea", "manual")]
    assert snapshot.memories_enabled is False
    # The old entry has no history; its next change does, and can be undone.
    assert store.key_history("alice", "likes") == ()
    store.set("alice", "likes", "coffee")
    [only] = store.key_history("alice", "likes")
    assert (only.op, only.old_value, only.new_value, only.source) == (
        "set",
        "tea",
        "coffee",
        "manual",
    )
    store.revert("alice", "likes", only.id)  # already "coffee": nothing to do
    assert store.erase_user("alice").as_json() == {
        "deleted": {
            "memories": 1,
            "changes": 1,
            "conversations": 1,
            "messages": 1,
            "keys": 1,
            "sessions": 0,
            "agent_runs": 0,
        }
    }


def test_upgrade_creates_the_proposals_table(engine: Engine) -> None:
    upgrade(engine)
    inspector = inspect(engine)
    assert columns(engine, "memory_proposals") == [
        ("id", "INTEGER", False, None),
        ("user_id", "VARCHAR(128)", False, None),
        ("key", "VARCHAR(128)", False, None),
        ("op", "VARCHAR(8)", False, None),
        ("value", "TEXT", True, None),
        ("conversation_id", "VARCHAR(200)", True, None),
        ("created_at", "DATETIME", False, None),
        ("expires_at", "DATETIME", True, None),
        ("scope", "VARCHAR(128)", False, "''"),
    ]
    assert inspector.get_indexes("memory_proposals") == [
        {
            "name": "ix_memory_proposals_user_id",
            "column_names": ["user_id", "id"],
            "unique": 0,
            "dialect_options": {},
        }
    ]
    assert [
        (fk["name"], fk["options"]) for fk in inspector.get_foreign_keys("memory_proposals")
    ] == [("fk_memory_proposals_user_id_users", {"ondelete": "CASCADE"})]
    with engine.connect() as connection:  # ids are never reused
        assert (
            "AUTOINCREMENT"
            in connection.exec_driver_sql(
                "SELECT sql FROM sqlite_master WHERE name = 'memory_proposals'"
            ).scalar()
        )


def test_the_proposals_migration_downgrades_keeping_every_row(engine: Engine) -> None:
    upgrade(engine)
    with engine.begin() as connection:
        connection.exec_driver_sql(
            "INSERT INTO users (id, created_at) VALUES ('alice', '2026-01-01')"
        )
        connection.exec_driver_sql(
            "INSERT INTO memory_entries (user_id, key, value, token_count, source, created_at, "
            "updated_at) VALUES ('alice', 'k', 'v', 1, 'manual', '2026-01-01', '2026-01-01')"
        )
    downgrade(engine, "0007")
    assert "memory_proposals" not in inspect(engine).get_table_names()
    assert [c[0] for c in columns(engine, "users")] == [
        "id",
        "memories_enabled",
        "created_at",
        "memory_version",
    ]
    with engine.connect() as connection:
        assert connection.exec_driver_sql("SELECT COUNT(*) FROM memory_entries").scalar() == 1


def test_upgrading_a_0008_database_keeps_entries_and_proposals_never_expiring(
    any_engine: Engine, tokens: TokenCounter
) -> None:
    """0009 adds `expires_at` (and the `expired` mark) with every existing row null (false):
    nothing that was stored starts to expire. Downgrading drops the columns, rows kept."""
    upgrade(any_engine, "0008")
    with any_engine.begin() as connection:
        for statement in (
            "INSERT INTO users (id, memories_enabled, created_at, memory_version) "
            "VALUES ('alice', true, '2026-01-01 00:00:00', 1)",
            "INSERT INTO memory_entries (user_id, key, value, token_count, source, created_at, "
            "updated_at) VALUES ('alice', 'trip', 'Lisbon', 2, 'manual', '2026-01-01 00:00:00', "
            "'2026-01-01 00:00:00')",
            "INSERT INTO memory_proposals (user_id, key, op, value, created_at) VALUES "
            "('alice', 'city', 'set', 'Rome', '2026-01-01 00:00:00')",
        ):
            connection.exec_driver_sql(statement)
    upgrade(any_engine, "0009")
    with any_engine.connect() as connection:
        assert connection.exec_driver_sql(
            "SELECT key, expires_at, expired FROM memory_entries"
        ).all() == [("trip", None, False)]
        assert connection.exec_driver_sql("SELECT key, expires_at FROM memory_proposals").all() == [
            ("city", None)
        ]
    upgrade(any_engine)  # the store reads the head's schema
    store = MemoryStore(Database(any_engine), MemoryRules(), tokens)
    [trip] = store.snapshot("alice").entries
    assert (trip.key, trip.expires_at, trip.expired) == ("trip", None, False)
    downgrade(any_engine, "0008")
    assert "expires_at" not in {
        c["name"] for c in inspect(any_engine).get_columns("memory_entries")
    }
    with any_engine.connect() as connection:
        assert connection.exec_driver_sql("SELECT COUNT(*) FROM memory_entries").scalar() == 1
    upgrade(any_engine)


def test_upgrading_a_0009_database_makes_every_row_the_persons_own_layer(
    any_engine: Engine, tokens: TokenCounter
) -> None:
    """0010 adds `scope` ("" = the person's own) to entries, changes and proposals: every
    existing row is the own layer, read and written as before; the unique key becomes
    (user, scope, key), so one scoped key may live in two scopes. Downgrading deletes scoped
    rows only and restores the old unique key."""
    upgrade(any_engine, "0009")
    with any_engine.begin() as connection:
        for statement in (
            "INSERT INTO users (id, memories_enabled, created_at, memory_version) "
            "VALUES ('alice', true, '2026-01-01 00:00:00', 1)",
            "INSERT INTO memory_entries (user_id, key, value, token_count, source, created_at, "
            "updated_at) VALUES ('alice', 'diet', 'vegan', 2, 'manual', '2026-01-01 00:00:00', "
            "'2026-01-01 00:00:00')",
            # Recent: a write prunes changes older than the history's 90 days.
            "INSERT INTO memory_changes (user_id, key, op, new_value, source, at) VALUES "
            f"('alice', 'diet', 'set', 'vegan', 'manual', '{utcnow():%Y-%m-%d %H:%M:%S}')",
            "INSERT INTO memory_proposals (user_id, key, op, value, created_at) VALUES "
            "('alice', 'city', 'set', 'Rome', '2026-01-01 00:00:00')",
        ):
            connection.exec_driver_sql(statement)
    upgrade(any_engine, "0010")
    with any_engine.connect() as connection:
        for table in ("memory_entries", "memory_changes", "memory_proposals"):
            assert connection.exec_driver_sql(f"SELECT key, scope FROM {table}").all() in (
                [("diet", "")],
                [("city", "")],
            )
    rules = MemoryRules.from_config(
        MemoryConfig.model_validate({"scopes": {"validKeys": ["notes"]}})
    )
    store = MemoryStore(Database(any_engine), rules, tokens)
    assert [(e.key, e.scope) for e in store.snapshot("alice").entries] == [("diet", "")]
    store.set("alice", "notes", "kitchen: oak", scope="kitchen")
    store.set("alice", "notes", "thesis: chapter 2", scope="thesis")
    assert [(e.key, e.value) for e in store.snapshot("alice", "kitchen").entries] == [
        ("diet", "vegan"),
        ("notes", "kitchen: oak"),
    ]
    downgrade(any_engine, "0009")
    with any_engine.connect() as connection:
        assert connection.exec_driver_sql("SELECT key FROM memory_entries").all() == [("diet",)]
        assert connection.exec_driver_sql("SELECT COUNT(*) FROM memory_changes").scalar() == 1
    upgrade(any_engine)
