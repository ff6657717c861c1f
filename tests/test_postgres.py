"""PostgreSQL specifics: migrating an empty server database, reconnecting, clear failures.

The store, REST, chat and agent tests run on PostgreSQL too (the `backend` parametrization in
conftest.py); these tests cover what only PostgreSQL has.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
from sqlalchemy import inspect, text

from kvmem.config import Config
from kvmem.db.engine import Database
from kvmem.db.migrate import HEAD, current_revision, upgrade
from kvmem.errors import StoreUnavailable
from kvmem.memory.rules import MemoryRules
from kvmem.memory.store import MemoryStore
from tests.support.pg import POSTGRES_ENV, fresh_database

pytestmark = pytest.mark.postgres_only


@pytest.fixture
def blank_url():
    with fresh_database(os.environ[POSTGRES_ENV], "kvmem_blank") as url:
        yield url


def open_database(url: str) -> Database:
    return Database.from_config(Config.model_validate({"database": {"url": url}}).database)


def test_db_upgrade_on_an_empty_database(blank_url, write_config):
    config = write_config(f'database: {{url: "{blank_url}"}}\n')
    done = subprocess.run(
        [sys.executable, "-m", "kvmem", "db", "upgrade", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    database = open_database(blank_url)
    try:
        assert current_revision(database.engine) == HEAD
        assert set(inspect(database.engine).get_table_names()) == {
            "alembic_version",
            "users",
            "memory_entries",
            "api_keys",
            "conversations",
            "messages",
            "memory_changes",
            "sessions",
            "agent_runs",
            "user_erasures",
            "memory_proposals",
        }
    finally:
        database.dispose()


def test_concurrent_upgrades_migrate_once(blank_url):
    databases = [open_database(blank_url) for _ in range(3)]
    errors: list[BaseException] = []

    def migrate(database: Database) -> None:
        try:
            upgrade(database.engine)
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=migrate, args=(d,)) for d in databases]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    try:
        assert errors == []
        assert current_revision(databases[0].engine) == HEAD
    finally:
        for database in databases:
            database.dispose()


def test_store_reconnects_after_its_connections_are_killed(postgres_url, tokens):
    from tests.support.pg import empty_tables

    empty_tables(postgres_url)
    database = open_database(postgres_url)
    store = MemoryStore(database, MemoryRules(), tokens)
    try:
        store.set("alice", "learned_facts", "Has two cats.")
        admin = open_database(os.environ[POSTGRES_ENV])
        try:
            with admin.engine.begin() as connection:
                killed = connection.execute(
                    text(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                        "WHERE datname = :name AND pid <> pg_backend_pid()"
                    ),
                    {"name": database.engine.url.database},
                ).scalar()
        finally:
            admin.dispose()
        assert killed >= 1
        assert [e.key for e in store.snapshot("alice").entries] == ["learned_facts"]
        assert store.set("alice", "user_preferences", "Short answers.").created
    finally:
        database.dispose()


def test_unreachable_server_during_a_request_is_503(tokens, make_client_for_url):
    client = make_client_for_url("postgresql+psycopg://kvmem:secret@127.0.0.1:1/nowhere")
    response = client.get("/memory")
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "store_unavailable"
    assert "secret" not in response.text
    assert client.get("/healthz").json()["store"] == "unavailable"


def test_unreachable_server_at_start_exits_2_with_the_password_masked(write_config):
    url = "postgresql+psycopg://kvmem:s3cret-pw@127.0.0.1:1/kvmem"
    config = write_config(f'database: {{url: "{url}"}}\n')
    done = subprocess.run(
        [sys.executable, "-m", "kvmem", "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "postgresql+psycopg://kvmem:***@127.0.0.1:1/kvmem" in done.stderr
    assert "s3cret-pw" not in done.stderr


def test_store_unavailable_is_raised_not_a_driver_error(tokens):
    database = open_database("postgresql+psycopg://kvmem@127.0.0.1:1/nowhere")
    try:
        with pytest.raises(StoreUnavailable):
            MemoryStore(database, MemoryRules(), tokens).snapshot("alice")
    finally:
        database.dispose()
