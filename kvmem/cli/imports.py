"""`kvmem import --from openwebui|librechat|mem0 FILE`: memories brought from another system,
under the same user ids that system sends kvmem.

The work is `kvmem.importers`'; this module reads the options, shows a progress bar on a
terminal (rich, on stderr, only when stderr is one) and prints the table or the JSON.
Exit codes: 0 done, 1 any user's import refused, 2 bad usage, config or file.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from kvmem.cli.command import (
    checked_user,
    config_option,
    fail,
    loaded_config,
    open_store,
    operation,
)
from kvmem.cli.output import print_json as print_document
from kvmem.errors import KvmemError

DEFAULT_KEY = "learned_facts"


class Bar:
    """The progress bar's two steps: reading an export (bytes), importing users."""

    def __init__(self, progress: Any, path: Path) -> None:
        self.progress = progress
        self.path = path
        self.reading: Any = None  # shown once an export is read (not for a database)
        self.importing: Any = None

    def read(self, done: int) -> None:
        """`done` bytes of the file read."""
        if self.reading is None:
            size = self.path.stat().st_size
            self.reading = self.progress.add_task(f"reading {self.path.name}", total=size)
        self.progress.update(self.reading, completed=done)

    def start_users(self, total: int) -> None:
        """The file is read; `total` users to import."""
        if self.reading is not None:
            self.progress.update(self.reading, completed=self.path.stat().st_size)
        self.importing = self.progress.add_task("importing users", total=total)

    def user_done(self) -> None:
        """One more user imported."""
        self.progress.advance(self.importing)


@contextmanager
def progress_bar(path: Path) -> Iterator[Bar | None]:
    """A progress bar on stderr when it is a terminal; otherwise none."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(stderr=True), transient=True) as progress:
        yield Bar(progress, path)


@click.command("import")
@config_option
@click.option(
    "--from",
    "source",
    type=click.Choice(["openwebui", "librechat", "mem0"]),
    required=True,
    help="The system FILE comes from.",
)
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--user", "only_user", default=None, help="Import this user only.")
@click.option(
    "--key",
    "free_key",
    default=None,
    help=f"The key free-text memories go into, one line each (default: {DEFAULT_KEY}).",
)
@click.option("--review", is_flag=True, help="Make proposals for review instead of writing.")
@click.option("--dry-run", is_flag=True, help="Write nothing; print what would change.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def import_foreign(
    source: Any,
    file: Path,
    only_user: str | None,
    free_key: str | None,
    review: bool,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Bring memories from Open WebUI (webui.db), LibreChat (mongoexport of memoryentries)
    or mem0 (its JSON) into kvmem, per user, all or nothing for each."""
    from kvmem.importers.report import HEADER, Totals, json_document, table_row
    from kvmem.importers.run import ForeignImport
    from kvmem.importers.sources import FREE_TEXT, open_source

    loaded = loaded_config()
    if only_user is not None:
        only_user = checked_user(only_user)
    if free_key is not None and source not in FREE_TEXT:
        raise click.UsageError(
            "--key is for free text (openwebui, mem0): LibreChat's entries carry their own keys"
        )
    store = open_store(loaded)
    key = free_key or DEFAULT_KEY
    if source in FREE_TEXT:
        try:
            store.rules.check_key(key)
        except KvmemError as exc:  # a bad --key is bad usage
            fail(exc.message, 2)
    importer = ForeignImport(store, free_key=key, review=review, dry_run=dry_run)
    totals, outcomes = Totals(), []
    with progress_bar(file) as bar:
        on_read: Callable[[int], None] = bar.read if bar else _ignore
        with operation():
            reader = open_source(source, file, on_read)
        try:
            if bar:
                bar.start_users(reader.user_count(only_user))
            if not as_json:
                click.echo(HEADER)
            for user in reader.users(only_user):
                outcome = importer.import_user(user)
                totals.add(outcome)
                if as_json:
                    outcomes.append(outcome)
                else:
                    click.echo(table_row(outcome))
                if bar:
                    bar.user_done()
        finally:
            reader.close()
    if reader.unowned:
        click.echo(
            f"kvmem: note: {reader.unowned} memories have no user_id (an agent's or a run's) and "
            "were left out",
            err=True,
        )
    if as_json:
        print_document(json_document(outcomes, review=review))
    else:
        click.echo(totals.summary(dry_run=dry_run, review=review))
    sys.exit(1 if totals.refused_users else 0)


def _ignore(_done: int) -> None:
    """No progress bar: nothing to tell."""
