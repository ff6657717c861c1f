"""Scopes (CONTRACT section 23) under a reviewer's probes. Each test failed on the code as
merged (main at 28ba2f9). On SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.support.apps import MAIN_MODEL

MakeClient = Callable[..., TestClient]
SERVICE_KEY = "svc-scopes-review-41c2"
KEYS_AUTH = {"mode": "keys", "service_keys": [SERVICE_KEY]}
OWN_KEYS = ["name", "city"]
SCOPED_KEYS = ["notes", "decisions"]
MEMORY = {"validKeys": OWN_KEYS, "scopes": {"validKeys": SCOPED_KEYS}}
ALICE = {"Authorization": f"Bearer {SERVICE_KEY}", "X-User-Id": "alice"}


def bad_request(message: str) -> dict[str, Any]:
    return {"error": {"code": "bad_request", "message": message}}


@pytest.fixture
def client(make_client: MakeClient) -> TestClient:
    """A server keeping scopes, its users named by a service key."""
    return make_client(auth=KEYS_AUTH, memory=MEMORY)


def layers(client: TestClient) -> dict[str | None, dict[str, str]]:
    """Every layer of alice's memory as {key: value}, by scope (None: her own)."""
    document = client.get("/memory/export", headers=ALICE).json()
    found: dict[str | None, dict[str, str]] = {}
    for memory in document["memories"]:
        found.setdefault(memory["scope"], {})[memory["key"]] = memory["value"]
    return found


# --- a scope named twice --------------------------------------------------------------------


TWO_SCOPES = bad_request("scope is given more than once, naming different scopes: name one")


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("PUT", "/memory/notes", {"value": "oak"}),
        ("GET", "/memory", None),
        ("DELETE", "/memory", None),
        ("GET", "/memory/history", None),
        ("GET", "/memory/export", None),
        ("POST", "/memory/import", {"memories": [{"key": "notes", "value": "oak"}]}),
        ("GET", "/memory/proposals", None),
    ],
)
def test_a_query_naming_two_scopes_is_400_and_changes_nothing(
    client: TestClient, method: str, path: str, body: Any
) -> None:
    """`?scope=a&scope=b` named the last one (Starlette's `get`): a proxy or a check in front
    of kvmem that reads the first would act on another scope than kvmem does."""
    client.put("/memory/notes?scope=kitchen", json={"value": "walnut"}, headers=ALICE)
    before = layers(client)
    response = client.request(
        method, f"{path}?scope=kitchen&scope=thesis", json=body, headers=ALICE
    )
    assert (response.status_code, response.json()) == (400, TWO_SCOPES)
    assert layers(client) == before
    # The same name twice is one scope, and a lone ?scope is as it was.
    again = client.get("/memory?scope=kitchen&scope=kitchen", headers=ALICE)
    assert again.status_code == 200 and again.json()["scope"] == "kitchen"


TWO_HEADERS = bad_request(
    "X-Memory-Scope is given more than once, naming different scopes: name one"
)


def scope_headers(*scopes: str) -> list[tuple[str, str]]:
    return [*ALICE.items(), *(("X-Memory-Scope", scope) for scope in scopes)]


def test_two_different_x_memory_scope_headers_are_400_on_the_hooks_and_mcp(
    client: TestClient,
) -> None:
    """Starlette's `headers.get` took the first of two X-Memory-Scope headers: a front end's
    header and a proxy's appended one would have the turn read and write a scope nobody
    meant."""
    client.put("/memory/notes?scope=kitchen", json={"value": "walnut"}, headers=ALICE)
    both = scope_headers("kitchen", "thesis")
    context = client.post("/memory/context", json={}, headers=both)
    assert (context.status_code, context.json()) == (400, TWO_HEADERS)
    agent = client.post(
        "/memory/agent", json={"messages": [{"role": "user", "content": "hi"}]}, headers=both
    )
    assert (agent.status_code, agent.json()) == (400, TWO_HEADERS)
    mcp = client.post(
        "/mcp",
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}},
        headers=[*both, ("Accept", "application/json, text/event-stream")],
    )
    assert (mcp.status_code, mcp.json()) == (400, TWO_HEADERS)

    # The same scope twice is that scope; an empty one beside it names nothing more.
    for headers in (scope_headers("kitchen", "kitchen"), scope_headers("kitchen", "")):
        given = client.post("/memory/context", json={}, headers=headers)
        assert given.status_code == 200, given.text
        assert '<scope_memory scope="kitchen">' in given.json()["block"]


def test_two_different_x_memory_scope_headers_are_400_on_v1_and_chat(
    upstream: Any, chat_sections: Callable[..., dict[str, Any]], make_client: MakeClient
) -> None:
    client = make_client(**chat_sections(memory={"agent": None, **MEMORY}))
    both = [("X-Memory-Scope", "kitchen"), ("X-Memory-Scope", "thesis")]
    completion = {"model": f"openai/{MAIN_MODEL}", "messages": [{"role": "user", "content": "hi"}]}
    v1 = client.post("/v1/chat/completions", json=completion, headers=both)
    assert (v1.status_code, v1.json()["error"]["message"]) == (
        400,
        TWO_HEADERS["error"]["message"],
    )
    chat = client.post("/chat", json={"message": "hi"}, headers=both)
    assert (chat.status_code, chat.json()) == (400, TWO_HEADERS)
    assert upstream.received(MAIN_MODEL) == []
