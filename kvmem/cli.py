"""The `kvmem` command: serve, check the config, migrate, edit memory, manage keys, and
evaluate the memory agent (`kvmem eval`).

Only this module knows click. It imports neither litellm nor tiktoken at import time (a test
checks it), so `kvmem memory list` starts fast; `serve` imports the app and `eval` its
machinery when they run.
Exit codes: 0 success, 1 a failed operation, 2 bad usage or config.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from kvmem.config_loader import LoadedConfig, find_config_path, load_config
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
        loaded = load_config(find_config_path(explicit, os.environ))
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


def print_json(value: Any) -> None:
    """Print `value` as indented JSON."""
    click.echo(json.dumps(value, indent=2, ensure_ascii=False))


def checked_user(user_id: str) -> str:
    """`user_id` if it is a valid user id, else exit 2."""
    from kvmem.auth import check_user_id

    with operation():
        return check_user_id(user_id)


def open_database(loaded: LoadedConfig) -> Any:
    """The configured database, migrated to the newest schema."""
    from kvmem.db import Database
    from kvmem.migrate import ensure_current

    database = Database.from_config(loaded.config.database)
    try:
        ensure_current(database.engine)
    except Exception as exc:  # any driver or migration failure: report it, masked
        fail(f"cannot open database {loaded.config.database.masked_url()}: {_reason(exc)}", 2)
    return database


def _reason(exc: Exception) -> str:
    return str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]


def open_store(loaded: LoadedConfig) -> Any:
    """A `MemoryStore` on the configured database, with the configured rules."""
    from kvmem.rules import MemoryRules
    from kvmem.store import MemoryStore
    from kvmem.tokens import TokenCounter

    rules = MemoryRules.from_config(loaded.config.memory)
    return MemoryStore(
        open_database(loaded),
        rules,
        TokenCounter(),
        keep_days=loaded.config.memory.history.keep_days,
    )


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@config_option
@click.version_option(package_name="kvmem")
def main() -> None:
    """kvmem: a key/value memory sidecar for LLM chat."""


@main.command()
@config_option
@click.option("--host", default=None, help="Interface to bind (default: server.host).")
@click.option("--port", type=int, default=None, help="Port to bind (default: server.port).")
def serve(host: str | None, port: int | None) -> None:
    """Run pending migrations, then serve the HTTP API."""
    loaded = loaded_config()
    config = loaded.config
    host = host or config.server.host
    port = config.server.port if port is None else port
    # The app's default server.allowed_hosts names the host it is bound to: --host's.
    config = config.model_copy(update={"server": config.server.model_copy(update={"host": host})})
    if config.auth.mode == "local" and not config.server.is_loopback(host):
        fail(
            f"auth.mode is local (no credentials), so kvmem only binds a loopback address; "
            f"{host!r} is not one. Use 127.0.0.1, or set auth.mode: keys.",
            2,
        )
    database = open_database(loaded)

    import signal

    import uvicorn

    from kvmem.app import create_app
    from kvmem.http_protocol import uvicorn_options

    # uvicorn drains on SIGTERM/SIGINT, then re-raises the signal to the handler that was
    # there before it: with this one, a drained shutdown ends the process with exit code 0.
    for shutdown_signal in (signal.SIGTERM, signal.SIGINT):
        signal.signal(shutdown_signal, lambda *_: None)
    click.echo(f"kvmem: the memory page is at {page_url(host, port)}", err=True)
    uvicorn.run(
        create_app(config, database=database),
        host=host,
        port=port,
        log_level="info",
        # uvicorn waits with asyncio, so any number of seconds works; its annotation says int.
        timeout_graceful_shutdown=config.server.drain_seconds,  # type: ignore[arg-type]
        **uvicorn_options(config.server),
    )


def page_url(host: str, port: int) -> str:
    """The memory page's address for a server bound to `host` (a wildcard means this machine)."""
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/ui"


@main.command()
@config_option
def check() -> None:
    """Validate the config and print the effective settings, secrets masked."""
    import yaml

    loaded = loaded_config()
    config = loaded.config
    settings = config.model_dump(mode="json", by_alias=True)
    settings["database"]["url"] = config.database.masked_url()
    click.echo(f"# config: {loaded.path.resolve()}")
    click.echo(yaml.safe_dump(settings, sort_keys=False, allow_unicode=True).rstrip())
    on, reason = config.agent_status()
    click.echo(f"# memory agent: {'on' if on else 'off'} ({reason})")


@main.command()
@config_option
@user_option
def mcp(user_id: str) -> None:
    """Serve the MCP server on stdin/stdout, acting for --user (run pending migrations first).

    For MCP clients that start kvmem themselves; stdout carries only the protocol.
    """
    loaded = loaded_config()
    user_id = checked_user(user_id)
    database = open_database(loaded)

    import anyio

    from kvmem.app import build_services
    from kvmem.mcp_server import serve_stdio

    services = build_services(loaded.config, database=database)

    async def serve() -> None:
        try:
            await serve_stdio(services, user_id)
        finally:
            await services.client.aclose()

    try:
        anyio.run(serve)
    finally:
        database.dispose()


@main.group()
@config_option
def db() -> None:
    """Database migrations."""


@db.command("upgrade")
@config_option
def db_upgrade() -> None:
    """Apply pending migrations."""
    from kvmem.migrate import current_revision

    database = open_database(loaded_config())
    click.echo(f"database at revision {current_revision(database.engine)}")


@db.command("current")
@config_option
def db_current() -> None:
    """Print the database's revision and the newest one kvmem ships."""
    from kvmem.db import Database
    from kvmem.migrate import current_revision, head_revision

    loaded = loaded_config()
    database = Database.from_config(loaded.config.database)
    try:
        current = current_revision(database.engine)
    except Exception as exc:  # an unreachable database is a usage problem here
        fail(f"cannot open database {loaded.config.database.masked_url()}: {_reason(exc)}", 2)
    head = head_revision(database.engine)
    state = "up to date" if current == head else "pending migrations: run `kvmem db upgrade`"
    click.echo(f"current: {current or 'none (blank database)'}\nhead: {head}\n{state}")


@main.group()
@config_option
def memory() -> None:
    """Read and edit a user's memory entries (same rules as the REST API)."""


@memory.command("list")
@config_option
@user_option
def memory_list(user_id: str) -> None:
    """Print the user's entries (newest first) and usage, as GET /memory does."""
    from kvmem.overview import memory_overview

    loaded = loaded_config()
    user_id = checked_user(user_id)
    store = open_store(loaded)
    with operation():
        print_json(memory_overview(store.snapshot(user_id), loaded.config))


@memory.command("get")
@config_option
@user_option
@click.argument("key")
def memory_get(user_id: str, key: str) -> None:
    """Print one entry."""
    loaded = loaded_config()
    user_id = checked_user(user_id)
    store = open_store(loaded)
    with operation():
        print_json(store.get(user_id, key).as_json())


@memory.command("set")
@config_option
@user_option
@click.argument("key")
@click.argument("value")
def memory_set(user_id: str, key: str, value: str) -> None:
    """Create or replace an entry (VALUE '-' reads standard input)."""
    loaded = loaded_config()
    user_id = checked_user(user_id)
    if value == "-":
        value = sys.stdin.read()
    store = open_store(loaded)
    with operation():
        written = store.set(user_id, key, value, "manual")
        print_json(
            {
                "memory": written.entry.as_json(),
                "total_tokens": written.total_tokens,
                "token_limit": loaded.config.memory.token_limit,
            }
        )


@memory.command("delete")
@config_option
@user_option
@click.argument("key")
def memory_delete(user_id: str, key: str) -> None:
    """Delete an entry."""
    loaded = loaded_config()
    user_id = checked_user(user_id)
    store = open_store(loaded)
    with operation():
        store.delete(user_id, key)
    click.echo(f"deleted {key}")


@memory.command("clear")
@config_option
@user_option
def memory_clear(user_id: str) -> None:
    """Delete all of the user's entries."""
    loaded = loaded_config()
    user_id = checked_user(user_id)
    store = open_store(loaded)
    with operation():
        print_json({"deleted": store.clear(user_id)})


@memory.command("export")
@config_option
@user_option
@click.argument("file", required=False, type=click.Path(dir_okay=False, allow_dash=True))
def memory_export(user_id: str, file: str | None) -> None:
    """Write the user's memory as a kvmem.memory.v1 document to FILE (default: stdout)."""
    from kvmem.exports import export_document

    loaded = loaded_config()
    user_id = checked_user(user_id)
    store = open_store(loaded)
    with operation():
        document = export_document(user_id, store.snapshot(user_id))
    text = json.dumps(document, indent=2, ensure_ascii=False) + "\n"
    if file in (None, "-"):
        click.echo(text, nl=False)
    else:
        Path(file).write_text(text, encoding="utf-8")


@memory.command("import")
@config_option
@user_option
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--replace", is_flag=True, help="Delete the user's other entries too.")
def memory_import(user_id: str, file: str, replace: bool) -> None:
    """Write the entries of a document made by `export` (all or none)."""
    from kvmem.exports import read_document

    loaded = loaded_config()
    user_id = checked_user(user_id)
    try:
        text = sys.stdin.read() if file == "-" else Path(file).read_text(encoding="utf-8")
        data = json.loads(text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        fail(f"cannot read {file}: {exc}", 2)
    with operation():
        items = read_document(data)
    store = open_store(loaded)
    with operation():
        imported = store.import_document(
            user_id, items, mode="replace" if replace else "merge"
        )
    print_json(
        {
            "imported": imported.imported,
            "deleted": imported.deleted,
            "total_tokens": imported.total_tokens,
            "token_limit": loaded.config.memory.token_limit,
        }
    )


@memory.command("history")
@config_option
@user_option
@click.argument("key", required=False)
@click.option("--limit", type=click.IntRange(1, 500), default=50, show_default=True,
              help="How many changes to show (newest first).")
@click.option("--before", type=click.IntRange(min=1), default=None,
              help="Only changes with an id below this (the `next` of the previous page).")
def memory_history(user_id: str, key: str | None, limit: int, before: int | None) -> None:
    """Print the user's changes (of KEY, if given), newest first, as GET /memory/history."""
    loaded = loaded_config()
    user_id = checked_user(user_id)
    store = open_store(loaded)
    with operation():
        print_json(store.history(user_id, key, limit, before).as_json())


@memory.command("revert")
@config_option
@user_option
@click.argument("key")
@click.argument("change_id", type=int)
def memory_revert(user_id: str, key: str, change_id: int) -> None:
    """Set KEY back to its value right after change CHANGE_ID (every write rule applies)."""
    loaded = loaded_config()
    user_id = checked_user(user_id)
    store = open_store(loaded)
    with operation():
        reverted = store.revert(user_id, key, change_id)
    print_json(
        {
            "memory": reverted.entry.as_json() if reverted.entry else None,
            "total_tokens": reverted.total_tokens,
            "token_limit": loaded.config.memory.token_limit,
        }
    )


def open_proposals(loaded: LoadedConfig) -> Any:
    """A `ProposalStore` on the configured database, with the configured rules."""
    from kvmem.proposals import ProposalStore

    return ProposalStore(open_store(loaded))


@memory.command("proposals")
@config_option
@user_option
def memory_proposals(user_id: str) -> None:
    """Print the memory agent's proposals waiting for review, newest first."""
    loaded = loaded_config()
    user_id = checked_user(user_id)
    proposals = open_proposals(loaded)
    with operation():
        print_json({"proposals": [p.as_json() for p in proposals.pending(user_id)]})


@memory.command("accept")
@config_option
@user_option
@click.argument("proposal_id", metavar="ID", type=click.IntRange(min=1))
def memory_accept(user_id: str, proposal_id: int) -> None:
    """Keep proposal ID: write it as the agent's (every write rule applies; a refused one
    stays pending)."""
    loaded = loaded_config()
    user_id = checked_user(user_id)
    proposals = open_proposals(loaded)
    with operation():
        accepted = proposals.accept(user_id, proposal_id)
    print_json(
        {
            "memory": accepted.entry.as_json() if accepted.entry else None,
            "total_tokens": accepted.total_tokens,
            "token_limit": loaded.config.memory.token_limit,
        }
    )


@memory.command("reject")
@config_option
@user_option
@click.argument("proposal_id", metavar="ID", type=click.IntRange(min=1))
def memory_reject(user_id: str, proposal_id: int) -> None:
    """Dismiss proposal ID."""
    loaded = loaded_config()
    user_id = checked_user(user_id)
    proposals = open_proposals(loaded)
    with operation():
        proposals.reject(user_id, proposal_id)
    click.echo(f"rejected {proposal_id}")


@main.group()
@config_option
def user() -> None:
    """Whole users: erase everything kvmem holds for one."""


@user.command("erase")
@config_option
@click.option("--user", "user_id", required=True, help="The user to erase.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def user_erase(user_id: str, yes: bool) -> None:
    """Delete the user's entries, history, pending proposals, conversations, preferences,
    usage, sessions and API keys, in one transaction; prints the counts."""
    loaded = loaded_config()
    user_id = checked_user(user_id)
    if not yes:
        if not sys.stdin.isatty():
            fail("refusing to erase without --yes when standard input is not a terminal", 2)
        click.confirm(f"Erase everything kvmem holds for user {user_id!r}?", abort=True)
    store = open_store(loaded)
    with operation():
        erased = store.erase_user(user_id)
    print_json(erased.as_json())


@main.command()
@config_option
@click.option("--user", "user_id", default=None, help="Only this user, per UTC day.")
@click.option(
    "--days", type=click.IntRange(1, 366), default=30, show_default=True,
    help="How many UTC days back, today included.",
)
def usage(user_id: str | None, days: int) -> None:
    """What the memory agent used: per day for --user (as GET /usage), else per user."""
    from kvmem.tables import utcnow
    from kvmem.usage import UsageStore, UsageSum

    loaded = loaded_config()
    if user_id is not None:
        user_id = checked_user(user_id)
    store = UsageStore(open_database(loaded))
    with operation():
        if user_id is not None:
            print_json(store.daily(user_id, days, utcnow()).as_json())
            return
        users = store.by_user(days, utcnow())
    totals = UsageSum()
    for _, used in users:
        totals += used
    print_json(
        {
            "users": [{"user": user, **used.as_json()} for user, used in users],
            "totals": totals.as_json(),
        }
    )


class PassRate(click.ParamType):
    """A share of runs: `0.9` or `90%`."""

    name = "rate"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        """`value` as a number from 0 to 1."""
        if isinstance(value, float):
            return value
        text = str(value).strip()
        try:
            rate = float(text.removesuffix("%")) / (100 if text.endswith("%") else 1)
        except ValueError:
            self.fail(f"{value!r} is not a pass rate: write 0.9 or 90%", param, ctx)
        if not 0 <= rate <= 1:
            self.fail(f"{value!r} is not between 0 and 1 (0% and 100%)", param, ctx)
        return rate


@main.command("eval")
@config_option
@click.option("--suite", "suite_path", type=click.Path(dir_okay=False), default=None,
              help="Scenarios to run (YAML, or JSON lines ending in .jsonl); "
                   "default: the built-in suite.")
@click.option("--model", default=None,
              help="PROVIDER/MODEL to evaluate instead of memory.agent's "
                   "(its endpoint and key stay).")
@click.option("--repeat", type=click.IntRange(1, 100), default=1, show_default=True,
              help="Runs of each scenario (for models that vary).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
@click.option("--min-pass", type=PassRate(), default=0.0, show_default=True,
              help="Exit 1 when the pass rate (with --gate: the recall) is under this: 0.9 or 90%.")
@click.option("--gate", is_flag=True,
              help="Measure the intent gate on the suite's messages instead (no model calls).")
@click.option("--concurrency", type=click.IntRange(1, 64), default=4, show_default=True,
              help="Scenario runs in flight at once.")
@click.option("--placement", type=click.Choice(["separate", "inline"]), default=None,
              help="Score the memory agent (separate) or the main model's markers (inline); "
                   "default: memory.agent.placement.")
def evaluate(
    suite_path: str | None, model: str | None, repeat: int, as_json: bool, min_pass: float,
    gate: bool, concurrency: int, placement: str | None,
) -> None:
    """Measure the memory agent's model on scenarios, each on a fresh temporary store."""
    from kvmem.errors import SuiteError
    from kvmem.eval_suite import builtin_suite, load_suite

    loaded = loaded_config()
    try:
        suite = load_suite(Path(suite_path)) if suite_path else builtin_suite()
    except SuiteError as exc:
        fail(str(exc), 2)
    if gate:
        from kvmem.eval_report import GateSummary
        from kvmem.evaluation import measure_gate

        agent = loaded.config.memory.agent
        summary = GateSummary(tuple(measure_gate(
            suite.scenarios, agent.trigger_phrases if agent else ()
        )))
        if as_json:
            print_json({"suite": suite.source, **summary.as_json()})
        else:
            click.echo(summary.text(suite.source))
        if summary.recall < min_pass:
            sys.exit(1)
        return

    import logging

    import anyio

    from kvmem.eval_report import evaluation_json, evaluation_text
    from kvmem.evaluation import Evaluation, eval_config

    # A failed run's error is in the report; the agent's own warning would say it again.
    agent_log = logging.getLogger("kvmem.agent")
    level = agent_log.level
    agent_log.setLevel(logging.ERROR)
    try:
        config = eval_config(loaded.config, model, placement)
        evaluation = Evaluation(config, suite, repeat=repeat, concurrency=concurrency)
        results = anyio.run(evaluation.run)
    except (ConfigError, SuiteError) as exc:
        fail(f"{loaded.path}: {exc}" if isinstance(exc, ConfigError) else str(exc), 2)
    finally:
        agent_log.setLevel(level)  # as it was (for a caller that runs the command in-process)
    mode = "inline" if evaluation.inline else (
        config.memory.agent.mode if config.memory.agent else "tools")
    facts = {"suite": suite.source, "model": evaluation.target.model, "mode": mode}
    if as_json:
        print_json(evaluation_json(results, **facts, repeat=repeat))
    else:
        click.echo(evaluation_text(results, **facts, repeat=repeat))
    passed = sum(result.passed for result in results)
    if passed < min_pass * len(results):
        sys.exit(1)


@main.group()
@config_option
def keys() -> None:
    """User API keys for auth.mode: keys."""


def open_keys(loaded: LoadedConfig) -> Any:
    """A `KeyStore` on the configured database."""
    from kvmem.credentials import KeyStore

    return KeyStore(open_database(loaded))


@keys.command("create")
@config_option
@click.option("--user", "user_id", required=True, help="The user the key acts for.")
def keys_create(user_id: str) -> None:
    """Create a key; the key itself is printed once, alone on the last line."""
    loaded = loaded_config()
    user_id = checked_user(user_id)
    with operation():
        info, secret = open_keys(loaded).create(user_id)
    click.echo(f"created {info.id} for user {user_id}; store the key now, it is not shown again:")
    click.echo(secret)


@keys.command("list")
@config_option
@click.option("--user", "user_id", default=None, help="Only this user's keys.")
def keys_list(user_id: str | None) -> None:
    """List keys: ids and prefixes, never the keys."""
    loaded = loaded_config()
    if user_id is not None:
        user_id = checked_user(user_id)
    with operation():
        infos = open_keys(loaded).list(user_id)
    print_json({"keys": [info.as_json() for info in infos]})


@keys.command("revoke")
@config_option
@click.argument("key_id")
@click.option("--user", "user_id", default=None, help="Only if the key is this user's.")
def keys_revoke(key_id: str, user_id: str | None) -> None:
    """Revoke a key by its id; it, and every session of its user, stops working at once."""
    loaded = loaded_config()
    with operation():
        info = open_keys(loaded).revoke(key_id, user_id)
    click.echo(f"revoked {info.id} of user {info.user_id}; the user's sessions are ended")
