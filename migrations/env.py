"""Alembic environment: runs migrations on the connection (or engine) kvmem hands over."""

from logging.config import fileConfig

from alembic import context
from sqlalchemy import create_engine

from kvmem.db.tables import Base

config = context.config
# kvmem builds its Alembic config in code; there is only a file to read when someone runs
# the alembic CLI with an alembic.ini of their own.
if config.config_file_name is not None:
    fileConfig(config.config_file_name)

target_metadata = Base.metadata


def run_migrations(connection) -> None:
    """Run the pending migrations on `connection`."""
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Migrate through kvmem's connection, its engine, or one made from sqlalchemy.url."""
    connection = config.attributes.get("connection")
    if connection is not None:
        run_migrations(connection)
        return
    engine = config.attributes.get("engine") or create_engine(
        config.get_main_option("sqlalchemy.url")
    )
    with engine.connect() as connection:
        run_migrations(connection)


if context.is_offline_mode():
    raise SystemExit("kvmem's migrations run online only: use `kvmem db upgrade`")
run_migrations_online()
