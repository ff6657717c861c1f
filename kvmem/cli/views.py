"""What each `kvmem` command shows a person at a terminal: a view per JSON value.

Each view reads the very value a command prints as JSON (`output.show`), so the terminal and
a script see the same facts. Tables are tuples of `Column`s: a field added to a row (an
entry's expiry, say) is one more `Column` in its tuple.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvmem.cli.output import Column, short_time, table, text

if TYPE_CHECKING:
    from rich.console import Console

MEMORY_COLUMNS = (
    Column("KEY", lambda entry: entry["key"], style="cyan"),
    Column("VALUE", lambda entry: entry["value"], fill=True),
    Column("TOKENS", lambda entry: entry["token_count"], justify="right"),
    Column("UPDATED", lambda entry: short_time(entry["updated_at"]), style="dim"),
)

PROPOSAL_COLUMNS = (
    Column("ID", lambda proposal: proposal["id"], justify="right", style="bold"),
    Column("OP", lambda proposal: proposal["op"]),
    Column("KEY", lambda proposal: proposal["key"], style="cyan"),
    Column("VALUE", lambda proposal: proposal["value"], fill=True),
    Column("PROPOSED", lambda proposal: short_time(proposal["created_at"]), style="dim"),
)

USAGE_COLUMNS = (
    Column("RUNS", lambda used: used["agent_runs"], justify="right"),
    Column("INPUT", lambda used: used["input_tokens"], justify="right"),
    Column("OUTPUT", lambda used: used["output_tokens"], justify="right"),
    Column("COST", lambda used: _cost(used["cost_usd"]), justify="right"),
    Column("WRITES", lambda used: used["writes"], justify="right"),
)

SCOPE_COLUMNS = (
    Column("SCOPE", lambda scope: scope["scope"], style="cyan"),
    Column("ENTRIES", lambda scope: scope["entries"], justify="right"),
    Column("TOKENS", lambda scope: scope["total_tokens"], justify="right"),
)

KEY_COLUMNS = (
    Column("ID", lambda key: key["id"], style="bold"),
    Column("USER", lambda key: key["user_id"], style="cyan"),
    Column("PREFIX", lambda key: key["prefix"]),
    Column("CREATED", lambda key: short_time(key["created_at"]), style="dim"),
    Column("REVOKED", lambda key: short_time(key["revoked_at"]) or "-", style="dim"),
)

EMPTY_MEMORY = (
    "No memories yet. They appear here when you ask the assistant to remember something "
    '("remember that I prefer tea"), or add one yourself: kvmem memory set KEY VALUE'
)


def memory_list(overview: dict[str, Any], console: Console) -> None:
    """`kvmem memory list`: the entries, then how much of the limit they use (of the scope
    named above them, with --scope)."""
    memories = overview["memories"]
    if "scope" in overview:
        console.print(text(f"scope {overview['scope']}", "bold"))
    if memories:
        console.print(table(memories, MEMORY_COLUMNS))
    else:
        console.print(text(EMPTY_MEMORY))
    count = _count(len(memories), "memory", "memories")
    console.print(text(f"{count}, {_tokens_used(overview)}", "dim"))
    if not overview["enabled"]:
        console.print(
            text("Memory is off for this user: chats neither read nor write it.", "yellow")
        )


def memory_entry(entry: dict[str, Any], console: Console) -> None:
    """`kvmem memory get`: one entry, its value whole."""
    from rich.table import Table

    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column(overflow="fold")
    if "scope" in entry:
        grid.add_row("scope", text(entry["scope"]))
    grid.add_row("key", text(entry["key"], "cyan"))
    grid.add_row("value", text(entry["value"]))
    grid.add_row("tokens", text(entry["token_count"]))
    grid.add_row("source", text(entry["source"]))
    grid.add_row("created", text(short_time(entry["created_at"])))
    grid.add_row("updated", text(short_time(entry["updated_at"])))
    console.print(grid)


def written(outcome: dict[str, Any], console: Console) -> None:
    """`kvmem memory set`, `revert` and `accept`: the entry now and the total."""
    entry = outcome["memory"]
    if entry is None:
        console.print(text("deleted"), end=" ")
    else:
        console.print(
            text(f"saved {entry['key']} ({_count(entry['token_count'], 'token')})"), end=" "
        )
    console.print(text(f"· {_layer(outcome)}: {_tokens_used(outcome)}", "dim"))


def cleared(outcome: dict[str, Any], console: Console) -> None:
    """`kvmem memory clear`."""
    deleted = _count(outcome["deleted"], "memory", "memories")
    console.print(
        text(f"deleted {deleted}" + (f" of scope {outcome['scope']}" if "scope" in outcome else ""))
    )


def imported(outcome: dict[str, Any], console: Console) -> None:
    """`kvmem memory import`: the counts of the layer it named, or of the person's own and of
    each scope the document held, one line each."""
    for layer in (outcome, *outcome.get("scopes", ())):
        console.print(
            text(f"imported {layer['imported']}, deleted {layer['deleted']}"),
            text(f"· {_layer(layer)}: {_tokens_used(layer)}", "dim"),
        )


def history(page: dict[str, Any], console: Console) -> None:
    """`kvmem memory history`: one line per change, newest first."""
    from rich.table import Table

    if "scope" in page:
        console.print(text(f"scope {page['scope']}", "bold"))
    if not page["changes"]:
        console.print(text("No changes."))
        return
    lines = Table.grid(padding=(0, 2))
    for _ in range(5):
        lines.add_column(no_wrap=True)
    lines.add_column(overflow="ellipsis", no_wrap=True, ratio=1)
    lines.expand = True
    for change in page["changes"]:
        lines.add_row(
            text(f"#{change['id']}", "bold"),
            text(short_time(change["at"]), "dim"),
            text(change["op"], "green" if change["op"] == "set" else "red"),
            text(change["key"], "cyan"),
            text(change["source"], "dim"),
            _change_text(change),
        )
    console.print(lines)
    if page["next"] is not None:
        console.print(text(f"older changes: --before {page['next']}", "dim"))


def proposals(value: dict[str, Any], console: Console) -> None:
    """`kvmem memory proposals`: what the agent wants to write, with the ids to act on."""
    scope = f" --scope {value['scope']}" if "scope" in value else ""
    if scope:
        console.print(text(f"scope {value['scope']}", "bold"))
    if not value["proposals"]:
        console.print(text("No proposals waiting for review."))
        return
    console.print(table(value["proposals"], PROPOSAL_COLUMNS))
    console.print(
        text(
            f"keep one: kvmem memory accept{scope} ID; dismiss: kvmem memory reject{scope} ID",
            "dim",
        )
    )


def scopes(value: dict[str, Any], console: Console) -> None:
    """`kvmem memory scopes`: the user's scopes that hold memory, with what each holds."""
    if not value["scopes"]:
        console.print(text("No scopes hold memory for this user."))
        return
    console.print(table(value["scopes"], SCOPE_COLUMNS))
    console.print(text("see one: kvmem memory list --scope NAME", "dim"))


def daily_usage(value: dict[str, Any], console: Console) -> None:
    """`kvmem usage --user U`: per UTC day, then the totals."""
    rows = [*value["days"], {"date": "total", **value["totals"]}]
    columns = (Column("DATE", lambda day: day["date"]), *USAGE_COLUMNS)
    _usage(rows, columns, console)


def users_usage(value: dict[str, Any], console: Console) -> None:
    """`kvmem usage`: per user, then the totals."""
    rows = [*value["users"], {"user": "total", **value["totals"]}]
    columns = (Column("USER", lambda used: used["user"], style="cyan"), *USAGE_COLUMNS)
    _usage(rows, columns, console)


def erased(value: dict[str, Any], console: Console) -> None:
    """`kvmem user erase`: what was deleted."""
    counts = ", ".join(
        f"{count} {name.replace('_', ' ')}" for name, count in value["deleted"].items()
    )
    console.print(text(f"erased: {counts}"))


def keys(value: dict[str, Any], console: Console) -> None:
    """`kvmem keys list`: ids and prefixes, never keys."""
    if not value["keys"]:
        console.print(text("No keys. Create one: kvmem keys create --user U"))
        return
    console.print(table(value["keys"], KEY_COLUMNS))


def _usage(rows: list[dict[str, Any]], columns: tuple[Column, ...], console: Console) -> None:
    if len(rows) == 1:
        console.print(text("No agent runs in these days."))
        return
    grid = table(rows, columns)
    grid.rows[-2].end_section = True  # a rule above the totals
    console.print(grid)


def _layer(value: dict[str, Any]) -> str:
    """What a write's totals are of: `memory` (the person's own) or `scope NAME`."""
    return f"scope {value['scope']}" if "scope" in value else "memory"


def _tokens_used(value: dict[str, Any]) -> str:
    total, limit = value["total_tokens"], value["token_limit"]
    if limit is None:
        return f"{total} tokens (no limit)"
    percent = value.get("usage_percentage")
    if percent is None:
        percent = round(100 * total / limit, 1) if limit else 0.0
    return f"{total} of {limit} tokens ({percent:g} %)"


def _count(number: int, one: str, many: str | None = None) -> str:
    return f"{number} {one if number == 1 else many or one + 's'}"


def _cost(cost: float | None) -> str:
    return "-" if cost is None else f"${cost:.4f}"


def _change_text(change: dict[str, Any]) -> Any:
    old, new = change["old_value"], change["new_value"]
    if old is None:
        return text(new)
    if new is None:
        return text(old, "strike dim")
    line = text(old, "dim")
    line.append(" → ")
    line.append_text(text(new))
    return line


def reach(value: dict[str, Any], console: Console) -> None:
    """`kvmem check --reach`: per model, reached or not, where, with which key, how fast; what
    failed and what to change."""
    from rich.table import Table

    console.print(text(f"config: {value['config']}", "dim"))
    for model in value["models"]:
        console.print()
        head = text(f"{model['role']:<6}", "bold")
        if model["skipped"] is not None:
            head.append_text(text(f"{model['skipped']}", "dim"))
            console.print(head)
            continue
        head.append_text(text(f"{model['model']}  ", "cyan"))
        if model["reachable"]:
            head.append_text(text(f"reachable in {model['latency_ms']} ms", "bold green"))
        else:
            head.append_text(text("FAILED", "bold red"))
        console.print(head)
        details = Table.grid(padding=(0, 2))
        details.add_column(style="dim", no_wrap=True)
        details.add_column(overflow="fold")
        details.add_row("  url", text(model["url"]))
        details.add_row("  credential", text(model["credential"] or "none needed"))
        if model["error"] is not None:
            style = "yellow" if model["reachable"] else "red"
            details.add_row(
                "  answer" if model["reachable"] else "  error", text(model["error"], style)
            )
        if model["fix"] is not None:
            details.add_row("  fix", text(model["fix"], "bold"))
        console.print(details)
