"""`kvmem memory`: read and edit one user's entries, their history and the memory agent's
proposals, under the same rules as the REST API.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from kvmem.cli import views
from kvmem.cli.command import (
    checked_user,
    config_option,
    fail,
    loaded_config,
    open_store,
    operation,
    user_option,
)
from kvmem.cli.output import json_option, show
from kvmem.config_loader import LoadedConfig
from kvmem.entries import utcnow
from kvmem.memory.write_outcomes import imported_json, written_json


@click.group("memory")
@config_option
def memory_group() -> None:
    """Read and edit a user's memory entries (same rules as the REST API)."""


@memory_group.command("list")
@config_option
@user_option
@json_option
def memory_list(user_id: str) -> None:
    """Print the user's entries (newest first) and usage, as GET /memory does."""
    from kvmem.memory.overview import memory_overview

    loaded = loaded_config()
    user_id = checked_user(user_id)
    store = open_store(loaded)
    with operation():
        show(memory_overview(store.snapshot(user_id), loaded.config), views.memory_list)


@memory_group.command("get")
@config_option
@user_option
@json_option
@click.argument("key")
def memory_get(user_id: str, key: str) -> None:
    """Print one entry."""
    loaded = loaded_config()
    user_id = checked_user(user_id)
    store = open_store(loaded)
    with operation():
        show(store.get(user_id, key).as_json(), views.memory_entry)


@memory_group.command("set")
@config_option
@user_option
@json_option
@click.argument("key")
@click.argument("value")
@click.option("--expires-at", help="When it expires: YYYY-MM-DD (end of day, UTC) or RFC 3339.")
@click.option("--expires-in", help='When it expires, from now: seconds, "90m", "12h", "3d", "2w".')
def memory_set(
    user_id: str, key: str, value: str, expires_at: str | None, expires_in: str | None
) -> None:
    """Create or replace an entry (VALUE '-' reads standard input); it never expires unless
    --expires-at or --expires-in says when."""
    from kvmem.memory.expiry import expiry_of

    began = utcnow()  # a write begun before an erasure answered never lands after it
    loaded = loaded_config()
    user_id = checked_user(user_id)
    if value == "-":
        value = sys.stdin.read()
    store = open_store(loaded)
    with operation():
        expiry = expiry_of(expires_at, expires_in, store.clock())
        written = store.set(user_id, key, value, "manual", since=began, expires_at=expiry)
        show(written_json(written, loaded.config.memory.token_limit), views.written)


@memory_group.command("delete")
@config_option
@user_option
@click.argument("key")
def memory_delete(user_id: str, key: str) -> None:
    """Delete an entry."""
    began = utcnow()
    loaded = loaded_config()
    user_id = checked_user(user_id)
    store = open_store(loaded)
    with operation():
        store.delete(user_id, key, since=began)
    click.echo(f"deleted {key}")


@memory_group.command("clear")
@config_option
@user_option
@json_option
def memory_clear(user_id: str) -> None:
    """Delete all of the user's entries."""
    loaded = loaded_config()
    user_id = checked_user(user_id)
    store = open_store(loaded)
    with operation():
        show({"deleted": store.clear(user_id)}, views.cleared)


@memory_group.command("export")
@config_option
@user_option
@click.argument("file", required=False, type=click.Path(dir_okay=False, allow_dash=True))
def memory_export(user_id: str, file: str | None) -> None:
    """Write the user's memory as a kvmem.memory.v1 document to FILE (default: stdout)."""
    from kvmem.memory.exports import export_document

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


@memory_group.command("import")
@config_option
@user_option
@json_option
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--replace", is_flag=True, help="Delete the user's other entries too.")
def memory_import(user_id: str, file: str, replace: bool) -> None:
    """Write the entries of a document made by `export` (all or none)."""
    from kvmem.memory.exports import read_document, read_expiries

    began = utcnow()
    loaded = loaded_config()
    user_id = checked_user(user_id)
    try:
        text = sys.stdin.read() if file == "-" else Path(file).read_text(encoding="utf-8")
        data = json.loads(text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        fail(f"cannot read {file}: {exc}", 2)
    with operation():
        items, expires = read_document(data), read_expiries(data)
    store = open_store(loaded)
    with operation():
        mode = "replace" if replace else "merge"
        imported = store.import_document(user_id, items, mode=mode, expires=expires, since=began)
    show(imported_json(imported, loaded.config.memory.token_limit), views.imported)


@memory_group.command("history")
@config_option
@user_option
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
def memory_history(user_id: str, key: str | None, limit: int, before: int | None) -> None:
    """Print the user's changes (of KEY, if given), newest first, as GET /memory/history."""
    loaded = loaded_config()
    user_id = checked_user(user_id)
    store = open_store(loaded)
    with operation():
        show(store.history(user_id, key, limit, before).as_json(), views.history)


@memory_group.command("revert")
@config_option
@user_option
@json_option
@click.argument("key")
@click.argument("change_id", type=int)
def memory_revert(user_id: str, key: str, change_id: int) -> None:
    """Set KEY back to its value right after change CHANGE_ID (every write rule applies)."""
    loaded = loaded_config()
    user_id = checked_user(user_id)
    store = open_store(loaded)
    with operation():
        reverted = store.revert(user_id, key, change_id)
    show(written_json(reverted, loaded.config.memory.token_limit), views.written)


def open_proposals(loaded: LoadedConfig) -> Any:
    """A `ProposalStore` on the configured database, with the configured rules."""
    from kvmem.memory.proposals import ProposalStore

    return ProposalStore(open_store(loaded))


@memory_group.command("proposals")
@config_option
@user_option
@json_option
def memory_proposals(user_id: str) -> None:
    """Print the memory agent's proposals waiting for review, newest first."""
    loaded = loaded_config()
    user_id = checked_user(user_id)
    proposals = open_proposals(loaded)
    with operation():
        show({"proposals": [p.as_json() for p in proposals.pending(user_id)]}, views.proposals)


@memory_group.command("accept")
@config_option
@user_option
@json_option
@click.argument("proposal_id", metavar="ID", type=click.IntRange(min=1))
def memory_accept(user_id: str, proposal_id: int) -> None:
    """Keep proposal ID: write it as the agent's (every write rule applies; a refused one
    stays pending)."""
    loaded = loaded_config()
    user_id = checked_user(user_id)
    proposals = open_proposals(loaded)
    with operation():
        accepted = proposals.accept(user_id, proposal_id)
    show(written_json(accepted, loaded.config.memory.token_limit), views.written)


@memory_group.command("reject")
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
