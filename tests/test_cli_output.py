"""What `kvmem` prints: tables and short text on a terminal, today's JSON when piped or with
`--json`, colour as `NO_COLOR` says; and `kvmem check --reach` against a scripted upstream
that answers, refuses and is not there.

The terminal runs are real `python -m kvmem` processes on a pseudo-terminal; the views alone
run in process on rich's recording console, as a terminal would show them.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from kvmem.cli import views
from kvmem.config_loader import load_config
from kvmem.db.engine import Database
from kvmem.db.migrate import ensure_current
from kvmem.memory.overview import memory_overview
from kvmem.memory.rules import MemoryRules
from kvmem.memory.store import MemoryStore
from kvmem.tokens import TokenCounter
from tests.support.apps import AGENT_MODEL, MAIN_MODEL
from tests.support.cli import invoke
from tests.support.ports import bound_socket
from tests.support.processes import Result, run_in_terminal
from tests.support.upstream import Reply

# Any SGR sequence that sets a colour (foreground or background, 16, 256 or true colour).
COLOUR = re.compile(r"\x1b\[(?:[0-9;]*;)?(?:3[0-8]|4[0-8]|9[0-7]|10[0-7])(?:;[0-9;]*)?m")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
LONG_VALUE = "green tea, no sugar, and long walks by the sea in the evening when it is warm " * 2
HOSTILE_VALUE = "[bold red]not markup[/] \x1b[2Jcleared? \x1b]0;title\x07\nsecond line"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "memory.yaml").write_text(
        "database: {url: 'sqlite:///kv.db'}\nmemory: {tokenLimit: 200}\n", encoding="utf-8"
    )
    return tmp_path


@pytest.fixture
def store(folder: Path, tokens: TokenCounter) -> Iterator[MemoryStore]:
    """The commands' database, in this process: to set up, not to test."""
    config = load_config(folder / "memory.yaml", environ={}).config
    database = Database.from_config(config.database)
    ensure_current(database.engine)
    yield MemoryStore(database, MemoryRules.from_config(config.memory), tokens)
    database.dispose()


def plain(output: str) -> str:
    """The terminal's text without its styles."""
    return ANSI.sub("", output)


def todays_json(value: Any) -> str:
    """What every command printed before there were views: indented JSON, one newline."""
    return json.dumps(value, indent=2, ensure_ascii=False) + "\n"


def test_memory_list_on_a_terminal_is_a_table_cut_to_the_width(
    folder: Path, store: MemoryStore
) -> None:
    store.set("local", "likes", LONG_VALUE, "manual")
    store.set("local", "job", "Baker", "agent")
    store.set("local", "notes", HOSTILE_VALUE, "manual")
    shown = run_in_terminal(["memory", "list"], cwd=folder, columns=80)
    assert (shown.code, shown.stderr) == (0, "")
    assert COLOUR.search(shown.stdout)  # keys in cyan
    lines = plain(shown.stdout).splitlines()
    assert lines[0].split() == ["KEY", "VALUE", "TOKENS", "UPDATED"]
    assert set(lines[1]) == {"─"}
    rows = {line.split()[0]: line for line in lines[2:5]}
    assert list(rows) == ["notes", "job", "likes"]  # newest first
    assert all(len(line) <= 80 for line in lines)
    assert "green tea, no sugar" in rows["likes"] and "…" in rows["likes"]
    assert rows["job"].split()[1:3] == ["Baker", str(store.get("local", "job").token_count)]
    # A value is text: markup is not read, control characters are shown, not obeyed.
    assert "[bold red]not markup[/] \\x1b[2Jcleared?" in rows["notes"]
    assert "\x1b[2J" not in shown.stdout and "\x1b]0;" not in shown.stdout
    total = sum(entry.token_count for entry in store.snapshot("local").entries)
    assert lines[5:] == [f"3 memories, {total} of 200 tokens ({round(total / 2, 1):g} %)"]


def test_no_color_keeps_the_table_and_drops_the_colour(folder: Path, store: MemoryStore) -> None:
    store.set("local", "job", "Baker", "agent")
    coloured = run_in_terminal(["memory", "list"], cwd=folder)
    uncoloured = run_in_terminal(["memory", "list"], cwd=folder, env={"NO_COLOR": "1"})
    assert COLOUR.search(coloured.stdout) and not COLOUR.search(uncoloured.stdout)
    assert plain(uncoloured.stdout) == plain(coloured.stdout)
    # no-color.org: an empty NO_COLOR does not count.
    assert run_in_terminal(["memory", "list"], cwd=folder, env={"NO_COLOR": ""}).stdout == (
        coloured.stdout
    )


def test_piped_or_with_json_the_output_is_todays_json(folder: Path, store: MemoryStore) -> None:
    store.set("local", "likes", LONG_VALUE, "manual")
    store.set("local", "notes", HOSTILE_VALUE, "manual")
    config = load_config(folder / "memory.yaml", environ={}).config
    expected = {
        ("memory", "list"): memory_overview(store.snapshot("local"), config),
        ("memory", "get", "likes"): store.get("local", "likes").as_json(),
        ("memory", "history"): store.history("local", None, 50, None).as_json(),
        ("memory", "proposals"): {"proposals": []},
        ("keys", "list"): {"keys": []},
    }
    for command, value in expected.items():
        piped = invoke(list(command), cwd=folder)
        assert (piped.code, piped.stdout) == (0, todays_json(value)), command
        assert invoke([*command, "--json"], cwd=folder).stdout == piped.stdout
    on_terminal = run_in_terminal(["memory", "list", "--json"], cwd=folder)
    assert on_terminal.stdout == todays_json(expected[("memory", "list")])


def test_an_empty_memory_says_how_memory_gets_there(folder: Path) -> None:
    shown = run_in_terminal(["memory", "list"], cwd=folder)
    assert plain(shown.stdout).split() == [
        *views.EMPTY_MEMORY.split(),
        *["0", "memories,", "0", "of", "200", "tokens", "(0", "%)"],
    ]
    assert "ask the assistant to remember" in views.EMPTY_MEMORY


def render(view: Callable[[Any, Console], None], value: Any, width: int = 80) -> str:
    """`value` through `view` as an 80-column terminal shows it, without styles."""
    console = Console(
        file=io.StringIO(), width=width, force_terminal=True, record=True, highlight=False
    )
    view(value, console)
    return console.export_text()


CHANGE = {"conversation_id": None, "source": "agent", "at": "2026-12-05T04:15:09Z"}


def test_history_is_one_line_per_change() -> None:
    page = {
        "changes": [
            {
                **CHANGE,
                "id": 3,
                "key": "job",
                "op": "delete",
                "old_value": "Baker",
                "new_value": None,
            },
            {
                **CHANGE,
                "id": 2,
                "key": "job",
                "op": "set",
                "old_value": "Cook",
                "new_value": "Baker",
            },
            {**CHANGE, "id": 1, "key": "job", "op": "set", "old_value": None, "new_value": "Cook"},
        ],
        "next": 1,
    }
    assert [line.rstrip() for line in render(views.history, page).splitlines()] == [
        "#3  2026-12-05 04:15  delete  job  agent  Baker",
        "#2  2026-12-05 04:15  set     job  agent  Cook → Baker",
        "#1  2026-12-05 04:15  set     job  agent  Cook",
        "older changes: --before 1",
    ]


def test_proposals_show_their_ids_and_how_to_act_on_them() -> None:
    value = {
        "proposals": [
            {
                "id": 7,
                "key": "pet",
                "op": "set",
                "value": "a dog named Rex",
                "conversation_id": "c1",
                "created_at": "2026-12-05T04:15:09Z",
            }
        ]
    }
    lines = [line.rstrip() for line in render(views.proposals, value).splitlines()]
    assert lines[0].split() == ["ID", "OP", "KEY", "VALUE", "PROPOSED"]
    assert lines[2].split() == [
        "7",
        "set",
        "pet",
        "a",
        "dog",
        "named",
        "Rex",
        "2026-12-05",
        "04:15",
    ]
    assert lines[3] == "keep one: kvmem memory accept ID; dismiss: kvmem memory reject ID"
    assert render(views.proposals, {"proposals": []}) == "No proposals waiting for review.\n"


def test_usage_is_per_day_with_a_total() -> None:
    day = {"agent_runs": 2, "input_tokens": 900, "output_tokens": 40, "cost_usd": 0.00042}
    value = {
        "days": [{"date": "2026-12-05", **day, "writes": 1}],
        "totals": {**day, "writes": 1},
    }
    lines = [line.rstrip() for line in render(views.daily_usage, value).splitlines()]
    assert lines[0].split() == ["DATE", "RUNS", "INPUT", "OUTPUT", "COST", "WRITES"]
    assert lines[2].split() == ["2026-12-05", "2", "900", "40", "$0.0004", "1"]
    assert lines[3] == ""  # the totals stand apart
    assert lines[4].split() == ["total", "2", "900", "40", "$0.0004", "1"]
    empty = {"days": [], "totals": {**day, "agent_runs": 0, "cost_usd": None, "writes": 0}}
    assert render(views.daily_usage, empty) == "No agent runs in these days.\n"


# -- kvmem check --reach ------------------------------------------------------------------------


def reach_config(folder: Path, main_base: str, agent_base: str, agent_key: bool = True) -> None:
    """memory.yaml with both models on the given base URLs."""
    (folder / "memory.yaml").write_text(
        f"chat: {{model: openai/{MAIN_MODEL}, api_base: '{main_base}', api_key: main-key}}\n"
        "memory:\n  agent:\n"
        f"    provider: openai\n    model: {AGENT_MODEL}\n    api_base: '{agent_base}'\n"
        + ("    api_key: agent-key\n" if agent_key else ""),
        encoding="utf-8",
    )


def reached(result: Result) -> list[dict[str, Any]]:
    return json.loads(result.stdout)["models"]


def test_check_reach_calls_each_model_once_with_one_token(
    folder: Path, upstream: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    reach_config(folder, upstream.url, upstream.url)
    result = invoke(["check", "--reach"], cwd=folder)
    assert (result.code, result.stderr) == (0, "")
    models = reached(result)
    for model in models:
        assert isinstance(model.pop("latency_ms"), int)
    assert models == [
        {
            "role": role,
            "model": f"openai/{model}",
            "url": f"{upstream.url}/chat/completions",
            "credential": f"{setting} (set)",
            "reachable": True,
            "error": None,
            "fix": None,
            "skipped": None,
        }
        for role, model, setting in (
            ("chat", MAIN_MODEL, "chat.api_key"),
            ("agent", AGENT_MODEL, "memory.agent.api_key"),
        )
    ]
    for model in (MAIN_MODEL, AGENT_MODEL):
        (call,) = upstream.received(model)
        assert call.body["max_tokens"] == 1


def test_check_reach_says_what_failed_and_exits_1(
    folder: Path, upstream: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    closed = bound_socket()
    down = f"http://127.0.0.1:{closed.getsockname()[1]}/v1"
    reach_config(folder, down, upstream.url, agent_key=False)
    upstream.script(
        AGENT_MODEL, Reply(status=401, error={"error": {"message": "Incorrect API key"}})
    )
    try:
        result = invoke(["check", "--reach"], cwd=folder)
    finally:
        closed.close()
    assert result.code == 1
    chat, agent = reached(result)
    assert chat == {
        "role": "chat",
        "model": f"openai/{MAIN_MODEL}",
        "url": f"{down}/chat/completions",
        "credential": "chat.api_key (set)",
        "reachable": False,
        "latency_ms": None,
        "error": (
            f"the model call failed: cannot reach the model openai/{MAIN_MODEL} at "
            f"{down}/chat/completions (connection refused)"
        ),
        "fix": (
            "Start it there, or change chat.model (KVMEM_CHAT_MODEL in the shipped memory.yaml) "
            "or chat.api_base"
        ),
        "skipped": None,
    }
    assert agent == {
        "role": "agent",
        "model": f"openai/{AGENT_MODEL}",
        "url": f"{upstream.url}/chat/completions",
        "credential": "OPENAI_API_KEY (not set)",
        "reachable": False,
        "latency_ms": None,
        "error": "the model call failed: Incorrect API key",
        "fix": "The key was refused: check memory.agent.api_key or the provider's key variable",
        "skipped": None,
    }


def test_check_reach_skips_an_agent_that_is_off(folder: Path, upstream: Any) -> None:
    (folder / "memory.yaml").write_text(
        f"chat: {{model: openai/{MAIN_MODEL}, api_base: '{upstream.url}', api_key: k}}\n"
        "memory: {agent: {enabled: false}}\n",
        encoding="utf-8",
    )
    result = invoke(["check", "--reach"], cwd=folder)
    assert result.code == 0
    assert reached(result)[1]["skipped"] == "off: memory.agent.enabled is false"
    # Without --reach, check prints the settings as before (YAML), and calls nothing.
    assert invoke(["check"], cwd=folder).stdout.startswith("# config: ")
    assert len(upstream.received(MAIN_MODEL)) == 1


def test_check_reach_on_a_terminal(folder: Path, upstream: Any) -> None:
    closed = bound_socket()
    down = f"http://127.0.0.1:{closed.getsockname()[1]}/v1"
    reach_config(folder, upstream.url, down)
    try:
        shown = run_in_terminal(["check", "--reach"], cwd=folder, columns=100)
    finally:
        closed.close()
    assert shown.code == 1
    lines = [line.rstrip() for line in plain(shown.stdout).splitlines()]
    chat = lines.index(next(line for line in lines if line.startswith("chat ")))
    assert re.fullmatch(rf"chat  openai/{MAIN_MODEL}  reachable in \d+ ms", lines[chat])
    assert lines[chat + 1].split() == ["url", f"{upstream.url}/chat/completions"]
    assert lines[chat + 2].split() == ["credential", "chat.api_key", "(set)"]
    agent = lines.index(f"agent openai/{AGENT_MODEL}  FAILED")
    assert lines[agent + 1].split() == ["url", f"{down}/chat/completions"]
    assert lines[agent + 3].split()[0] == "error"
    assert "connection refused" in " ".join(lines[agent + 3 :])
    assert any(line.split()[:1] == ["fix"] for line in lines[agent:])


ENTRY = {
    "key": "job",
    "value": "Baker in Lyon, " * 8,
    "token_count": 33,
    "created_at": "2026-12-01T08:00:00Z",
    "updated_at": "2026-12-05T04:15:09Z",
    "source": "agent",
}


def test_the_short_views_of_the_other_commands() -> None:
    entry = [line.rstrip() for line in render(views.memory_entry, ENTRY).splitlines()]
    assert entry[0] == "key      job"
    assert entry[1].startswith("value    Baker in Lyon, Baker") and entry[2].startswith(" " * 9)
    assert " ".join(line.strip() for line in entry[1:3]) == "value    " + ENTRY["value"].strip()
    assert entry[3:] == [
        "tokens   33",
        "source   agent",
        "created  2026-12-01 08:00",
        "updated  2026-12-05 04:15",
    ]
    limited = {"memory": {**ENTRY, "token_count": 1}, "total_tokens": 5, "token_limit": 200}
    assert (
        render(views.written, limited) == "saved job (1 token) · memory: 5 of 200 tokens (2.5 %)\n"
    )
    gone = {"memory": None, "total_tokens": 0, "token_limit": None}
    assert render(views.written, gone) == "deleted · memory: 0 tokens (no limit)\n"
    assert render(views.cleared, {"deleted": 1}) == "deleted 1 memory\n"
    counts = {"imported": 3, "deleted": 1, "total_tokens": 40, "token_limit": None}
    assert (
        render(views.imported, counts) == "imported 3, deleted 1 · memory: 40 tokens (no limit)\n"
    )
    erased = {"deleted": {"memories": 2, "changes": 5, "agent_runs": 0}}
    assert render(views.erased, erased) == "erased: 2 memories, 5 changes, 0 agent runs\n"
    key = {
        "id": "k1",
        "user_id": "alice",
        "prefix": "kvm_ab12",
        "created_at": "2026-12-05T04:15:09Z",
        "revoked_at": None,
    }
    keys = [line.split() for line in render(views.keys, {"keys": [key]}).splitlines()]
    assert keys[0] == ["ID", "USER", "PREFIX", "CREATED", "REVOKED"]
    assert keys[2] == ["k1", "alice", "kvm_ab12", "2026-12-05", "04:15", "-"]
    used = {"agent_runs": 1, "input_tokens": 10, "output_tokens": 2, "cost_usd": None, "writes": 0}
    per_user = {"users": [{"user": "alice", **used}], "totals": used}
    rows = [line.split() for line in render(views.users_usage, per_user).splitlines()]
    assert rows[0][0] == "USER" and rows[2] == ["alice", "1", "10", "2", "-", "0"]
    assert rows[-1] == ["total", "1", "10", "2", "-", "0"]
