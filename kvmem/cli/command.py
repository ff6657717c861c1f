"""What every `kvmem` command shares: the `--config` and `--user` options, loading the
config, opening the database and the store, and turning failures into exit codes.

Exit codes: 0 success, 1 a failed operation, 2 bad usage or config.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn, TypeVar

import click

from kvmem.config_loader import LoadedConfig, load_found_config
from kvmem.errors import BadRequest, ConfigError, KvmemError

F = TypeVar("F", bound=Callable[..., Any])


def config_option(command: F) -> F:
    """`--config PATH` on a command; the nearest one given wins."""
    return click.option(
        "--config",
        "config_path",
        type=click.Path(dir_okay=False),
        default=None,
        expose_value=False,
        is_eager=True,
        callback=_remember_config,
        help="memory.yaml to use (default: $KVMEM_CONFIG, else ./memory.yaml).",
    )(command)


def _remember_config(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is not None:
        ctx.ensure_object(dict)["config_path"] = value


def user_option(command: F) -> F:
    """`--user U`: whose memory a command works on."""
    return click.option(
        "--user",
        "user_id",
        default="local",
        show_default=True,
        help="The user id (the user of auth.mode: local is 'local').",
    )(command)


def scope_option(command: F) -> F:
    """`--scope NAME`: which layer of the user's memory a command works on."""
    return click.option(
        "--scope",
        "scope_name",
        metavar="NAME",
        default=None,
        help="The scope to work on: an assistant, a model or a project whose memory is kept "
        "apart from the person's own (memory.scopes; 1-128 characters of A-Z a-z 0-9 . _ : @ "
        "/ -). Leave out for the person's own memory.",
    )(command)


def checked_scope(loaded: LoadedConfig, name: str | None) -> str:
    """The layer `--scope` names ("" without it: the person's own), else exit 2 saying why: a
    malformed name, or a config without `memory.scopes`."""
    from kvmem.memory.rules import MemoryRules

    rules = MemoryRules.from_config(loaded.config.memory)
    if name is not None and rules.scoped is None:
        fail(
            f"--scope {name}: {loaded.source()} keeps no scopes (memory.scopes is not "
            "configured); leave out --scope for the person's own memory",
            2,
        )
    try:
        return rules.scope(name)
    except BadRequest as exc:
        fail(f"--scope {name!r}: {exc.message}", 2)


def fail(message: str, code: int) -> NoReturn:
    """Print `message` to stderr and exit with `code`."""
    click.echo(f"kvmem: {message}", err=True)
    sys.exit(code)


def loaded_config() -> LoadedConfig:
    """The config named by the nearest `--config`, with its warnings printed to stderr."""
    ctx: click.Context | None = click.get_current_context()
    explicit = None
    while ctx is not None:
        explicit = explicit or (ctx.obj or {}).get("config_path")
        ctx = ctx.parent
    try:
        loaded = load_found_config(explicit, os.environ)
    except ConfigError as exc:
        fail(str(exc), 2)
    for warning in loaded.warnings:
        click.echo(f"kvmem: warning: {warning}", err=True)
    return loaded


@contextmanager
def operation() -> Iterator[None]:
    """Turn kvmem's errors into a message on stderr and exit code 1 (2 for bad input)."""
    try:
        yield
    except BadRequest as exc:
        fail(exc.message, 2)
    except KvmemError as exc:
        fail(f"{exc.code}: {exc.message}", 1)


def checked_user(user_id: str) -> str:
    """`user_id` if it is a valid user id, else exit 2."""
    from kvmem.server.auth import check_user_id

    with operation():
        return check_user_id(user_id)


def open_database(loaded: LoadedConfig) -> Any:
    """The configured database, migrated to the newest schema; its connections are closed
    when the command ends."""
    from kvmem.db.engine import Database
    from kvmem.db.migrate import ensure_current

    database = Database.from_config(loaded.config.database)
    # Closed when the command ends, whichever way it ends.
    click.get_current_context().call_on_close(database.dispose)
    try:
        ensure_current(database.engine)
    except Exception as exc:  # any driver or migration failure: report it, masked
        fail(f"cannot open database {loaded.config.database.masked_url()}: {error_reason(exc)}", 2)
    return database


def error_reason(exc: Exception) -> str:
    """The first line of a driver's (or any) error, for a one-line message."""
    return str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]


def open_store(loaded: LoadedConfig) -> Any:
    """A `MemoryStore` on the configured database, with the configured rules."""
    from kvmem.memory.rules import MemoryRules
    from kvmem.memory.store import MemoryStore
    from kvmem.tokens import TokenCounter

    rules = MemoryRules.from_config(loaded.config.memory)
    return MemoryStore(
        open_database(loaded),
        rules,
        TokenCounter(),
        keep_days=loaded.config.memory.history.keep_days,
    )
