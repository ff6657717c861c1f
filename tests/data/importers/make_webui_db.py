"""Make the `webui.db` fixtures from a released Open WebUI's own migrations (run by hand).

Not run by the tests: it needs Open WebUI's wheel, which kvmem does not depend on. Made with

    pip download --no-deps open-webui==0.8.12 -d /tmp/owui/old
    pip download --no-deps open-webui==0.12.4 -d /tmp/owui/new
    python3 -m venv /tmp/owui/gen
    /tmp/owui/gen/bin/pip install peewee==3.19.0 peewee-migrate==1.14.3 alembic==1.18.4 \
        sqlalchemy==2.0.48            # the versions 0.8.12 pins
    /tmp/owui/gen/bin/python tests/data/importers/make_webui_db.py /tmp/owui/old/*.whl \
        tests/data/importers/webui-0.8.12.db
    /tmp/owui/gen/bin/python tests/data/importers/make_webui_db.py /tmp/owui/new/*.whl \
        tests/data/importers/webui-0.12.4.db

It does what Open WebUI does to a fresh database at start-up: its Peewee migrations first
(`open_webui/internal/migrations`, releases that still ship them), then every Alembic
migration (`open_webui/migrations/versions`) to the head, each from the wheel unchanged. Only
the small pieces those migrations import from Open WebUI are stood in for (its
`JSONField` and `get_existing_tables`, copied in behaviour, and `parse_ollama_modelfile`, which
only converts old modelfiles that a fresh database does not have), since importing the real
ones starts the whole server. The memories are then inserted as `MemoriesTable.insert_new_memory`
writes them (a uuid4 id, `int(time.time())` for both times), then some edited as
`update_memory_by_id_and_user_id` does (content replaced, `updated_at` moved).
"""

from __future__ import annotations

import sqlite3
import sys
import tempfile
import types
import zipfile
from pathlib import Path

# Two Open WebUI user ids (uuid4, as Open WebUI makes them), their memories in the order they
# were added (seconds after BASE), and two edits.
BASE = 1_760_000_000
USERS = {
    "0b0f6c1e-5a43-4d2e-9c59-2f1f6a1b7e10": [
        ("I live in Lisbon and work as a nurse.", 0),
        ("Prefers answers in metric units.", 60),
        ("Has a labrador called Nico.", 3_600),
    ],
    "6d3a2f9b-1c4e-4b8a-a0e7-9e4c2d5b8f21": [
        ("Vegetarian; allergic to peanuts.", 120),
        ("Learning Rust, coming from Python.", 7_200),
    ],
}
# (user, index of the memory, new content, seconds after BASE): an edit keeps the row's id
# and created_at, and moves updated_at.
EDITS = [
    ("0b0f6c1e-5a43-4d2e-9c59-2f1f6a1b7e10", 1, "Prefers metric units and 24-hour time.", 9_000)
]


def stand_ins() -> None:
    """The two Open WebUI modules the migrations import, without starting Open WebUI."""
    import json

    from sqlalchemy import types as sa_types

    class JSONField(sa_types.TypeDecorator):  # as open_webui.internal.db.JSONField
        impl = sa_types.Text
        cache_ok = True

        def process_bind_param(self, value, dialect):  # type: ignore[no-untyped-def]
            return json.dumps(value)

        def process_result_value(self, value, dialect):  # type: ignore[no-untyped-def]
            return json.loads(value) if value is not None else None

    def get_existing_tables() -> set[str]:  # as open_webui.migrations.util
        from alembic import op
        from sqlalchemy import inspect

        return set(inspect(op.get_bind()).get_table_names())

    def parse_ollama_modelfile(text: str) -> dict:  # Peewee migration 010, for old modelfiles
        raise NotImplementedError("a fresh database has no modelfiles to convert")

    package = types.ModuleType("open_webui")
    package.__path__ = []
    internal = types.ModuleType("open_webui.internal")
    internal.__path__ = []
    db = types.ModuleType("open_webui.internal.db")
    db.JSONField = JSONField  # type: ignore[attr-defined]
    migrations = types.ModuleType("open_webui.migrations")
    migrations.__path__ = []
    util = types.ModuleType("open_webui.migrations.util")
    util.get_existing_tables = get_existing_tables  # type: ignore[attr-defined]
    utils = types.ModuleType("open_webui.utils")
    utils.__path__ = []
    misc = types.ModuleType("open_webui.utils.misc")
    misc.parse_ollama_modelfile = parse_ollama_modelfile  # type: ignore[attr-defined]
    for module in (package, internal, db, migrations, util, utils, misc):
        sys.modules[module.__name__] = module


ENV = """
from alembic import context
from sqlalchemy import create_engine
engine = create_engine(context.config.get_main_option("sqlalchemy.url"))
with engine.connect() as connection:
    context.configure(connection=connection, target_metadata=None)
    with context.begin_transaction():
        context.run_migrations()
"""


def migrate(wheel: Path, database: Path, work: Path) -> None:
    """Open WebUI's start-up migrations, from the wheel, on a fresh `database`."""
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.startswith("open_webui/") and "migrations" in n]
        archive.extractall(work, names)
    peewee_dir = work / "open_webui/internal/migrations"
    if peewee_dir.is_dir():
        from peewee_migrate import Router
        from playhouse.db_url import connect

        connection = connect(f"sqlite:///{database}")
        Router(connection, migrate_dir=peewee_dir).run()
        connection.close()
    from alembic import command
    from alembic.config import Config

    script = work / "open_webui/migrations"
    (script / "env.py").write_text(ENV)
    config = Config()
    config.set_main_option("script_location", str(script))
    config.set_main_option("sqlalchemy.url", f"sqlite:///{database}")
    command.upgrade(config, "heads")


def insert_memories(database: Path) -> None:
    """The memories, as Open WebUI's `MemoriesTable` writes them."""
    import uuid

    connection = sqlite3.connect(database)
    ids: dict[tuple[str, int], str] = {}
    for user_id, memories in USERS.items():
        for index, (content, at) in enumerate(memories):
            ids[user_id, index] = memory_id = str(uuid.uuid4())
            connection.execute(
                "INSERT INTO memory (id, user_id, content, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (memory_id, user_id, content, BASE + at, BASE + at),
            )
    for user_id, index, content, at in EDITS:
        connection.execute(
            "UPDATE memory SET content = ?, updated_at = ? WHERE id = ?",
            (content, BASE + at, ids[user_id, index]),
        )
    connection.commit()
    connection.close()


def main() -> None:
    wheel, out = Path(sys.argv[1]), Path(sys.argv[2])
    out.unlink(missing_ok=True)
    stand_ins()
    with tempfile.TemporaryDirectory() as work:
        migrate(wheel, out, Path(work))
    insert_memories(out)
    connection = sqlite3.connect(out)
    connection.execute("VACUUM")
    connection.close()


if __name__ == "__main__":
    main()
