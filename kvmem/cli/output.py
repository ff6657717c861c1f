"""How a `kvmem` command prints its result: JSON for scripts, tables and short text for people.

On a terminal a command shows its value through a view (`kvmem/cli/views.py`); with `--json`,
or when stdout is not a terminal (a pipe, a file, a script's capture), it prints the value as
indented JSON, exactly as before there were views, so no script breaks. Colour follows the
terminal and `NO_COLOR` (https://no-color.org: set and not empty, no colour).

rich draws the tables; it is imported only when a view runs, so neither `import kvmem.cli`
nor a piped command loads it. Text from people and models (keys, values, messages) goes into
a view as `Text`, never as markup, with control characters shown, not sent to the terminal.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import click

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

F = TypeVar("F", bound=Callable[..., Any])
JSON_FLAG = "kvmem.json"  # where `--json` is kept, in the command's context meta

# A view prints a command's JSON value for a person, on a console.
View = Callable[[Any, "Console"], None]

# C0 and C1 control characters but tab: an ESC in a value a model wrote must not reach the
# terminal as a command (move the cursor, retitle the window, clear the screen).
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def json_option(command: F) -> F:
    """`--json`: print JSON even on a terminal."""
    return click.option(
        "--json",
        "as_json",
        is_flag=True,
        expose_value=False,
        callback=_remember_json,
        help="Print JSON (the default when stdout is not a terminal).",
    )(command)


def _remember_json(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    ctx.meta[JSON_FLAG] = value


def for_people() -> bool:
    """Whether to print for a person: stdout is a terminal and `--json` was not given."""
    ctx = click.get_current_context(silent=True)
    wants_json = bool(ctx is not None and ctx.meta.get(JSON_FLAG))
    return not wants_json and sys.stdout.isatty()


def print_json(value: Any) -> None:
    """Print `value` as indented JSON."""
    click.echo(json.dumps(value, indent=2, ensure_ascii=False))


def show(value: Any, view: View) -> None:
    """Print `value` through `view` for a person at a terminal, else as JSON."""
    if for_people():
        view(value, console())
    else:
        print_json(value)


def console() -> Console:
    """A rich console on stdout: colour as the terminal allows, none under `NO_COLOR`."""
    from rich.console import Console

    return Console(highlight=False, no_color=bool(os.environ.get("NO_COLOR")))


def text(value: Any, style: str = "") -> Text:
    """`value` as literal text in one line: never read as markup, control characters and
    line breaks shown as `\\n`, `\\x1b`, ... (a view cuts it to the width)."""
    from rich.text import Text

    string = "" if value is None else str(value)
    return Text(_CONTROL.sub(_escape, string), style=style)


def _escape(match: re.Match[str]) -> str:
    character = match.group()
    return "\\n" if character == "\n" else f"\\x{ord(character):02x}"


@dataclass(frozen=True)
class Column:
    """One column of a view's table: its header, how a row's cell is read, and its layout.

    `fill` marks the one column that takes the width left and is cut to it with an ellipsis
    (a value), the others keep their natural width. A new field of a row is a new `Column`
    in the view's tuple."""

    header: str
    cell: Callable[[dict[str, Any]], Any]
    justify: Literal["left", "right"] = "left"
    style: str = ""
    fill: bool = False


def table(rows: Sequence[dict[str, Any]], columns: Sequence[Column]) -> Any:
    """A borderless table of `rows`, one line each, headers in bold."""
    from rich import box
    from rich.table import Table

    grid = Table(
        box=box.SIMPLE_HEAD, show_edge=False, header_style="bold", pad_edge=False, expand=False
    )
    for column in columns:
        grid.add_column(
            column.header,
            justify=column.justify,
            no_wrap=True,
            overflow="ellipsis",
            ratio=1 if column.fill else None,
            min_width=12 if column.fill else None,
        )
    if any(column.fill for column in columns):
        grid.expand = True
    for row in rows:
        grid.add_row(*(text(column.cell(row), column.style) for column in columns))
    return grid


def short_time(value: str | None) -> str:
    """An ISO 8601 UTC time as `2026-12-05 04:12` (minutes are enough to read)."""
    if not value:
        return ""
    return value.replace("T", " ")[:16]
