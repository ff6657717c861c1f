"""`kvmem memory`: read and edit one user's entries, their history and the memory agent's
proposals, under the same rules as the REST API.

Each command works on one layer of the user's memory: their own, or with `--scope NAME` (a
config with `memory.scopes`) that scope's, under its keys and limits, and its JSON then names
the `scope` as the REST routes' bodies do. `export` without `--scope` writes every layer and
`import` puts each entry back in the layer it names; `scopes` lists the user's scopes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from kvmem.cli import views
from kvmem.cli.command import (
    checked_scope,
    checked_user,
    config_option,
    fail,
    loaded_config,
    open_store,
    operation,
    scope_option,
    user_option,
)
from kvmem.cli.output import json_option, show
from kvmem.config_loader import LoadedConfig
from kvmem.entries import utcnow
from kvmem.memory.rules import OWN, MemoryRules
from kvmem.memory.write_outcomes import imported_layers_json, in_layer, written_json


@click.group("memory")
@config_option
def memory_group() -> None:
    """Read and edit a user's memory entries (same rules as the REST API)."""


@memory_group.command("list")
@config_option
@user_option
@scope_option
@json_option
def memory_list(user_id: str, scope_name: str | None) -> None:
    """Print the user's entries (newest first) and usage, as GET /memory does (of --scope:
    that scope's, against its limits)."""
    loaded = loaded_config()
    user_id = checked_user(user_id)
    scope = checked_scope(loaded, scope_name)
    store = open_store(loaded)
    with operation():
        show(layer_overview(store, loaded, user_id, scope), views.memory_list)


def layer_overview(store: Any, loaded: LoadedConfig, user_id: str, scope: str) -> dict[str, Any]:
    """`memory list`'s value: GET /memory's body (with `?scope=`), one layer's."""
    from kvmem.memory.overview import memory_overview

    return memory_overview(store.layer(user_id, scope), loaded.config, scope=scope)


@memory_group.command("scopes")
@config_option
@user_option
@json_option
def memory_scopes(user_id: str) -> None:
    """Print the user's scopes that hold memory, by name, with their entries and tokens, as
    GET /memory/scopes does (also those kept from before memory.scopes was removed)."""
    loaded = loaded_config()
    user_id = checked_user(user_id)
    store = open_store(loaded)
    with operation():
        scopes = [
            {"scope": scope, "entries": entries, "total_tokens": tokens}
            for scope, entries, tokens in store.scopes(user_id)
        ]
    show({"scopes": scopes}, views.scopes)


@memory_group.command("get")
@config_option
@user_option
@scope_option
@json_option
@click.argument("key")
def memory_get(user_id: str, scope_name: str | None, key: str) -> None:
    """Print one entry (of --scope, if given)."""
    loaded = loaded_config()
    user_id = checked_user(user_id)
    scope = checked_scope(loaded, scope_name)
    store = open_store(loaded)
    with operation():
        show(in_layer(store.get(user_id, key, scope=scope).as_json(), scope), views.memory_entry)


@memory_group.command("set")
@config_option
@user_option
@scope_option
@json_option
@click.argument("key")
@click.argument("value")
@click.option("--expires-at", help="When it expires: YYYY-MM-DD (end of day, UTC) or RFC 3339.")
@click.option("--expires-in", help='When it expires, from now: seconds, "90m", "12h", "3d", "2w".')
def memory_set(
    user_id: str,
    scope_name: str | None,
    key: str,
    value: str,
    expires_at: str | None,
    expires_in: str | None,
) -> None:
    """Create or replace an entry (VALUE '-' reads standard input) of the person's own
    memory, or of --scope (its keys are memory.scopes.validKeys); it never expires unless
    --expires-at or --expires-in says when."""
    from kvmem.memory.expiry import expiry_of

    began = utcnow()  # a write begun before an erasure answered never lands after it
    loaded = loaded_config()
    user_id = checked_user(user_id)
    scope = checked_scope(loaded, scope_name)
    if value == "-":
        value = sys.stdin.read()
    store = open_store(loaded)
    with operation():
        expiry = expiry_of(expires_at, expires_in, store.clock())
        written = store.set(
            user_id, key, value, "manual", since=began, expires_at=expiry, scope=scope
        )
        limit = store.rules.layer(scope).token_limit
        show(in_layer(written_json(written, limit), scope), views.written)


@memory_group.command("delete")
@config_option
@user_option
@scope_option
@click.argument("key")
def memory_delete(user_id: str, scope_name: str | None, key: str) -> None:
    """Delete an entry (of --scope, if given)."""
    began = utcnow()
    loaded = loaded_config()
    user_id = checked_user(user_id)
    scope = checked_scope(loaded, scope_name)
    store = open_store(loaded)
    with operation():
        store.delete(user_id, key, since=began, scope=scope)
    click.echo(f"deleted {key}" if scope == OWN else f"deleted {key} in scope {scope}")


@memory_group.command("clear")
@config_option
@user_option
@scope_option
@json_option
def memory_clear(user_id: str, scope_name: str | None) -> None:
    """Delete all of the user's own entries, or of --scope all of that scope's (with their
    history and pending proposals); the other layers are kept."""
    loaded = loaded_config()
    user_id = checked_user(user_id)
    scope = checked_scope(loaded, scope_name)
    store = open_store(loaded)
    with operation():
        show(in_layer({"deleted": store.clear(user_id, scope)}, scope), views.cleared)


@memory_group.command("export")
@config_option
@user_option
@scope_option
@click.argument("file", required=False, type=click.Path(dir_okay=False, allow_dash=True))
def memory_export(user_id: str, scope_name: str | None, file: str | None) -> None:
    """Write the user's memory as a kvmem.memory.v1 document to FILE (default: stdout). With
    memory.scopes: every layer, each entry naming its "scope" (null: the person's own), or
    with --scope that scope's only."""
    from kvmem.memory.exports import export_document

    loaded = loaded_config()
    user_id = checked_user(user_id)
    scope = checked_scope(loaded, scope_name)
    store = open_store(loaded)
    with operation():
        if store.rules.scoped is None:  # no scopes: the person's own layer is all there is
            document = export_document(user_id, store.snapshot(user_id))
        elif scope == OWN:
            document = export_document(user_id, store.every_layer(user_id), scoped=True)
        else:
            document = export_document(user_id, store.layer(user_id, scope), scoped=True)
    text = json.dumps(document, indent=2, ensure_ascii=False) + "\n"
    if file in (None, "-"):
        click.echo(text, nl=False)
    else:
        Path(file).write_text(text, encoding="utf-8")


@memory_group.command("import")
@config_option
@user_option
@scope_option
@json_option
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@click.option(
    "--replace",
    is_flag=True,
    help="Delete the user's other entries too: of each layer the document fills (the "
    "person's own always; with --scope, that scope only).",
)
def memory_import(user_id: str, scope_name: str | None, file: str, replace: bool) -> None:
    """Write the entries of a document made by `export` (all or none, across layers): each
    into the layer its "scope" names (null: the person's own), or all into --scope."""
    from kvmem.memory.exports import read_layers

    began = utcnow()
    loaded = loaded_config()
    user_id = checked_user(user_id)
    scope = checked_scope(loaded, scope_name)
    try:
        text = sys.stdin.read() if file == "-" else Path(file).read_text(encoding="utf-8")
        data = json.loads(text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        fail(f"cannot read {file}: {exc}", 2)
    rules = MemoryRules.from_config(loaded.config.memory)
    with operation():
        layers = read_layers(data, rules, scope_name)
    store = open_store(loaded)
    with operation():
        mode = "replace" if replace else "merge"
        results = store.import_layers(user_id, layers, mode=mode, since=began)
    show(imported_layers_json(results, rules, scope), views.imported)


@memory_group.command("history")
@config_option
@user_option
@scope_option
@json_option
@click.argument("key", required=False)
@click.option(
    "--limit",
    type=click.IntRange(1, 500),
    default=50,
    show_default=True,
    help="How many changes to show (newest first).",
)
@click.option(
    "--before",
    type=click.IntRange(min=1),
    default=None,
    help="Only changes with an id below this (the `next` of the previous page).",
)
def memory_history(
    user_id: str, scope_name: str | None, key: str | None, limit: int, before: int | None
) -> None:
    """Print the user's changes (of KEY, if given; of --scope, if given), newest first, as
    GET /memory/history."""
    loaded = loaded_config()
    user_id = checked_user(user_id)
    scope = checked_scope(loaded, scope_name)
    store = open_store(loaded)
    with operation():
        page = store.history(user_id, key, limit, before, scope=scope)
    show(in_layer(page.as_json(), scope), views.history)


@memory_group.command("revert")
@config_option
@user_option
@scope_option
@json_option
@click.argument("key")
@click.argument("change_id", type=int)
def memory_revert(user_id: str, scope_name: str | None, key: str, change_id: int) -> None:
    """Set KEY (of --scope, if given) back to its value right after change CHANGE_ID (every
    write rule applies)."""
    loaded = loaded_config()
    user_id = checked_user(user_id)
    scope = checked_scope(loaded, scope_name)
    store = open_store(loaded)
    with operation():
        reverted = store.revert(user_id, key, change_id, scope=scope)
    limit = store.rules.layer(scope).token_limit
    show(in_layer(written_json(reverted, limit), scope), views.written)


def open_proposals(loaded: LoadedConfig) -> Any:
    """A `ProposalStore` on the configured database, with the configured rules."""
    from kvmem.memory.proposals import ProposalStore

    return ProposalStore(open_store(loaded))


@memory_group.command("proposals")
@config_option
@user_option
@scope_option
@json_option
def memory_proposals(user_id: str, scope_name: str | None) -> None:
    """Print the memory agent's proposals waiting for review (of --scope, if given), newest
    first."""
    loaded = loaded_config()
    user_id = checked_user(user_id)
    scope = checked_scope(loaded, scope_name)
    proposals = open_proposals(loaded)
    with operation():
        pending = [p.as_json() for p in proposals.pending(user_id, scope)]
    show(in_layer({"proposals": pending}, scope), views.proposals)


@memory_group.command("accept")
@config_option
@user_option
@scope_option
@json_option
@click.argument("proposal_id", metavar="ID", type=click.IntRange(min=1))
def memory_accept(user_id: str, scope_name: str | None, proposal_id: int) -> None:
    """Keep proposal ID (one of --scope's, if given): write it as the agent's (every write
    rule applies; a refused one stays pending)."""
    loaded = loaded_config()
    user_id = checked_user(user_id)
    scope = checked_scope(loaded, scope_name)
    proposals = open_proposals(loaded)
    with operation():
        accepted = proposals.accept(user_id, proposal_id, scope)
    limit = proposals.store.rules.layer(scope).token_limit
    show(in_layer(written_json(accepted, limit), scope), views.written)


@memory_group.command("reject")
@config_option
@user_option
@scope_option
@click.argument("proposal_id", metavar="ID", type=click.IntRange(min=1))
def memory_reject(user_id: str, scope_name: str | None, proposal_id: int) -> None:
    """Dismiss proposal ID (one of --scope's, if given)."""
    loaded = loaded_config()
    user_id = checked_user(user_id)
    scope = checked_scope(loaded, scope_name)
    proposals = open_proposals(loaded)
    with operation():
        proposals.reject(user_id, proposal_id, scope)
    click.echo(f"rejected {proposal_id}")
