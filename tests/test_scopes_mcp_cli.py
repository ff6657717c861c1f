"""Scopes (CONTRACT section 23) in the MCP tools and the `kvmem memory` commands: a `scope`
argument or `X-Memory-Scope` on `/mcp` (`kvmem mcp --scope` on stdio), `--scope` on the CLI,
`kvmem memory scopes`, and `kvmem check` refusing a key in both `validKeys` lists.

The MCP tools are driven in process by JSON-RPC posts to `/mcp` (the transport is the SDK's,
proven with its client in test_mcp.py), plus one `kvmem mcp --scope` with the SDK's client;
the commands through click's runner (`tests.support.cli`).
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from rich.console import Console
from starlette.testclient import TestClient

from kvmem.cli import views
from kvmem.config_loader import load_config
from kvmem.db.engine import Database
from kvmem.db.migrate import ensure_current
from kvmem.memory.proposals import ProposalStore
from kvmem.memory.rules import MemoryRules
from kvmem.memory.store import MemoryStore
from kvmem.tokens import TokenCounter
from tests.support.cli import invoke
from tests.support.matchers import entry
from tests.support.mcp_stdio import stdio_session
from tests.support.processes import Result, run, run_in_terminal

OWN_KEYS = ["city", "drink"]
SCOPED_KEYS = ["notes", "decisions"]
MEMORY = {
    "validKeys": OWN_KEYS,
    "tokenLimit": 20,
    "charLimit": 40,
    "scopes": {"validKeys": SCOPED_KEYS, "tokenLimit": 10, "charLimit": 30},
}
JSONRPC_HEADERS = {
    "Accept": "application/json, text/event-stream",
    "Content-Type": "application/json",
}
NO_SCOPES = "this server keeps no scopes (memory.scopes is not configured); send no scope"
INVALID_SCOPE = "invalid scope: a scope is 1-128 characters of A-Z, a-z, 0-9 and . _ : @ / -"


# --- MCP ---------------------------------------------------------------------------------


def post(client: TestClient, method: str, params: dict[str, Any], **headers: str) -> Any:
    """One JSON-RPC request to `/mcp`: its HTTP status and body."""
    message = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    response = client.post("/mcp", json=message, headers={**JSONRPC_HEADERS, **headers})
    return response.status_code, response.json()


def call(client: TestClient, tool: str, arguments: dict[str, Any], **headers: str) -> Any:
    """A tool's result (`isError`, its text, its structured content)."""
    status, body = post(client, "tools/call", {"name": tool, "arguments": arguments}, **headers)
    assert status == 200, body
    result = body["result"]
    [content] = result["content"]
    return result.get("isError", False), content["text"], result.get("structuredContent")


def error(text: str) -> tuple[bool, str, None]:
    return True, text, None


@pytest.fixture
def mcp(make_client: Callable[..., TestClient]) -> TestClient:
    """A started app (auth local: user `local`) whose memory keeps scopes."""
    return make_client(memory=MEMORY)


@pytest.fixture
def store(make_store: Callable[..., MemoryStore]) -> MemoryStore:
    """The same database and rules, to set up and to check."""
    return make_store(**MEMORY)


def layers(store: MemoryStore, user: str = "local") -> dict[str, list[tuple[str, str]]]:
    """Every layer's entries as (key, value), by scope ("" the person's own)."""
    found: dict[str, list[tuple[str, str]]] = {}
    for e in store.every_layer(user).entries:
        found.setdefault(e.scope, []).append((e.key, e.value))
    return found


def test_every_tool_shows_the_scope_argument_last(mcp: TestClient) -> None:
    status, body = post(mcp, "tools/list", {})
    assert status == 200
    tools = body["result"]["tools"]
    description = (
        "The scope to act on: an assistant, a model or a project whose memory is kept apart "
        "from the person's own (1-128 characters of A-Z, a-z, 0-9 and . _ : @ / -). Leave it "
        "out for the session's scope (X-Memory-Scope), or else the person's own memory. "
        "The keys notes, decisions are kept per scope: name one for them."
    )
    names = [tool["name"] for tool in tools]
    assert names == [
        "memory_list",
        "memory_scopes",
        "memory_get",
        "memory_set",
        "memory_delete",
        "memory_history",
        "memory_proposals",
        "memory_proposal_accept",
        "memory_proposal_reject",
    ]
    layered = [tool for tool in tools if tool["name"] != "memory_scopes"]
    assert [list(tool["inputSchema"]["properties"])[-1] for tool in layered] == ["scope"] * 8
    assert all(
        tool["inputSchema"]["properties"]["scope"] == {"type": "string", "description": description}
        for tool in layered
    )
    assert tools[1]["inputSchema"] == {
        "type": "object",
        "properties": {},
        "additionalProperties": False,
    }
    assert tools[1]["annotations"]["readOnlyHint"] is True
    # The key may be the person's own or a scoped one.
    [memory_set] = [tool for tool in tools if tool["name"] == "memory_set"]
    assert memory_set["inputSchema"]["properties"]["key"]["description"].endswith(
        "Must be one of: city, drink, notes, decisions."
    )


def test_a_set_with_a_scope_lands_in_the_scope_only(mcp: TestClient, store: MemoryStore) -> None:
    written = call(mcp, "memory_set", {"key": "notes", "value": "Use Rust", "scope": "proj"})
    stored = store.get("local", "notes", scope="proj").as_json()
    assert stored == entry("notes", "Use Rust", 2, "mcp")
    assert written == (
        False,
        "Memory set for key \"notes\" (2 tokens) in scope 'proj'",
        {"memory": stored, "total_tokens": 2, "token_limit": 10, "scope": "proj"},
    )
    assert layers(store) == {"proj": [("notes", "Use Rust")]}
    assert store.snapshot("local").entries == ()  # the person's own: nothing
    assert call(mcp, "memory_get", {"key": "notes"}) == error('No memory with key "notes".')
    assert call(mcp, "memory_get", {"key": "notes", "scope": "proj"}) == (
        False,
        json.dumps({**stored, "scope": "proj"}),
        {**stored, "scope": "proj"},
    )
    assert call(mcp, "memory_get", {"key": "notes", "scope": "other"}) == error(
        'No memory with key "notes".'
    )


def test_a_list_with_a_scope_shows_that_scope_only(mcp: TestClient, store: MemoryStore) -> None:
    store.set("local", "city", "Lyon")
    store.set("local", "notes", "Use Rust", scope="proj")
    store.set("local", "notes", "Buy tiles", scope="kitchen")
    store.set("bob", "notes", "bob's", scope="proj")
    proj = store.get("local", "notes", scope="proj").as_json()

    assert call(mcp, "memory_list", {"scope": "proj"})[2] == {
        "memories": [proj],
        "total_tokens": 2,
        "token_limit": 10,
        "char_limit": 30,
        "usage_percentage": 20.0,
        "valid_keys": SCOPED_KEYS,
        "enabled": True,
        "scope": "proj",
    }
    own = call(mcp, "memory_list", {})[2]
    assert [(m["key"], m["value"]) for m in own["memories"]] == [("city", "Lyon")]
    assert (own["token_limit"], own["valid_keys"], "scope" in own) == (20, OWN_KEYS, False)
    empty = call(mcp, "memory_list", {"scope": "nothing-here"})[2]
    assert (empty["memories"], empty["total_tokens"]) == ([], 0)


def test_memory_scopes_lists_the_users_scopes(mcp: TestClient, store: MemoryStore) -> None:
    store.set("local", "city", "Lyon")
    store.set("local", "notes", "Use Rust", scope="proj")
    store.set("local", "decisions", "Go", scope="proj")
    store.set("local", "notes", "Buy tiles", scope="kitchen")
    store.set("bob", "notes", "bob's", scope="bobs-only")
    listed = {
        "scopes": [
            {"scope": "kitchen", "entries": 1, "total_tokens": 2},
            {"scope": "proj", "entries": 2, "total_tokens": 3},
        ]
    }
    assert call(mcp, "memory_scopes", {}) == (False, json.dumps(listed), listed)
    # A scoped session sees them all the same (it is how a client finds the others).
    assert call(mcp, "memory_scopes", {}, **{"X-Memory-Scope": "proj"})[2] == listed
    assert call(mcp, "memory_scopes", {"scope": "proj"}) == error(
        "Error: invalid arguments for memory_scopes: scope: Extra inputs are not permitted."
    )


def test_the_header_names_the_default_scope(mcp: TestClient, store: MemoryStore) -> None:
    header = {"X-Memory-Scope": "proj"}
    written = call(mcp, "memory_set", {"key": "notes", "value": "Use Rust"}, **header)
    assert (written[0], written[2]["scope"]) == (False, "proj")
    same = call(mcp, "memory_set", {"key": "decisions", "value": "Go", "scope": "proj"}, **header)
    assert same[0] is False
    listed = call(mcp, "memory_list", {}, **header)[2]
    assert [m["key"] for m in listed["memories"]] == ["decisions", "notes"]
    assert listed["scope"] == "proj"

    other = call(mcp, "memory_set", {"key": "notes", "value": "x", "scope": "kitchen"}, **header)
    assert other == error(
        "Error: the scope argument names 'kitchen' but this session's scope is 'proj' "
        "(X-Memory-Scope, or kvmem mcp --scope): leave the argument out, or name the same"
    )
    deleted = call(mcp, "memory_delete", {"key": "notes"}, **header)
    assert (deleted[1], deleted[2]) == (
        "Memory deleted for key \"notes\" in scope 'proj'",
        {"deleted": entry("notes", "Use Rust", 2, "mcp"), "scope": "proj"},
    )
    assert layers(store) == {"proj": [("decisions", "Go")]}
    history = call(mcp, "memory_history", {}, **header)[2]
    assert [(c["key"], c["op"]) for c in history["changes"]] == [
        ("notes", "delete"),
        ("decisions", "set"),
        ("notes", "set"),
    ]
    assert history["scope"] == "proj"
    assert call(mcp, "memory_history", {})[2]["changes"] == []  # the own layer's: none
    # An empty header names no scope, as on the chat routes: the own layer.
    assert call(mcp, "memory_list", {}, **{"X-Memory-Scope": " "})[2]["memories"] == []


def test_a_scoped_session_reaches_the_persons_own_keys_as_a_scoped_chat_does(
    mcp: TestClient, store: MemoryStore, make_client: Callable[..., TestClient]
) -> None:
    """A key belongs to one layer: in a session scoped "proj" the person's own `city` is
    theirs (set, get, delete reach the own layer), while `notes` goes to the scope; with
    isolated scopes the own key is refused, as in an isolated chat."""
    header = {"X-Memory-Scope": "proj"}
    written = call(mcp, "memory_set", {"key": "city", "value": "Oslo"}, **header)
    assert written[0] is False and "scope" not in written[2]
    assert call(mcp, "memory_set", {"key": "notes", "value": "Rust"}, **header)[2]["scope"] == (
        "proj"
    )
    assert layers(store) == {"": [("city", "Oslo")], "proj": [("notes", "Rust")]}
    assert call(mcp, "memory_get", {"key": "city"}, **header)[2]["value"] == "Oslo"
    assert call(mcp, "memory_delete", {"key": "city"}, **header)[0] is False
    assert layers(store) == {"proj": [("notes", "Rust")]}

    isolated = make_client(memory={**MEMORY, "scopes": {**MEMORY["scopes"], "isolated": True}})
    refused = call(isolated, "memory_set", {"key": "city", "value": "Oslo"}, **header)
    assert refused[0] is True and "Invalid key" in refused[1]
    assert layers(store) == {"proj": [("notes", "Rust")]}


def test_a_bad_scope_is_an_error_and_writes_nothing(
    mcp: TestClient, make_client: Callable[..., TestClient], store: MemoryStore
) -> None:
    for scope in ("", "two words", "x" * 129, "é"):
        refused = call(mcp, "memory_set", {"key": "notes", "value": "v", "scope": scope})
        assert refused == error(f"Error: {INVALID_SCOPE}")
    assert call(mcp, "memory_list", {"scope": 7}) == error(
        "Error: invalid arguments for memory_list: scope: Input should be a valid string."
    )
    status, body = post(
        mcp,
        "tools/call",
        {"name": "memory_list", "arguments": {}},
        **{"X-Memory-Scope": "two words"},
    )
    assert (status, body) == (400, {"error": {"code": "bad_request", "message": INVALID_SCOPE}})

    # A server without memory.scopes: naming a scope is an error; the schema offers none.
    plain = make_client(memory={"validKeys": OWN_KEYS})
    refused = call(plain, "memory_set", {"key": "city", "value": "Lyon", "scope": "proj"})
    assert refused == error(f"Error: {NO_SCOPES}")
    status, body = post(
        plain, "tools/call", {"name": "memory_list", "arguments": {}}, **{"X-Memory-Scope": "p"}
    )
    assert (status, body) == (400, {"error": {"code": "bad_request", "message": NO_SCOPES}})
    tools = post(plain, "tools/list", {})[1]["result"]["tools"]
    assert [t for t in tools if "scope" in t["inputSchema"]["properties"]] == []
    assert "memory_scopes" not in [t["name"] for t in tools]
    assert layers(store) == {}
    assert store.history("local").changes == ()


def test_each_key_is_written_in_its_own_layer(mcp: TestClient, store: MemoryStore) -> None:
    assert call(mcp, "memory_set", {"key": "notes", "value": "v"}) == error(
        "Error: key 'notes' is kept per scope: name the scope to write it "
        "(scoped keys: notes, decisions)"
    )
    assert call(mcp, "memory_set", {"key": "city", "value": "Lyon", "scope": "proj"}) == error(
        'Invalid key "city". Must be one of: notes, decisions'
    )
    too_long = call(mcp, "memory_set", {"key": "notes", "value": "x" * 31, "scope": "proj"})
    assert too_long == error(
        'Value for key "notes" is too long (31 characters; the limit is 30). Shorten it.'
    )
    assert layers(store) == {}


def test_the_proposal_tools_act_on_one_scope(mcp: TestClient, store: MemoryStore) -> None:
    proposals = ProposalStore(store)
    mine = proposals.propose("local", "notes", "Use Rust", scope="proj")
    proposals.propose("local", "notes", "Buy tiles", scope="kitchen")
    proposals.propose("local", "city", "Lyon")

    listed = call(mcp, "memory_proposals", {"scope": "proj"})[2]
    assert listed == {"proposals": [mine.as_json()], "scope": "proj"}
    assert [p["key"] for p in call(mcp, "memory_proposals", {})[2]["proposals"]] == ["city"]
    assert call(mcp, "memory_proposal_accept", {"id": mine.id}) == error(
        f"No pending proposal with id {mine.id}."
    )
    kept = call(mcp, "memory_proposal_accept", {"id": mine.id, "scope": "proj"})
    assert kept[2] == {
        "memory": entry("notes", "Use Rust", 2, "agent"),
        "total_tokens": 2,
        "token_limit": 10,
        "scope": "proj",
    }
    rejected = call(mcp, "memory_proposal_reject", {"id": mine.id + 1, "scope": "kitchen"})
    assert rejected[:2] == (False, f"Proposal {mine.id + 1} dismissed")
    assert layers(store) == {"proj": [("notes", "Use Rust")]}
    assert [p.key for p in proposals.pending("local")] == ["city"]


# --- `kvmem mcp --scope` (stdio, the SDK's client) ----------------------------------------


@pytest.mark.slow
def test_kvmem_mcp_with_a_scope_acts_on_it(
    tmp_path: Path, database_url: str, database: Database, store: MemoryStore
) -> None:
    config = tmp_path / "memory.yaml"
    config.write_text(json.dumps({"database": {"url": database_url}, "memory": MEMORY}))

    async def work() -> None:
        async with stdio_session(config, "--user", "alice", "--scope", "proj") as session:
            instructions = session.initialize_result.instructions
            assert instructions.endswith("each tool's scope argument names the one to act on.")
            written = await session.call_tool("memory_set", {"key": "notes", "value": "Use Rust"})
            assert (written.is_error, written.structured_content["scope"]) == (False, "proj")
            other = await session.call_tool("memory_list", {"scope": "kitchen"})
            assert other.is_error
            listed = await session.call_tool("memory_list", {})
            assert [m["key"] for m in listed.structured_content["memories"]] == ["notes"]

    anyio.run(work)
    assert layers(store, "alice") == {"proj": [("notes", "Use Rust")]}
    refused = run(["mcp", "--config", str(config), "--scope", "a b"], cwd=tmp_path)
    assert (refused.code, refused.stdout, refused.stderr) == (
        2,
        "",
        f"kvmem: --scope 'a b': {INVALID_SCOPE}\n",
    )


# --- the CLI ---------------------------------------------------------------------------------

SCOPED_CONFIG = (
    "database: {url: 'sqlite:///kv.db'}\n"
    "memory:\n"
    "  validKeys: [city, drink]\n"
    "  tokenLimit: 20\n"
    "  charLimit: 40\n"
    "  scopes: {validKeys: [notes, decisions], tokenLimit: 10, charLimit: 30}\n"
)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """The folder the commands run in: memory.yaml keeps scopes, plain.yaml does not."""
    (tmp_path / "memory.yaml").write_text(SCOPED_CONFIG, encoding="utf-8")
    (tmp_path / "plain.yaml").write_text(
        "database: {url: 'sqlite:///kv.db'}\nmemory: {validKeys: [city, drink]}\n",
        encoding="utf-8",
    )
    return tmp_path


@pytest.fixture
def kvmem(folder: Path) -> Callable[..., Result]:
    """`kvmem memory ARGS... --config memory.yaml`."""

    def call(*args: str, config: str = "memory.yaml") -> Result:
        return invoke(["memory", *args, "--config", config], cwd=folder)

    return call


@pytest.fixture
def cli_store(folder: Path, tokens: TokenCounter) -> Iterator[MemoryStore]:
    """The commands' database and rules in this process: to set up and to check."""
    config = load_config(folder / "memory.yaml", environ={}).config
    database = Database.from_config(config.database)
    ensure_current(database.engine)
    yield MemoryStore(database, MemoryRules.from_config(config.memory), tokens)
    database.dispose()


def test_cli_scope_set_list_get_delete(kvmem: Callable[..., Result], cli_store: MemoryStore):
    written = kvmem("set", "notes", "Use Rust", "--scope", "proj")
    assert (written.code, written.stderr, written.json()) == (
        0,
        "",
        {
            "memory": entry("notes", "Use Rust", 2),
            "total_tokens": 2,
            "token_limit": 10,
            "scope": "proj",
        },
    )
    assert kvmem("set", "notes", "Buy tiles", "--scope", "kitchen").code == 0
    assert kvmem("set", "city", "Lyon").code == 0
    assert layers(cli_store) == {
        "": [("city", "Lyon")],
        "kitchen": [("notes", "Buy tiles")],
        "proj": [("notes", "Use Rust")],
    }

    listed = kvmem("list", "--scope", "proj")
    assert (listed.code, listed.json()) == (
        0,
        {
            "memories": [entry("notes", "Use Rust", 2)],
            "total_tokens": 2,
            "token_limit": 10,
            "char_limit": 30,
            "usage_percentage": 20.0,
            "valid_keys": SCOPED_KEYS,
            "enabled": True,
            "scope": "proj",
        },
    )
    own = kvmem("list").json()
    assert ([m["key"] for m in own["memories"]], own["token_limit"], "scope" in own) == (
        ["city"],
        20,
        False,
    )
    got = kvmem("get", "notes", "--scope", "kitchen")
    assert got.json() == {**entry("notes", "Buy tiles", 2), "scope": "kitchen"}
    missing = kvmem("get", "notes")
    assert (missing.code, missing.stderr) == (1, "kvmem: not_found: no memory with key 'notes'\n")

    deleted = kvmem("delete", "notes", "--scope", "proj")
    assert (deleted.code, deleted.stdout) == (0, "deleted notes in scope proj\n")
    assert layers(cli_store) == {"": [("city", "Lyon")], "kitchen": [("notes", "Buy tiles")]}
    history = kvmem("history", "--scope", "proj").json()
    assert ([(c["key"], c["op"]) for c in history["changes"]], history["scope"]) == (
        [("notes", "delete"), ("notes", "set")],
        "proj",
    )
    set_id = history["changes"][1]["id"]
    reverted = kvmem("revert", "notes", str(set_id), "--scope", "proj")
    assert (reverted.code, reverted.json()["scope"], reverted.json()["token_limit"]) == (
        0,
        "proj",
        10,
    )
    cleared = kvmem("clear", "--scope", "kitchen")
    assert (cleared.code, cleared.json()) == (0, {"deleted": 1, "scope": "kitchen"})
    assert layers(cli_store) == {"": [("city", "Lyon")], "proj": [("notes", "Use Rust")]}


def test_cli_scope_export_import_round_trip(
    kvmem: Callable[..., Result], cli_store: MemoryStore, folder: Path
):
    cli_store.set("local", "city", "Lyon")
    cli_store.set("local", "notes", "Use Rust", scope="proj")
    cli_store.set("local", "decisions", "Go", scope="proj")
    cli_store.set("local", "notes", "Buy tiles", scope="kitchen")

    everything = kvmem("export", "all.json")
    assert (everything.code, everything.stdout, everything.stderr) == (0, "", "")
    document = json.loads((folder / "all.json").read_text(encoding="utf-8"))
    assert [(m["scope"], m["key"], m["value"]) for m in document["memories"]] == [
        (None, "city", "Lyon"),
        ("kitchen", "notes", "Buy tiles"),
        ("proj", "notes", "Use Rust"),
        ("proj", "decisions", "Go"),
    ]
    one = kvmem("export", "--scope", "proj")
    assert [(m["scope"], m["key"]) for m in one.json()["memories"]] == [
        ("proj", "notes"),
        ("proj", "decisions"),
    ]

    # Into a fresh user: every layer back where it was, in one transaction.
    restored = invoke(
        ["memory", "import", "all.json", "--user", "bob", "--config", "memory.yaml"], cwd=folder
    )
    assert (restored.code, restored.json()) == (
        0,
        {
            "imported": 1,
            "deleted": 0,
            "total_tokens": 2,
            "token_limit": 20,
            "scopes": [
                {
                    "scope": "kitchen",
                    "imported": 1,
                    "deleted": 0,
                    "total_tokens": 2,
                    "token_limit": 10,
                },
                {
                    "scope": "proj",
                    "imported": 2,
                    "deleted": 0,
                    "total_tokens": 3,
                    "token_limit": 10,
                },
            ],
        },
    )
    assert layers(cli_store, "bob") == layers(cli_store)

    # One scope's export into another scope: with --scope every entry must be of that scope.
    (folder / "proj.json").write_text(one.stdout, encoding="utf-8")
    elsewhere = kvmem("import", "proj.json", "--scope", "kitchen")
    assert (elsewhere.code, elsewhere.stderr) == (
        2,
        "kvmem: memories[0] belongs to scope 'proj', not to 'kitchen', the scope this import "
        "names\n",
    )
    bare = {"memories": [{"key": "decisions", "value": "Tile the floor"}]}
    (folder / "bare.json").write_text(json.dumps(bare), encoding="utf-8")
    replaced = kvmem("import", "bare.json", "--scope", "kitchen", "--replace")
    assert (replaced.code, replaced.json()) == (
        0,
        {"imported": 1, "deleted": 1, "total_tokens": 3, "token_limit": 10, "scope": "kitchen"},
    )
    assert layers(cli_store)["kitchen"] == [("decisions", "Tile the floor")]
    assert layers(cli_store)["proj"] == [("notes", "Use Rust"), ("decisions", "Go")]


def test_cli_a_bad_scope_is_a_usage_error(kvmem: Callable[..., Result], folder: Path):
    commands = [
        ("set", "notes", "v", "--scope", "a b"),
        ("list", "--scope", ""),
        ("export", "--scope", "x" * 129),
        ("import", "all.json", "--scope", "é"),
        ("proposals", "--scope", "a?b"),
    ]
    results = [kvmem(*args) for args in commands]
    names = ["a b", "", "x" * 129, "é", "a?b"]
    assert [(r.code, r.stdout, r.stderr) for r in results] == [
        (2, "", f"kvmem: --scope {name!r}: {INVALID_SCOPE}\n") for name in names
    ]
    plain = kvmem("set", "city", "Lyon", "--scope", "proj", config="plain.yaml")
    assert (plain.code, plain.stdout, plain.stderr) == (
        2,
        "",
        f"kvmem: --scope proj: {folder / 'plain.yaml'} keeps no scopes (memory.scopes is not "
        "configured); leave out --scope for the person's own memory\n",
    )
    # A scoped key without a scope, an own key in a scope: refused as the REST API does.
    assert kvmem("set", "notes", "v").stderr == (
        "kvmem: key_not_allowed: key 'notes' is kept per scope: name the scope to write it "
        "(scoped keys: notes, decisions)\n"
    )
    assert kvmem("set", "city", "Lyon", "--scope", "proj").stderr == (
        "kvmem: key_not_allowed: key 'city' is not allowed; valid keys: notes, decisions\n"
    )
    assert kvmem("scopes").json() == {"scopes": []}  # nothing was written


def test_cli_memory_scopes(kvmem: Callable[..., Result], cli_store: MemoryStore):
    cli_store.set("alice", "city", "Lyon")
    cli_store.set("alice", "notes", "Use Rust", scope="proj")
    cli_store.set("alice", "decisions", "Go", scope="proj")
    cli_store.set("alice", "notes", "Buy tiles", scope="kitchen")
    cli_store.set("bob", "notes", "bob's", scope="bobs-only")
    listed = kvmem("scopes", "--user", "alice")
    assert (listed.code, listed.stderr, listed.json()) == (
        0,
        "",
        {
            "scopes": [
                {"scope": "kitchen", "entries": 1, "total_tokens": 2},
                {"scope": "proj", "entries": 2, "total_tokens": 3},
            ]
        },
    )
    assert kvmem("scopes", "--json").json() == {"scopes": []}  # local has none
    assert [line.split() for line in render(views.scopes, listed.json()).splitlines()] == [
        ["SCOPE", "ENTRIES", "TOKENS"],
        ["─" * len(render(views.scopes, listed.json()).splitlines()[1].strip())],
        ["kitchen", "1", "2"],
        ["proj", "2", "3"],
        ["see", "one:", "kvmem", "memory", "list", "--scope", "NAME"],
    ]
    assert render(views.scopes, {"scopes": []}) == "No scopes hold memory for this user.\n"


def test_cli_memory_scopes_on_a_terminal(folder: Path, cli_store: MemoryStore) -> None:
    cli_store.set("local", "notes", "Use Rust", scope="proj")
    shown = run_in_terminal(["memory", "scopes"], cwd=folder, env={"NO_COLOR": "1"})
    assert (shown.code, shown.stderr) == (0, "")
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).split() for line in shown.stdout.splitlines()]
    assert (lines[0], lines[2], len(lines)) == (
        ["SCOPE", "ENTRIES", "TOKENS"],
        ["proj", "1", "2"],
        4,
    )
    as_json = run_in_terminal(["memory", "scopes", "--json"], cwd=folder)
    assert json.loads(as_json.stdout) == {
        "scopes": [{"scope": "proj", "entries": 1, "total_tokens": 2}]
    }


def test_cli_proposals_with_a_scope(kvmem: Callable[..., Result], cli_store: MemoryStore):
    proposals = ProposalStore(cli_store)
    mine = proposals.propose("local", "notes", "Use Rust", scope="proj")
    other = proposals.propose("local", "notes", "Buy tiles", scope="kitchen")
    proposals.propose("local", "city", "Lyon")
    listed = kvmem("proposals", "--scope", "proj")
    assert listed.json() == {"proposals": [mine.as_json()], "scope": "proj"}
    assert kvmem("accept", str(mine.id)).stderr == (
        f"kvmem: not_found: no pending proposal {mine.id}\n"
    )
    kept = kvmem("accept", str(mine.id), "--scope", "proj")
    assert kept.json() == {
        "memory": entry("notes", "Use Rust", 2, "agent"),
        "total_tokens": 2,
        "token_limit": 10,
        "scope": "proj",
    }
    rejected = kvmem("reject", str(other.id), "--scope", "kitchen")
    assert (rejected.code, rejected.stdout) == (0, f"rejected {other.id}\n")
    assert [p.key for p in proposals.pending("local")] == ["city"]
    assert layers(cli_store) == {"proj": [("notes", "Use Rust")]}


def render(view: Callable[[Any, Console], None], value: Any) -> str:
    """`value` through `view` as an 80-column terminal shows it, without styles."""
    console = Console(file=io.StringIO(), width=80, force_terminal=True, record=True)
    view(value, console)
    return console.export_text()


def test_the_views_name_the_scope() -> None:
    written = {
        "memory": {**entry("notes", "Use Rust", 2), "created_at": "2026-12-05T04:15:09Z"},
        "total_tokens": 2,
        "token_limit": 10,
        "scope": "proj",
    }
    assert (
        render(views.written, written)
        == "saved notes (2 tokens) · scope proj: 2 of 10 tokens (20 %)\n"
    )
    assert (
        render(views.cleared, {"deleted": 2, "scope": "proj"})
        == "deleted 2 memories of scope proj\n"
    )
    imported = {
        "imported": 1,
        "deleted": 0,
        "total_tokens": 2,
        "token_limit": 20,
        "scopes": [
            {"scope": "proj", "imported": 2, "deleted": 1, "total_tokens": 3, "token_limit": 10}
        ],
    }
    assert render(views.imported, imported) == (
        "imported 1, deleted 0 · memory: 2 of 20 tokens (10 %)\n"
        "imported 2, deleted 1 · scope proj: 3 of 10 tokens (30 %)\n"
    )
    overview = {
        "memories": [],
        "total_tokens": 0,
        "token_limit": 10,
        "char_limit": 30,
        "usage_percentage": 0.0,
        "valid_keys": SCOPED_KEYS,
        "enabled": True,
        "scope": "proj",
    }
    assert render(views.memory_list, overview).splitlines()[0] == "scope proj"
    waiting = {"proposals": [], "scope": "proj"}
    assert render(views.proposals, waiting) == "scope proj\nNo proposals waiting for review.\n"


def test_help_says_what_the_scope_is(folder: Path) -> None:
    for command in (
        "list",
        "get",
        "set",
        "delete",
        "clear",
        "history",
        "revert",
        "export",
        "import",
        "proposals",
        "accept",
        "reject",
    ):
        shown = invoke(["memory", command, "--help"], cwd=folder)
        assert "--scope NAME" in shown.stdout, command
        assert "kept apart from the person's own" in " ".join(shown.stdout.split()), command
    assert "--scope NAME" in invoke(["mcp", "--help"], cwd=folder).stdout
    scopes = invoke(["memory", "scopes", "--help"], cwd=folder).stdout
    assert "scopes that hold memory" in scopes


def test_check_refuses_a_key_in_both_lists(tmp_path: Path) -> None:
    """Already refused by the config loader at 8419952; kept here so that `kvmem check`
    (which prints the effective settings) never accepts such a config."""
    (tmp_path / "both.yaml").write_text(
        "memory:\n  validKeys: [city, notes]\n  scopes: {validKeys: [notes, decisions]}\n",
        encoding="utf-8",
    )
    checked = invoke(["check", "--config", "both.yaml"], cwd=tmp_path)
    assert (checked.code, checked.stdout, checked.stderr) == (
        2,
        "",
        "kvmem: both.yaml: invalid config:\n"
        "  memory: Value error, notes: in both memory.validKeys and memory.scopes.validKeys; "
        "a key is either the person's own or kept per scope, never both\n",
    )


def test_the_block_resource_is_the_sessions_scoped_block(mcp: TestClient, store: MemoryStore):
    store.set("local", "city", "Lyon")
    store.set("local", "notes", "Use Rust", scope="proj")
    store.set("local", "notes", "Buy tiles", scope="kitchen")

    def block(**headers: str) -> str:
        status, body = post(mcp, "resources/read", {"uri": "memory://block"}, **headers)
        assert status == 200, body
        [contents] = body["result"]["contents"]
        return contents["text"]

    scoped, own = block(**{"X-Memory-Scope": "proj"}), block()
    assert ("Lyon" in scoped, "Use Rust" in scoped, "Buy tiles" in scoped) == (True, True, False)
    assert ("Lyon" in own, "Use Rust" in own, "Buy tiles" in own) == (True, False, False)
    assert "proj" in scoped
