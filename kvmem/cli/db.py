"""`kvmem db`: the database's migrations."""

from __future__ import annotations

import click

from kvmem.cli.command import config_option, error_reason, fail, loaded_config, open_database


@click.group("db")
@config_option
def db_group() -> None:
    """Database migrations."""


@db_group.command("upgrade")
@config_option
def db_upgrade() -> None:
    """Apply pending migrations."""
    from kvmem.db.migrate import current_revision

    database = open_database(loaded_config())
    click.echo(f"database at revision {current_revision(database.engine)}")


@db_group.command("current")
@config_option
def db_current() -> None:
    """Print the database's revision and the newest one kvmem ships."""
    from kvmem.db.engine import Database
    from kvmem.db.migrate import current_revision, head_revision

    loaded = loaded_config()
    database = Database.from_config(loaded.config.database)
    try:
        current = current_revision(database.engine)
    except Exception as exc:  # an unreachable database is a usage problem here
        fail(f"cannot open database {loaded.config.database.masked_url()}: {error_reason(exc)}", 2)
    head = head_revision(database.engine)
    state = "up to date" if current == head else "pending migrations: run `kvmem db upgrade`"
    click.echo(f"current: {current or 'none (blank database)'}\nhead: {head}\n{state}")
