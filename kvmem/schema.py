"""Running the Alembic migrations from code: there is no alembic.ini, the config is built here.

`ensure_current` skips Alembic entirely (its import and script scan cost ~0.2 s) when the
database is already at `HEAD`, so that CLI commands stay fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import inspect, text
from sqlalchemy.engine import Engine

import kvmem.migrations

if TYPE_CHECKING:
    from alembic.config import Config as AlembicConfig

# The newest revision in migrations/versions; a test checks it against Alembic's own view.
HEAD = "0002"


def alembic_config(engine: Engine) -> AlembicConfig:
    """An Alembic config pointing at kvmem's migrations and running on `engine`."""
    from alembic.config import Config as AlembicConfig

    config = AlembicConfig()
    config.set_main_option("script_location", str(Path(kvmem.migrations.__file__).parent))
    config.attributes["engine"] = engine
    return config


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Apply every pending migration."""
    from alembic import command

    command.upgrade(alembic_config(engine), revision)


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
