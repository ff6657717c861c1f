"""`kvmem serve`, `kvmem check` and `kvmem mcp`: the server over HTTP, the config it
would run with, and the MCP server over stdio.
"""

from __future__ import annotations

import gc
import sys

import click

from kvmem.cli import views
from kvmem.cli.command import (
    checked_scope,
    checked_user,
    config_option,
    fail,
    loaded_config,
    open_database,
    scope_option,
    user_option,
)
from kvmem.cli.output import json_option, show
from kvmem.config_loader import LoadedConfig


@click.command()
@config_option
@click.option("--host", default=None, help="Interface to bind (default: server.host).")
@click.option("--port", type=int, default=None, help="Port to bind (default: server.port).")
def serve(host: str | None, port: int | None) -> None:
    """Run pending migrations, then serve the HTTP API."""
    # Start-up makes objects that live as long as the process and little garbage: no
    # collection until it is done (~0.1 s of CPU less); the app then freezes what it made
    # and turns the collector back on (`create_app(freeze_gc=True)`).
    gc.disable()
    loaded = loaded_config()
    config = loaded.config
    host = host or config.server.host
    port = config.server.port if port is None else port
    # The app's default server.allowed_hosts names the host it is bound to: --host's.
    config = config.model_copy(update={"server": config.server.model_copy(update={"host": host})})
    if config.auth.mode == "local" and not config.server.is_loopback(host):
        fix = (
            "set KVMEM_SERVICE_KEY (keys mode), or write a memory.yaml"
            if loaded.builtin
            else "set auth.mode: keys"
        )
        fail(
            f"auth.mode is local (no credentials), so kvmem only binds a loopback address; "
            f"{host!r} is not one. Use 127.0.0.1, or {fix}.",
            2,
        )
    database = open_database(loaded)

    import logging
    import signal

    import uvicorn

    from kvmem.server.app import create_app
    from kvmem.server.http_protocol import uvicorn_options
    from kvmem.server.logs import configure_logging

    # uvicorn drains on SIGTERM/SIGINT, then re-raises the signal to the handler that was
    # there before it: with this one, a drained shutdown ends the process with exit code 0.
    for shutdown_signal in (signal.SIGTERM, signal.SIGINT):
        signal.signal(shutdown_signal, lambda *_: None)
    configure_logging(config.server.log_format)
    log = logging.getLogger("kvmem")
    log.info(
        "config %s; auth.mode %s; database %s",
        loaded.source(),
        config.auth.mode,
        config.database.masked_url(),
    )
    log.info("the memory page is at %s", page_url(host, port))
    uvicorn.run(
        create_app(config, database=database, freeze_gc=True),
        host=host,
        port=port,
        log_level="info",
        log_config=None,  # configure_logging's
        access_log=False,  # kvmem's own request line replaces uvicorn's
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


@click.command()
@config_option
@click.option(
    "--reach",
    is_flag=True,
    help="Also call the chat model and the agent's once each (one token); exit 1 if one fails.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.1),
    default=20.0,
    show_default=True,
    help="With --reach: seconds to wait for each model (at most chat.timeout).",
)
@json_option
def check(reach: bool, timeout: float) -> None:
    """Validate the config and print the effective settings, secrets masked; with --reach,
    whether each model answers instead."""
    loaded = loaded_config()
    if reach:
        reach_models(loaded, timeout)
        return
    import yaml

    config = loaded.config
    settings = config.model_dump(mode="json", by_alias=True)
    settings["database"]["url"] = config.database.masked_url()
    click.echo(f"# config: {loaded.source()}")
    click.echo(yaml.safe_dump(settings, sort_keys=False, allow_unicode=True).rstrip())
    on, reason = config.agent_status()
    click.echo(f"# memory agent: {'on' if on else 'off'} ({reason})")


def reach_models(loaded: LoadedConfig, timeout: float) -> None:
    """`kvmem check --reach`: each model's result; exit 1 when one could not be reached."""
    import asyncio

    from kvmem.upstream import reach

    results = asyncio.run(reach.reach_models(loaded.config, timeout))
    show(
        {"config": loaded.source(), "models": [r.as_json() for r in results]},
        views.reach,
    )
    if any(result.failed for result in results):
        sys.exit(1)


@click.command()
@config_option
@user_option
@scope_option
def mcp(user_id: str, scope_name: str | None) -> None:
    """Serve the MCP server on stdin/stdout, acting for --user (run pending migrations first).

    For MCP clients that start kvmem themselves; stdout carries only the protocol. With
    --scope, the tools act on that scope unless a call names its own (the same one).
    """
    loaded = loaded_config()
    user_id = checked_user(user_id)
    checked_scope(loaded, scope_name)
    database = open_database(loaded)

    import anyio

    from kvmem.server.app import build_services
    from kvmem.server.mcp_server import serve_stdio
    from kvmem.upstream.model_client import ModelClient

    # The MCP tools read and write memory and never call a model: litellm (~3 s of CPU and
    # ~100 MiB) is not imported for a desktop assistant's session.
    client = ModelClient.from_config(loaded.config, preload=False)
    services = build_services(loaded.config, database=database, client=client)

    async def serve() -> None:
        try:
            await serve_stdio(services, user_id, scope_name)
        finally:
            await services.client.aclose()

    try:
        anyio.run(serve)
    finally:
        database.dispose()
