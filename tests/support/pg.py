"""PostgreSQL for the tests: a fresh database per run, and emptying it between tests."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from kvmem.tables import Base

# Set to a PostgreSQL URL (any database of the server; `.ci/run` sets it) to run every
# database test on PostgreSQL too. A set variable with no server behind it fails the run.
POSTGRES_ENV = "KVMEM_TEST_POSTGRES_URL"


@contextmanager
def fresh_database(admin_url: str, prefix: str) -> Iterator[str]:
    """Create a new, empty database on the server of `admin_url`; drop it afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
        yield make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def empty_tables(url: str) -> None:
    """Delete every row of kvmem's tables (the schema stays)."""
    tables = ", ".join(table.name for table in Base.metadata.sorted_tables)
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            connection.execute(text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))
    finally:
        engine.dispose()
