"""`kvmem user erase` and `kvmem usage`: whole users, and what the memory agent used."""

from __future__ import annotations

import sys

import click

from kvmem.cli import views
from kvmem.cli.command import (
    checked_user,
    config_option,
    fail,
    loaded_config,
    open_database,
    open_store,
    operation,
)
from kvmem.cli.output import json_option, show


@click.group("user")
@config_option
def user_group() -> None:
    """Whole users: erase everything kvmem holds for one."""


@user_group.command("erase")
@config_option
@click.option("--user", "user_id", required=True, help="The user to erase.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@json_option
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
    show(erased.as_json(), views.erased)


@click.command()
@config_option
@click.option("--user", "user_id", default=None, help="Only this user, per UTC day.")
@click.option(
    "--days",
    type=click.IntRange(1, 366),
    default=30,
    show_default=True,
    help="How many UTC days back, today included.",
)
@json_option
def usage(user_id: str | None, days: int) -> None:
    """What the memory agent used: per day for --user (as GET /usage), else per user."""
    from kvmem.agent.usage import UsageStore, UsageSum
    from kvmem.entries import utcnow

    loaded = loaded_config()
    if user_id is not None:
        user_id = checked_user(user_id)
    store = UsageStore(open_database(loaded))
    with operation():
        if user_id is not None:
            show(store.daily(user_id, days, utcnow()).as_json(), views.daily_usage)
            return
        users = store.by_user(days, utcnow())
    totals = UsageSum()
    for _, used in users:
        totals += used
    show(
        {
            "users": [{"user": user, **used.as_json()} for user, used in users],
            "totals": totals.as_json(),
        },
        views.users_usage,
    )
