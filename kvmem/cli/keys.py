"""`kvmem keys`: user API keys for `auth.mode: keys`."""

from __future__ import annotations

from typing import Any

import click

from kvmem.cli import views
from kvmem.cli.command import (
    checked_user,
    config_option,
    loaded_config,
    open_database,
    operation,
)
from kvmem.cli.output import json_option, show
from kvmem.config_loader import LoadedConfig


@click.group("keys")
@config_option
def keys_group() -> None:
    """User API keys for auth.mode: keys."""


def open_keys(loaded: LoadedConfig) -> Any:
    """A `KeyStore` on the configured database."""
    from kvmem.server.credentials import KeyStore

    return KeyStore(open_database(loaded))


@keys_group.command("create")
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


@keys_group.command("list")
@config_option
@click.option("--user", "user_id", default=None, help="Only this user's keys.")
@json_option
def keys_list(user_id: str | None) -> None:
    """List keys: ids and prefixes, never the keys."""
    loaded = loaded_config()
    if user_id is not None:
        user_id = checked_user(user_id)
    with operation():
        infos = open_keys(loaded).list(user_id)
    show({"keys": [info.as_json() for info in infos]}, views.keys)


@keys_group.command("revoke")
@config_option
@click.argument("key_id")
@click.option("--user", "user_id", default=None, help="Only if the key is this user's.")
def keys_revoke(key_id: str, user_id: str | None) -> None:
    """Revoke a key by its id; it, and every session of its user, stops working at once."""
    loaded = loaded_config()
    with operation():
        info = open_keys(loaded).revoke(key_id, user_id)
    click.echo(f"revoked {info.id} of user {info.user_id}; the user's sessions are ended")
