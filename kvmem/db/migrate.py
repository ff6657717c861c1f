"""Running the Alembic migrations from code: there is no alembic.ini, the config is built here.

`ensure_current` skips Alembic entirely (its import and script scan cost ~0.2 s) when the
database is already at `HEAD`, so that CLI commands stay fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection, Engine

import kvmem.migrations

if TYPE_CHECKING:
    from alembic.config import Config as AlembicConfig

# The newest revision in migrations/versions; a test checks it against Alembic's own view.
HEAD = "0010"


# Any constant: the key of the PostgreSQL advisory lock that serializes migrations.
MIGRATION_LOCK_KEY = 0x6B766D656D  # "kvmem"


def alembic_config(engine: Engine, connection: Connection | None = None) -> AlembicConfig:
    """An Alembic config pointing at kvmem's migrations, on `connection` (else `engine`)."""
    from alembic.config import Config as AlembicConfig

    config = AlembicConfig()
    config.set_main_option("script_location", str(Path(kvmem.migrations.__file__).parent))
    config.attributes["engine"] = engine
    config.attributes["connection"] = connection
    return config


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Apply every pending migration; replicas starting together migrate one at a time.

    On PostgreSQL an advisory lock serializes them; on SQLite the whole upgrade is one
    `BEGIN IMMEDIATE` transaction. Either way the second one finds the work done.

    The transaction is begun here, before Alembic looks at the connection, so that Alembic
    takes it as the caller's: on SQLite (no transactional DDL, in Alembic's view) it would
    otherwise commit after each migration, and a replica that took the lock in between read
    the old revision and ran the next migration a second time ("duplicate column name").
    """
    from alembic import command

    with engine.execution_options(kvmem_write=True).connect() as connection:
        if engine.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
            connection.commit()
        try:
            connection.begin()
            command.upgrade(alembic_config(engine, connection), revision)
            connection.commit()
        finally:
            if engine.dialect.name == "postgresql":
                connection.execute(
                    text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATION_LOCK_KEY}
                )
                connection.commit()


def downgrade(engine: Engine, revision: str) -> None:
    """Revert migrations down to `revision` (`base` for a blank database)."""
    from alembic import command

    with engine.execution_options(kvmem_write=True).connect() as connection:
        command.downgrade(alembic_config(engine, connection), revision)
        connection.commit()


def ensure_current(engine: Engine) -> None:
    """Apply pending migrations, without loading Alembic when there are none."""
    if current_revision(engine) != HEAD:
        upgrade(engine)


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at, or None for a blank database."""
    with engine.connect() as connection:
        if not inspect(connection).has_table("alembic_version"):
            return None
        return connection.execute(text("SELECT version_num FROM alembic_version")).scalar()


def head_revision(engine: Engine) -> str | None:
    """The newest revision kvmem ships, as Alembic reads it from the scripts."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config(engine)).get_current_head()
