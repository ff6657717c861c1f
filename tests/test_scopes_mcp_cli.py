"""Scopes (CONTRACT section 23) in the MCP tools and the `kvmem memory` commands: a `scope`
argument or `X-Memory-Scope` on `/mcp` (`kvmem mcp --scope` on stdio), `--scope` on the CLI,
`kvmem memory scopes`, and `kvmem check` refusing a key in both `validKeys` lists.

The MCP tools are driven in process by JSON-RPC posts to `/mcp` (the transport is the SDK's,
proven with its client in test_mcp.py), plus one `kvmem mcp --scope` with the SDK's client;
the commands through click's runner (`tests.support.cli`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from starlette.testclient import TestClient

from kvmem.memory.proposals import ProposalStore
from kvmem.memory.store import MemoryStore
from tests.support.matchers import entry

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
    assert [list(tool["inputSchema"]["properties"])[-1] for tool in tools] == ["scope"] * 8
    assert all(
        tool["inputSchema"]["properties"]["scope"] == {"type": "string", "description": description}
        for tool in tools
    )
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
