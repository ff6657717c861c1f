"""Isolation: with two users (and a service key), no route, method or CLI command lets one of
them read, change, count or learn of the other's memory, conversations or preferences; and a
hypothesis fuzz run over the HTTP API finds no 500, no stray error shape and no cross-user read.

Long fuzz mode: KVMEM_FUZZ_EXAMPLES=5000 (default 200, derandomized; any explicit count
draws fresh random examples each run).
"""

from __future__ import annotations

import functools
import json
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from kvmem.db.engine import Database
from kvmem.server.credentials import KeyStore
from tests.support.apps import (
    AGENT_MODEL,
    MAIN_MODEL,
    set_memory,
    sse_events,
    wait_agents_idle,
)
from tests.support.cli import invoke_all
from tests.support.matchers import ISO_TIME
from tests.support.processes import Result
from tests.support.upstream import Reply

SERVICE_KEY = "svc-isolation-5b0c9e1d7a"
KEYS_AUTH = {"mode": "keys", "service_keys": [SERVICE_KEY]}
TOKEN_LIMIT = 100
# Upstream requests say whose they are: kvmem fills the placeholder with the request's user.
USER_HEADER = {"X-Kvmem-User": "{{KVMEM_USER_ID}}"}

# Marker strings that only alice's data holds (values, messages, replies).
ALICE_DIARY = "alice-diary-QX7V-zebra"
ALICE_HEALTH = "alice-health-JK2P-otter"
ALICE_SAYS = "alice-says-WM4R-heron"
ALICE_HEARS = "alice-hears-TB9L-lynx"
ALICE_PROPOSES = "alice-proposes-VC8N-ibis"
ALICE_MARKERS = (ALICE_DIARY, ALICE_HEALTH, ALICE_SAYS, ALICE_HEARS, ALICE_PROPOSES)
BOB_FACT = "bob-fact-HN3D-gecko"


def bearer(secret: str, **headers: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}", **headers}


def service(user: str) -> dict[str, str]:
    return bearer(SERVICE_KEY, **{"X-User-Id": user})


def raw(response: Any) -> tuple[int, list[tuple[str, str]], bytes]:
    """Everything a client sees of a response."""
    return response.status_code, sorted(response.headers.multi_items()), response.content


def without_echo(
    response: Any, echoed: str, stand_in: str
) -> tuple[int, list[tuple[str, str]], bytes]:
    """The response with the echoed id replaced (ids of equal length keep content-length)."""
    assert len(echoed) == len(stand_in)
    status, headers, content = raw(response)
    return status, headers, content.replace(echoed.encode(), stand_in.encode())


def not_found_key(key: str) -> dict[str, Any]:
    return {"error": {"code": "not_found", "message": f"no memory with key {key!r}"}}


def not_found_conversation(conversation_id: str) -> dict[str, Any]:
    return {
        "error": {"code": "not_found", "message": f"no conversation with id {conversation_id!r}"}
    }


def compact(body: Any) -> bytes:
    """A JSON body as kvmem sends it."""
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def listing(memories: list[dict[str, Any]], total: int) -> dict[str, Any]:
    return {
        "memories": memories,
        "total_tokens": total,
        "token_limit": TOKEN_LIMIT,
        "char_limit": 10000,
        "usage_percentage": round(100 * total / TOKEN_LIMIT, 1),
        "valid_keys": None,
        "enabled": True,
    }


@dataclass
class World:
    """Two users with keys; alice has memory, a conversation and memory turned off."""

    client: TestClient
    upstream: Any
    keys: KeyStore
    alice: dict[str, str]
    bob_key: str
    conversation: str
    proposal: int = 0  # alice's pending proposal
    alice_view: dict[str, Any] = field(default_factory=dict)

    def view_of_alice(self) -> dict[str, Any]:
        """Everything alice can read, byte for byte."""
        paths = [
            "/memory",
            "/memory/diary",
            "/memory/health",
            "/preferences",
            "/conversations",
            f"/conversations/{self.conversation}",
            "/memory/history",
            "/memory/diary/history",
            "/memory/proposals",
        ]
        return {path: raw(self.client.get(path, headers=self.alice)) for path in paths}


@pytest.fixture
def world(
    make_client: Callable[..., TestClient], chat_sections: Any, upstream: Any, database: Database
) -> World:
    client = make_client(
        **chat_sections(
            auth=KEYS_AUTH,
            memory={"tokenLimit": TOKEN_LIMIT},
            chat={"headers": USER_HEADER},
            agent={"headers": USER_HEADER},
        )
    )
    keys = KeyStore(database)
    _, alice_key = keys.create("alice")
    _, bob_key = keys.create("bob")
    alice = bearer(alice_key)
    assert (
        client.put("/memory/diary", json={"value": ALICE_DIARY}, headers=alice).status_code == 201
    )
    assert (
        client.put("/memory/health", json={"value": ALICE_HEALTH}, headers=alice).status_code == 201
    )
    upstream.script(MAIN_MODEL, Reply(content=ALICE_HEARS))
    chat = client.post("/chat", json={"message": ALICE_SAYS}, headers=alice)
    assert chat.status_code == 200, chat.text
    wait_agents_idle(client)
    assert client.patch("/preferences", json={"memories": False}, headers=alice).json() == {
        "memories": False,
        "review": False,
    }
    found = World(client, upstream, keys, alice, bob_key, chat.json()["conversation_id"])
    found.proposal = (
        client.app_state["services"]
        .proposals.propose("alice", "diary", ALICE_PROPOSES, conversation_id=found.conversation)
        .id
    )
    found.alice_view = found.view_of_alice()
    assert found.alice_view["/memory"][0] == 200
    return found


# Every way bob can identify himself, including ones that also name alice where she must be
# ignored (a forwarded front-end header next to a user key).
BOB_CREDENTIALS = {
    "user key": lambda w: bearer(w.bob_key),
    "user key naming himself": lambda w: bearer(w.bob_key, **{"X-User-Id": "bob"}),
    "user key, alice forwarded": lambda w: bearer(w.bob_key, **{"X-OpenWebUI-User-Id": "alice"}),
    "service key": lambda w: service("bob"),
    "service key, Open WebUI header": lambda w: bearer(
        SERVICE_KEY, **{"X-OpenWebUI-User-Id": "bob"}
    ),
}


def bob_session(world: World) -> dict[str, str]:
    """A session token minted with bob's key (CONTRACT section 14)."""
    made = world.client.post("/sessions", headers=bearer(world.bob_key))
    assert made.status_code == 201
    return bearer(made.json()["token"])


# A session token acts on the memory routes (not on the model routes, so not on /chat).
MEMORY_CREDENTIALS = {
    **BOB_CREDENTIALS,
    "session token": bob_session,
    "session token, alice forwarded": lambda w: {**bob_session(w), "X-OpenWebUI-User-Id": "alice"},
}


@pytest.mark.parametrize("how", list(MEMORY_CREDENTIALS))
def test_memory_routes_never_reach_the_other_user(world: World, how: str) -> None:
    client, bob = world.client, MEMORY_CREDENTIALS[how](world)

    # Reads: an empty memory, uncounted; alice's keys answer exactly like keys nobody has.
    empty = client.get("/memory", headers=bob)
    assert (empty.status_code, empty.json()) == (200, listing([], 0))
    for method in ("GET", "DELETE", "HEAD"):
        hers = client.request(method, "/memory/diary", headers=bob)
        nobodys = client.request(method, "/memory/dummy", headers=bob)
        assert without_echo(hers, "'diary'", "'dummy'") == raw(nobodys), method
        assert hers.status_code == 404
        if method != "HEAD":
            assert hers.json() == not_found_key("diary")
    assert client.get("/preferences", headers=bob).json() == {"memories": True, "review": False}

    # Writes land in bob's memory: the same key is new for him (201, not 200), and the whole
    # token limit is his, whatever alice stores.
    value = " ".join(["hello"] * TOKEN_LIMIT)
    put = client.put("/memory/diary", json={"value": value}, headers=bob)
    assert (put.status_code, put.json()["total_tokens"], put.json()["memory"]["value"]) == (
        201,
        TOKEN_LIMIT,
        value,
    )
    over = client.put("/memory/extra", json={"value": "hello"}, headers=bob)
    assert (over.status_code, over.json()["error"]["total_tokens"]) == (409, TOKEN_LIMIT)
    assert client.get("/memory", headers=bob).json()["usage_percentage"] == 100.0
    assert client.delete("/memory/diary", headers=bob).status_code == 204
    assert client.delete("/memory/diary", headers=bob).json() == not_found_key("diary")
    assert client.put("/memory/health", json={"value": "bob's"}, headers=bob).status_code == 201
    assert client.delete("/memory", headers=bob).json() == {"deleted": 1}
    assert client.patch("/preferences", json={"memories": True}, headers=bob).json() == {
        "memories": True,
        "review": False,
    }
    assert client.patch("/preferences", json={"memories": False}, headers=bob).json() == {
        "memories": False,
        "review": False,
    }

    # Proposals: none of hers is listed, kept, dismissed or counted; her id answers as an id
    # nobody has.
    assert client.get("/memory/proposals", headers=bob).json() == {"proposals": []}
    unused = world.proposal + 1
    for action in ("accept", "reject"):
        hers = client.post(f"/memory/proposals/{world.proposal}/{action}", headers=bob)
        nobodys = client.post(f"/memory/proposals/{unused}/{action}", headers=bob)
        assert (hers.status_code, hers.json()) == (
            404,
            {"error": {"code": "not_found", "message": f"no pending proposal {world.proposal}"}},
        )
        assert without_echo(hers, str(world.proposal), str(unused)) == raw(nobodys)
    assert client.delete("/memory/proposals", headers=bob).json() == {"rejected": 0}

    # alice sees exactly what she saw before, timestamps included.
    assert world.view_of_alice() == world.alice_view


@pytest.mark.parametrize("how", list(BOB_CREDENTIALS))
def test_history_export_import_and_erasure_never_reach_the_other_user(
    world: World, how: str
) -> None:
    client, bob = world.client, BOB_CREDENTIALS[how](world)
    alices = client.get("/memory/history", headers=world.alice).json()["changes"]
    assert [c["key"] for c in alices] == ["health", "diary"]  # the check below can fail

    # Reads: no history, no export of hers; her key's history answers like nobody's key's.
    assert client.get("/memory/history", headers=bob).json() == {"changes": [], "next": None}
    assert client.get("/memory/history?key=diary", headers=bob).json() == {
        "changes": [],
        "next": None,
    }
    hers = client.get("/memory/diary/history", headers=bob)
    nobodys = client.get("/memory/dummy/history", headers=bob)
    assert without_echo(hers, "'diary'", "'dummy'") == raw(nobodys)
    assert hers.json() == {
        "error": {"code": "not_found", "message": "no memory and no history with key 'diary'"}
    }
    exported = client.get("/memory/export", headers=bob).json()
    assert (exported["user"], exported["memories"]) == ("bob", [])

    # Reverting to her change ids answers as an id nobody has, and changes nothing.
    taken = {c["id"] for c in alices}
    for change in alices:
        digits = len(str(change["id"]))
        unused = next(i for i in range(10 ** (digits - 1), 10**digits) if i not in taken)
        for key in ("diary", "health"):
            to_hers = client.post(f"/memory/{key}/revert", json={"to": change["id"]}, headers=bob)
            to_none = client.post(f"/memory/{key}/revert", json={"to": unused}, headers=bob)
            assert to_hers.status_code == 404
            assert without_echo(to_hers, str(change["id"]), str(unused)) == raw(to_none)

    # Writes land in bob's memory only; clearing and erasing clear only his.
    document = {"memories": [{"key": "diary", "value": "bob's diary"}]}
    assert client.post("/memory/import?mode=replace", json=document, headers=bob).json() == {
        "imported": 1,
        "deleted": 0,
        "total_tokens": 3,
        "token_limit": TOKEN_LIMIT,
    }
    assert client.delete("/memory/history", headers=bob).json() == {"deleted": 1}
    erased = client.delete("/me", headers=bob)
    assert erased.json()["deleted"]["memories"] == 1
    assert world.view_of_alice() == world.alice_view


@pytest.mark.parametrize("how", list(BOB_CREDENTIALS))
def test_conversation_routes_never_reach_the_other_user(world: World, how: str) -> None:
    client, bob, upstream = world.client, BOB_CREDENTIALS[how](world), world.upstream
    hers, nobodys = world.conversation, str(uuid.uuid4())
    calls = len(upstream.requests)

    for method, path, body in [
        ("GET", "/conversations/{}", None),
        ("DELETE", "/conversations/{}", None),
        ("POST", "/chat", {"message": "hi", "conversation_id": "{}"}),
        ("POST", "/chat", {"message": "hi", "conversation_id": "{}", "stream": True}),
        ("POST", "/chat", {"message": "hi", "conversation_id": "{}", "memory": False}),
    ]:
        answers = []
        for conversation_id in (hers, nobodys):
            filled = json.loads(json.dumps(body).replace("{}", conversation_id)) if body else None
            answers.append(
                client.request(method, path.format(conversation_id), json=filled, headers=bob)
            )
        assert answers[0].status_code == 404
        assert answers[0].json() == not_found_conversation(hers)
        assert without_echo(answers[0], hers, nobodys) == raw(answers[1]), (method, path, body)

    assert len(upstream.requests) == calls  # refused before any model call
    assert client.get("/conversations", headers=bob).json() == {"conversations": [], "next": None}
    # bob's own conversation is his alone, and alice's listing does not change.
    upstream.script(MAIN_MODEL, Reply(content="hello bob"))
    own = client.post("/chat", json={"message": "bob here"}, headers=bob).json()["conversation_id"]
    wait_agents_idle(client)
    assert [c["id"] for c in client.get("/conversations", headers=bob).json()["conversations"]] == [
        own
    ]
    assert client.get(
        f"/conversations/{own}", headers=world.alice
    ).json() == not_found_conversation(own)
    assert world.view_of_alice() == world.alice_view


ROUTES = [
    ("GET", "/memory", None),
    ("DELETE", "/memory", None),
    ("GET", "/memory/diary", None),
    ("PUT", "/memory/diary", {"value": "overwritten"}),
    ("DELETE", "/memory/diary", None),
    ("GET", "/preferences", None),
    ("PATCH", "/preferences", {"memories": True}),
    ("GET", "/memory/history", None),
    ("DELETE", "/memory/history", None),
    ("GET", "/memory/diary/history", None),
    ("POST", "/memory/diary/revert", {"to": 1}),
    ("GET", "/memory/export", None),
    ("POST", "/memory/import", {"memories": [{"key": "diary", "value": "overwritten"}]}),
    ("POST", "/memory/import?mode=replace", {"memories": []}),
    ("DELETE", "/me", None),
    ("GET", "/memory/proposals", None),
    ("DELETE", "/memory/proposals", None),
    ("POST", "/memory/proposals/1/accept", None),
    ("POST", "/memory/proposals/1/reject", None),
    ("POST", "/chat", {"message": "hi"}),
    ("GET", "/conversations", None),
    ("GET", "/conversations/{conversation}", None),
    ("DELETE", "/conversations/{conversation}", None),
    (
        "POST",
        "/v1/chat/completions",
        {"model": f"openai/{MAIN_MODEL}", "messages": [{"role": "user", "content": "hi"}]},
    ),
    ("GET", "/v1/models", None),
    ("POST", "/sessions", None),
    ("DELETE", "/sessions/current", None),
    ("POST", "/memory/context", {"system": "s"}),
    ("POST", "/memory/agent", {"messages": [{"role": "user", "content": "remember x"}]}),
    (
        "POST",
        "/mcp",
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "memory_get", "arguments": {"key": "diary"}},
        },
    ),
    ("GET", "/usage", None),
    ("GET", "/metrics", None),
]


@pytest.mark.slow
def test_outsiders_learn_nothing_on_any_route(world: World, subtests: pytest.Subtests) -> None:
    """bob's key naming alice, no key, a wrong key and alice's revoked key: refused on every
    route, and the refusal is the same whether or not the user they aim at exists.

    One world for all the routes, each a subtest: every refusal is checked to leave alice's
    view as it was, so no route sees another's leftovers (a world per route cost 0.47 s
    each, 30 s of the suite's CPU over both backends)."""
    for method, path, body in ROUTES:
        with subtests.test(msg=f"{method} {path}"):
            outsiders_are_refused(world, method, path, body)


def outsiders_are_refused(world: World, method: str, path: str, body: Any) -> None:
    """The checks of `test_outsiders_learn_nothing_on_any_route` on one route."""
    client, path = world.client, path.format(conversation=world.conversation)
    revoked_info, revoked = world.keys.create("alice")
    world.keys.revoke(revoked_info.id)
    calls = len(world.upstream.requests)

    naming_alice = client.request(
        method, path, json=body, headers=bearer(world.bob_key, **{"X-User-Id": "alice"})
    )
    naming_nobody = client.request(
        method, path, json=body, headers=bearer(world.bob_key, **{"X-User-Id": "zelda"})
    )
    assert raw(naming_alice) == raw(naming_nobody)
    assert naming_alice.status_code == 403
    assert naming_alice.json()["error"]["code"] == "forbidden"

    with_revoked = client.request(method, path, json=body, headers=bearer(revoked))
    with_unknown = client.request(
        method, path, json=body, headers=bearer("kvm_" + "A" * (len(revoked) - 4))
    )
    without_key = client.request(method, path, json=body)
    assert raw(with_revoked) == raw(with_unknown)
    assert (with_revoked.status_code, without_key.status_code) == (401, 401)

    # alice's ended session and a token never minted: the same 401, on every route.
    ended = client.post("/sessions", headers=world.alice).json()["token"]
    assert client.delete("/sessions/current", headers=bearer(ended)).status_code == 204
    with_ended = client.request(method, path, json=body, headers=bearer(ended))
    with_unminted = client.request(
        method, path, json=body, headers=bearer("kvs_" + "A" * (len(ended) - 4))
    )
    assert raw(with_ended) == raw(with_unminted)
    assert with_ended.status_code == 401
    assert (
        with_revoked.json()["error"]["code"]
        == without_key.json()["error"]["code"]
        == "unauthorized"
    )

    assert len(world.upstream.requests) == calls
    assert world.view_of_alice() == world.alice_view


OLLAMA_CHAT = {"model": f"openai/{MAIN_MODEL}", "messages": [{"role": "user", "content": "hi"}]}
OLLAMA_GENERATE = {"model": f"openai/{MAIN_MODEL}", "prompt": "hi"}
OLLAMA_ROUTES = [
    ("POST", "/api/chat", OLLAMA_CHAT),
    ("POST", "/api/chat", {**OLLAMA_CHAT, "stream": False}),
    ("POST", "/api/generate", OLLAMA_GENERATE),
    ("GET", "/api/tags", None),
    ("POST", "/api/show", {"model": f"openai/{MAIN_MODEL}"}),
    ("GET", "/api/version", None),
    ("GET", "/api/ps", None),
]


def test_outsiders_learn_nothing_on_the_ollama_routes(
    world: World, subtests: pytest.Subtests
) -> None:
    """As on every other route, in Ollama's error shape: refused before any model call, the
    same refusal whoever it aims at (one world, a subtest per route, as above)."""
    for method, path, body in OLLAMA_ROUTES:
        with subtests.test(msg=f"{method} {path} {body}"):
            outsiders_are_refused_by_ollama(world, method, path, body)


def outsiders_are_refused_by_ollama(world: World, method: str, path: str, body: Any) -> None:
    """The checks of `test_outsiders_learn_nothing_on_the_ollama_routes` on one route."""
    client = world.client
    revoked_info, revoked = world.keys.create("alice")
    world.keys.revoke(revoked_info.id)
    calls = len(world.upstream.requests)

    naming_alice = client.request(
        method, path, json=body, headers=bearer(world.bob_key, **{"X-User-Id": "alice"})
    )
    naming_nobody = client.request(
        method, path, json=body, headers=bearer(world.bob_key, **{"X-User-Id": "zelda"})
    )
    assert raw(naming_alice) == raw(naming_nobody)
    assert (naming_alice.status_code, naming_alice.json()) == (
        403,
        {"error": ("a user key acts only for its own user; drop X-User-Id or use a service key")},
    )

    with_revoked = client.request(method, path, json=body, headers=bearer(revoked))
    with_unknown = client.request(
        method, path, json=body, headers=bearer("kvm_" + "A" * (len(revoked) - 4))
    )
    without_key = client.request(method, path, json=body)
    assert raw(with_revoked) == raw(with_unknown)
    assert (with_revoked.status_code, with_revoked.json()) == (
        401,
        {"error": "the API key is not valid (unknown or revoked)"},
    )
    assert (without_key.status_code, without_key.json()) == (
        401,
        {"error": "missing credentials: send Authorization: Bearer <key>"},
    )

    assert len(world.upstream.requests) == calls
    assert world.view_of_alice() == world.alice_view


def test_ollama_chats_never_see_the_other_users_memory(world: World) -> None:
    """Every way bob chats through the Ollama routes: the main model and the agent get bob's
    memory only, the agent writes bob's memory only, and the upstream is told bob's id."""
    client, upstream = world.client, world.upstream
    bob = bearer(world.bob_key)
    client.patch("/preferences", json={"memories": True}, headers=world.alice)
    assert client.put("/memory/fact", json={"value": BOB_FACT}, headers=bob).status_code == 201
    upstream.default(
        AGENT_MODEL, Reply(content=None, tool_calls=[set_memory("diary", "bob's diary")])
    )
    before = len(upstream.requests)

    sent = [
        client.post("/api/chat", json=OLLAMA_CHAT, headers=bob),
        client.post("/api/chat", json={**OLLAMA_CHAT, "stream": False}, headers=service("bob")),
        client.post(
            "/api/generate",
            json=OLLAMA_GENERATE,
            headers=bearer(world.bob_key, **{"X-OpenWebUI-User-Id": "alice"}),
        ),
        client.post(
            "/api/generate",
            json={**OLLAMA_GENERATE, "stream": False},
            headers=bearer(SERVICE_KEY, **{"X-OpenWebUI-User-Id": "bob"}),
        ),
    ]
    assert [r.status_code for r in sent] == [200] * len(sent)
    assert json.loads(sent[0].text.splitlines()[-1])["done"] is True
    wait_agents_idle(client)

    requests = upstream.requests[before:]
    mains = [r for r in requests if r.model == MAIN_MODEL]
    agents = [r for r in requests if r.model == AGENT_MODEL]
    assert (len(mains), len(agents)) == (4, 4)
    for request in requests:
        assert request.headers["x-kvmem-user"] == "bob"
        for marker in ALICE_MARKERS:
            assert marker not in upstream_text(request), (request.model, marker)
    for request in mains:
        assert BOB_FACT in request.system
    for request in agents:
        assert BOB_FACT in request.messages[1]["content"]
    for response in sent:
        for marker in ALICE_MARKERS:
            assert marker not in response.text
    assert client.get("/memory/diary", headers=bob).json()["value"] == "bob's diary"
    assert client.get("/memory/diary", headers=world.alice).json() == json.loads(
        world.alice_view["/memory/diary"][2]
    )


def upstream_text(request: Any) -> str:
    return json.dumps(request.body, ensure_ascii=False)


def test_models_never_see_the_other_users_memory(world: World) -> None:
    """Every way bob chats, on both endpoints: the main model and the agent get bob's memory
    only, the agent writes bob's memory only, and the upstream is told bob's id."""
    client, upstream = world.client, world.upstream
    bob = bearer(world.bob_key)
    # alice turns memory back on: her block would be injected into anything that is hers.
    client.patch("/preferences", json={"memories": True}, headers=world.alice)
    assert client.put("/memory/fact", json={"value": BOB_FACT}, headers=bob).status_code == 201
    upstream.default(
        AGENT_MODEL, Reply(content=None, tool_calls=[set_memory("diary", "bob's diary")])
    )
    before = len(upstream.requests)

    completion = {"model": f"openai/{MAIN_MODEL}", "messages": [{"role": "user", "content": "hi"}]}
    sent = [
        client.post("/chat", json={"message": "hi"}, headers=bob),
        client.post("/chat", json={"message": "hi", "stream": True}, headers=bob),
        client.post("/chat", json={"message": "hi"}, headers=service("bob")),
        client.post("/v1/chat/completions", json={**completion, "user": "alice"}, headers=bob),
        client.post(
            "/v1/chat/completions", json={**completion, "user": "alice"}, headers=service("bob")
        ),
        client.post(
            "/v1/chat/completions", json={**completion, "user": "bob"}, headers=bearer(SERVICE_KEY)
        ),
        client.post(
            "/v1/chat/completions",
            json=completion,
            headers=bearer(world.bob_key, **{"X-OpenWebUI-User-Id": "alice"}),
        ),
        client.post(
            "/v1/chat/completions",
            json={**completion, "stream": True},
            headers=bearer(SERVICE_KEY, **{"X-OpenWebUI-User-Id": "bob"}),
        ),
    ]
    assert [r.status_code for r in sent] == [200] * len(sent)
    assert sse_events(sent[1].text)[-1][0] == "done"
    wait_agents_idle(client)

    requests = upstream.requests[before:]
    mains = [r for r in requests if r.model == MAIN_MODEL]
    agents = [r for r in requests if r.model == AGENT_MODEL]
    assert (len(mains), len(agents)) == (8, 8)
    for request in requests:
        assert request.headers["x-kvmem-user"] == "bob"
        for marker in ALICE_MARKERS:
            assert marker not in upstream_text(request), (request.model, marker)
    for request in mains:
        assert BOB_FACT in request.system  # bob's own block is there: the check can fail
    for request in agents:
        assert BOB_FACT in request.messages[1]["content"]
    for response in sent:
        for marker in ALICE_MARKERS:
            assert marker not in response.text

    # Every agent write went to bob; alice's diary is still hers, unchanged.
    assert client.get("/memory/diary", headers=bob).json()["value"] == "bob's diary"
    assert client.get("/memory/diary", headers=world.alice).json() == json.loads(
        world.alice_view["/memory/diary"][2]
    )
    assert client.get("/memory/health", headers=bob).json() == not_found_key("health")


MCP_HEADERS = {"Accept": "application/json, text/event-stream"}


def mcp_call(client: TestClient, headers: dict[str, str], method: str, **params: Any) -> Any:
    """One JSON-RPC call to /mcp; its `result` (or the whole body if there is none)."""
    body = {"jsonrpc": "2.0", "id": 7, "method": method, "params": params}
    response = client.post("/mcp", json=body, headers={**headers, **MCP_HEADERS})
    assert response.status_code == 200, response.text
    return response.json().get("result", response.json())


def tool_error(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": True}


@pytest.mark.parametrize("how", list(BOB_CREDENTIALS))
def test_hooks_and_mcp_never_reach_the_other_user(world: World, how: str) -> None:
    client, bob, upstream = world.client, BOB_CREDENTIALS[how](world), world.upstream
    # alice turns memory back on: her block is what a slip would leak.
    client.patch("/preferences", json={"memories": True}, headers=world.alice)
    world.alice_view = world.view_of_alice()

    empty = {"block": "", "injected": [], "token_count": 0, "enabled": True, "system": "S"}
    assert client.post("/memory/context", json={"system": "S"}, headers=bob).json() == empty
    assert (
        mcp_call(client, bob, "resources/read", uri="memory://block")["contents"][0]["text"] == ""
    )

    # bob's MCP calls: alice's keys are keys nobody has, and writes land in bob's memory.
    assert mcp_call(client, bob, "tools/call", name="memory_list", arguments={})[
        "structuredContent"
    ] == listing([], 0)
    for tool, message in [
        ("memory_get", 'No memory with key "diary".'),
        ("memory_delete", 'No memory with key "diary". Nothing to delete.'),
    ]:
        assert mcp_call(client, bob, "tools/call", name=tool, arguments={"key": "diary"}) == (
            tool_error(message)
        )
    assert mcp_call(client, bob, "tools/call", name="memory_history", arguments={})[
        "structuredContent"
    ] == {"changes": [], "next": None}
    written = mcp_call(
        client, bob, "tools/call", name="memory_set", arguments={"key": "fact", "value": BOB_FACT}
    )
    assert (
        written["structuredContent"]["total_tokens"]
        == written["structuredContent"]["memory"]["token_count"]
    )  # alice's tokens are not counted

    # The agent hook reads bob's memory and writes bob's memory.
    upstream.script(AGENT_MODEL, Reply(content=None, tool_calls=[set_memory("diary", "bob's")]))
    ran = client.post(
        "/memory/agent",
        headers=bob,
        json={"messages": [{"role": "user", "content": "remember my diary"}]},
    )
    assert ran.json() == {
        "agent": "done",
        "updates": [{"op": "set", "key": "diary", "value": "bob's"}],
    }
    agent_request = upstream.received(AGENT_MODEL)[-1]  # (alice chatted when the world was made)
    assert BOB_FACT in agent_request.messages[1]["content"]
    block = client.post("/memory/context", json={}, headers=bob).json()
    assert block["injected"] == ["fact", "diary"]
    for text in (
        upstream_text(agent_request),
        json.dumps(block),
        json.dumps(mcp_call(client, bob, "resources/read", uri="memory://block")),
    ):
        for marker in ALICE_MARKERS:
            assert marker not in text
    assert client.get("/memory/diary", headers=bob).json()["value"] == "bob's"
    assert world.view_of_alice() == world.alice_view


# --- the CLI --------------------------------------------------------------------------------


def test_cli_memory_commands_with_user_touch_only_that_user(
    world: World, database_url: str, tmp_path: Path
) -> None:
    folder = tmp_path / "cli"
    folder.mkdir()
    config = {"database": {"url": database_url}, "memory": {"tokenLimit": TOKEN_LIMIT}}
    (folder / "memory.yaml").write_text(json.dumps(config), encoding="utf-8")
    (folder / "bob.json").write_text(
        json.dumps({"memories": [{"key": "diary", "value": "bob imported"}]}), encoding="utf-8"
    )

    def commands(*argv: list[str]) -> list[Result]:
        return invoke_all([["--config", "memory.yaml", *args] for args in argv], folder)

    reads = commands(
        ["memory", "list", "--user", "bob"],
        ["memory", "get", "diary", "--user", "bob"],
        ["memory", "get", "dummy", "--user", "bob"],
        ["memory", "export", "--user", "bob"],
        ["memory", "proposals", "--user", "bob"],
        ["memory", "accept", str(world.proposal), "--user", "bob"],
        ["memory", "reject", str(world.proposal), "--user", "bob"],
    )
    assert [(r.code, r.stderr) for r in reads] == [
        (0, ""),
        (1, "kvmem: not_found: no memory with key 'diary'\n"),
        (1, "kvmem: not_found: no memory with key 'dummy'\n"),
        (0, ""),
        (0, ""),
        (1, f"kvmem: not_found: no pending proposal {world.proposal}\n"),
        (1, f"kvmem: not_found: no pending proposal {world.proposal}\n"),
    ]
    assert reads[4].json() == {"proposals": []}
    assert reads[0].json() == listing([], 0)
    assert reads[3].json() == {
        "format": "kvmem.memory.v1",
        "user": "bob",
        "exported_at": ISO_TIME,
        "preferences": {"memories": True},
        "memories": [],
    }
    assert reads[1].stdout == reads[2].stdout == ""

    deleted, cleared = commands(
        ["memory", "delete", "diary", "--user", "bob"], ["memory", "clear", "--user", "bob"]
    )
    assert (deleted.code, deleted.stdout, deleted.stderr) == (
        1,
        "",
        "kvmem: not_found: no memory with key 'diary'\n",
    )
    assert (cleared.code, cleared.json()) == (0, {"deleted": 0})

    written = commands(["memory", "set", "health", "bob's health", "--user", "bob"])[0]
    assert (written.code, written.json()["total_tokens"]) == (0, 3)  # alice's tokens not counted
    imported = commands(["memory", "import", "bob.json", "--replace", "--user", "bob"])[0]
    assert (imported.code, imported.json()) == (
        0,
        {"imported": 1, "deleted": 1, "total_tokens": 2, "token_limit": TOKEN_LIMIT},
    )
    final = commands(["memory", "list", "--user", "bob"])[0].json()
    assert [(m["key"], m["value"], m["source"]) for m in final["memories"]] == [
        ("diary", "bob imported", "import")
    ]
    assert world.view_of_alice() == world.alice_view


# --- the fuzz run ---------------------------------------------------------------------------

FUZZ_ENV = "KVMEM_FUZZ_EXAMPLES"
FUZZ_EXAMPLES = int(os.environ.get(FUZZ_ENV) or 200)
ERROR_CODES = {
    400: {"bad_request"},
    401: {"unauthorized"},
    403: {"forbidden", "memory_disabled", "personalize_disabled", "review_not_per_user"},
    404: {"not_found", "model_not_found"},
    405: {"method_not_allowed"},
    409: {"memory_full"},
    413: {"body_too_large"},
    422: {"invalid_key", "key_not_allowed", "empty_value", "value_too_long"},
}
FUZZ_USERS = ("alice", "bob")
NOBODYS_CONVERSATION = str(uuid.uuid4())
VICTIM = "carol"  # seeded, never acted for: must come out of the run untouched


@dataclass
class Cast:
    """The fuzz run's users: their credentials, their markers, their conversations."""

    credentials: list[tuple[str | None, dict[str, str]]]
    markers: dict[str, list[str]]
    conversations: dict[str, str]


def marker(user: str, what: str) -> str:
    return f"{user}-{what}-{uuid.uuid4().hex[:10]}"


def cast_of(client: TestClient, upstream: Any, database: Database) -> Cast:
    keys = KeyStore(database)
    secrets = {user: keys.create(user)[1] for user in (*FUZZ_USERS, VICTIM)}
    markers: dict[str, list[str]] = {}
    conversations = {}
    for user, secret in secrets.items():
        own = [marker(user, what) for what in ("value", "said", "heard")]
        markers[user] = own
        headers = bearer(secret)
        assert (
            client.put(
                f"/memory/secret_{user}", json={"value": own[0]}, headers=headers
            ).status_code
            == 201
        )
        assert (
            client.put("/memory/shared", json={"value": own[0]}, headers=headers).status_code == 201
        )
        upstream.script(MAIN_MODEL, Reply(content=own[2]))
        chat = client.post("/chat", json={"message": own[1]}, headers=headers)
        assert chat.status_code == 200, chat.text
        conversations[user] = chat.json()["conversation_id"]
        client.app_state["services"].proposals.propose(user, "shared", own[0])
    alice, bob = secrets["alice"], secrets["bob"]
    credentials: list[tuple[str | None, dict[str, str]]] = [
        ("alice", bearer(alice)),
        ("bob", bearer(bob)),
        ("alice", service("alice")),
        ("bob", service("bob")),
        ("bob", bearer(bob, **{"X-OpenWebUI-User-Id": "alice"})),
        ("alice", bearer(SERVICE_KEY, **{"X-OpenWebUI-User-Id": "alice"})),
        (None, bearer(alice, **{"X-User-Id": "bob"})),
        ("bob", bearer(client.post("/sessions", headers=bearer(bob)).json()["token"])),
        (None, bearer("kvm_wrong")),
        (None, bearer("kvs_wrong")),
        (None, {}),
    ]
    return Cast(credentials, markers, conversations)


@functools.cache
def json_values() -> st.SearchStrategy[Any]:
    text = st.text(alphabet=st.characters(codec=None, categories=None), max_size=30)
    scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | text
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
        max_leaves=12,
    )


@functools.cache
def any_text(max_size: int = 40) -> st.SearchStrategy[str]:
    """Text of any code points, lone surrogates included (JSON can spell them as \\udXXX)."""
    # st.text never draws surrogates, so join characters by hand.
    chars = st.characters() | st.characters(categories=["Cs"])
    return st.lists(chars, max_size=max_size).map("".join)


KNOWN_KEYS = ["diary", "shared", "secret_alice", "secret_bob", "secret_carol", "nothing"]
PATH_TRICKS = [
    "%",
    "%zz",
    "%00",
    "%C3%28",
    "%ED%A0%80",
    "%2F",
    "%2e%2e",
    "..",
    "%20",
    "%0A",
    "a%2Fb",
]


@functools.cache
def segment_texts(known: tuple[str, ...]) -> st.SearchStrategy[str]:
    return (
        st.sampled_from(known)
        | st.from_regex(r"[a-z][a-z0-9_]{0,140}", fullmatch=True)
        | any_text(20).filter(lambda s: s != "")
        | st.text(min_size=100, max_size=400)
    )


@st.composite
def path_segments(draw: Any, known: list[str]) -> str:
    """A path segment: known names, valid and invalid keys, unicode, long, percent tricks."""
    text = draw(segment_texts(tuple(known)))
    encoded = quote(text.encode("utf-8", "surrogatepass"), safe="")
    if draw(st.integers(0, 3)):  # mostly as a client would encode it
        return encoded
    trick = draw(st.sampled_from(PATH_TRICKS))
    return draw(st.sampled_from([trick, encoded + trick, trick + encoded]))


@functools.cache
def body_strategies(conversation_ids: tuple[str, ...]) -> dict[str, st.SearchStrategy[Any]]:
    """Each route's body, shaped by its schema (built once: building strategies per example
    cost most of the fuzz test's time)."""
    return {
        "key": st.fixed_dictionaries({"value": any_text()}, optional={"source": json_values()}),
        "preferences": st.fixed_dictionaries(
            {"memories": st.booleans() | json_values()},
            optional={"review": st.booleans() | json_values()},
        ),
        "revert": st.fixed_dictionaries({"to": st.integers(-2, 2**64) | json_values()}),
        "import": st.fixed_dictionaries(
            {
                "memories": st.lists(
                    st.fixed_dictionaries(
                        {"key": st.sampled_from(KNOWN_KEYS) | any_text(12), "value": any_text()},
                        optional={"source": json_values()},
                    ),
                    max_size=4,
                )
                | json_values()
            },
            optional={
                "format": st.just("kvmem.memory.v1") | json_values(),
                "user": st.sampled_from([*FUZZ_USERS, VICTIM]),
            },
        ),
        "chat": st.fixed_dictionaries(
            {"message": any_text()},
            optional={
                "conversation_id": st.none() | st.sampled_from(conversation_ids) | any_text(),
                "memory": st.booleans() | json_values(),
                "stream": st.booleans(),
                "max_turns": st.none() | st.integers(-2, 4) | json_values(),
            },
        ),
        "completions": st.fixed_dictionaries(
            {
                "model": st.sampled_from([f"openai/{MAIN_MODEL}", "gpt-nope"]) | json_values(),
                "messages": st.lists(
                    st.fixed_dictionaries(
                        {
                            "role": st.sampled_from(["user", "system", "assistant"]),
                            "content": any_text(),
                        }
                    ),
                    max_size=3,
                )
                | json_values(),
            },
            optional={"stream": st.booleans(), "user": st.sampled_from([*FUZZ_USERS, VICTIM])},
        ),
        "ollama_chat": st.fixed_dictionaries(
            {
                "model": st.sampled_from([f"openai/{MAIN_MODEL}", "llama3:latest"]) | json_values(),
                "messages": st.lists(
                    st.fixed_dictionaries(
                        {
                            "role": st.sampled_from(["user", "system", "assistant"]),
                            "content": any_text(),
                        }
                    ),
                    max_size=3,
                )
                | json_values(),
            },
            optional={"stream": st.booleans(), "options": json_values(), "format": json_values()},
        ),
        "ollama_generate": st.fixed_dictionaries(
            {"model": st.sampled_from([f"openai/{MAIN_MODEL}", "nope"]), "prompt": any_text()},
            optional={"stream": st.booleans(), "system": any_text() | json_values()},
        ),
        "ollama_show": st.fixed_dictionaries({"model": any_text() | json_values()}),
        "context": st.fixed_dictionaries({}, optional={"system": any_text() | json_values()}),
        "agent": st.fixed_dictionaries(
            {
                "messages": st.lists(
                    st.fixed_dictionaries(
                        {
                            "role": st.sampled_from(["user", "assistant", "tool", "robot"])
                            | json_values()
                        },
                        optional={
                            "content": any_text()
                            | st.lists(json_values(), max_size=2)
                            | json_values()
                        },
                    ),
                    max_size=3,
                )
                | json_values()
            },
            optional={
                "wait": st.booleans() | json_values(),
                "deadline_seconds": st.floats(-1, 61) | json_values(),
                "conversation_id": any_text() | json_values(),
            },
        ),
        "mcp": st.fixed_dictionaries(
            {
                "jsonrpc": st.just("2.0") | json_values(),
                "method": st.sampled_from(
                    [
                        "tools/call",
                        "tools/call",
                        "tools/list",
                        "resources/read",
                        "initialize",
                        "ping",
                        "nope",
                    ]
                )
                | json_values(),
            },
            optional={
                "id": st.integers(0, 9) | json_values(),
                "params": st.fixed_dictionaries(
                    {
                        "name": st.sampled_from(
                            [
                                "memory_list",
                                "memory_get",
                                "memory_set",
                                "memory_delete",
                                "memory_history",
                                "nope",
                            ]
                        )
                    },
                    optional={
                        "arguments": st.fixed_dictionaries(
                            {},
                            optional={
                                "key": st.sampled_from(KNOWN_KEYS) | json_values(),
                                "value": any_text() | json_values(),
                                "extra": json_values(),
                            },
                        ),
                        "uri": st.sampled_from(["memory://block", "memory://x"]),
                    },
                )
                | json_values(),
            },
        ),
    }


@st.composite
def fuzz_requests(draw: Any, cast: Cast) -> tuple[int, str, str, bytes | None]:
    """(credentials index, method, path, body) — shaped by the API's schema, then bent."""
    conversation_ids = [*cast.conversations.values(), NOBODYS_CONVERSATION]
    route = draw(
        st.sampled_from(
            [
                "memory",
                "key",
                "key",
                "key",
                "preferences",
                "chat",
                "chat",
                "conversations",
                "conversation",
                "conversation",
                "completions",
                "models",
                "healthz",
                "ollama_chat",
                "ollama_generate",
                "ollama_tags",
                "ollama_show",
                "history",
                "key_history",
                "revert",
                "revert",
                "export",
                "import",
                "import",
                "me",
                "context",
                "agent",
                "mcp",
                "mcp",
                "proposals",
                "proposal",
                "proposal",
            ]
        )
    )
    path = {
        "context": "/memory/context",
        "agent": "/memory/agent",
        "mcp": "/mcp",
        "memory": "/memory",
        "preferences": "/preferences",
        "chat": "/chat",
        "conversations": "/conversations",
        "completions": "/v1/chat/completions",
        "models": "/v1/models",
        "healthz": "/healthz",
        "ollama_chat": "/api/chat",
        "ollama_generate": "/api/generate",
        "ollama_tags": "/api/tags",
        "ollama_show": "/api/show",
        "export": "/memory/export",
        "me": "/me",
        "proposals": "/memory/proposals",
    }.get(route)
    if route == "key":
        path = "/memory/" + draw(path_segments(KNOWN_KEYS))
    elif route in ("key_history", "revert"):
        path = f"/memory/{draw(path_segments(KNOWN_KEYS))}/{route.removeprefix('key_')}"
    elif route == "history":
        params = draw(
            st.dictionaries(
                st.sampled_from(["key", "limit", "before"]),
                st.sampled_from(KNOWN_KEYS) | st.integers(-2, 2**64).map(str) | any_text(10),
                max_size=3,
            )
        )
        query = "&".join(
            f"{name}={quote(value.encode('utf-8', 'surrogatepass'), safe='')}"
            for name, value in params.items()
        )
        path = "/memory/history" + (f"?{query}" if query else "")
    elif route == "import":
        mode = draw(st.sampled_from(["", "?mode=merge", "?mode=replace", "?mode=nope"]))
        path = "/memory/import" + mode
    elif route == "conversation":
        path = "/conversations/" + draw(path_segments(conversation_ids))
    elif route == "proposal":  # the cast's proposals are ids 1-3
        action = draw(st.sampled_from(["accept", "reject"]))
        path = f"/memory/proposals/{draw(path_segments(['1', '2', '3', '4', '0']))}/{action}"
    usual = {
        "key": "PUT",
        "preferences": "PATCH",
        "chat": "POST",
        "completions": "POST",
        "ollama_chat": "POST",
        "ollama_generate": "POST",
        "ollama_show": "POST",
        "revert": "POST",
        "import": "POST",
        "me": "DELETE",
        "context": "POST",
        "agent": "POST",
        "mcp": "POST",
        "proposal": "POST",
    }.get(route, "GET")
    method = draw(
        st.sampled_from(
            [usual, usual, usual, "GET", "PUT", "DELETE", "PATCH", "POST", "HEAD", "OPTIONS"]
        )
    )
    shaped = body_strategies(tuple(conversation_ids)).get(route, json_values())
    kind = draw(st.sampled_from(["none", "shaped", "shaped", "shaped", "any", "bytes"]))
    body: bytes | None
    if kind == "none":
        body = None
    elif kind == "bytes":
        body = draw(st.binary(max_size=64))
    else:
        value = draw(shaped if kind == "shaped" else json_values())
        body = json.dumps(value, ensure_ascii=True).encode()
    who = draw(st.integers(0, len(cast.credentials) - 1))
    return who, method, path, body


def route_of(path: str) -> str:
    """The route a path is meant for, with its parameter blanked."""
    for prefix in ("/memory/", "/conversations/"):
        if path.startswith(prefix):
            return prefix + "{...}"
    return path


def is_jsonrpc_error(body: Any) -> bool:
    """A JSON-RPC error response: what the MCP transport answers a malformed message with."""
    error = body.get("error") if isinstance(body, dict) else None
    return (
        set(body) == {"jsonrpc", "id", "error"}
        and body["jsonrpc"] == "2.0"
        and isinstance(error, dict)
        and isinstance(error.get("code"), int)
        and isinstance(error.get("message"), str)
    )


def error_shape_problem(path: str, status: int, content: bytes) -> str | None:
    """What is wrong with an error body, or None."""
    try:
        body = json.loads(content)
    except ValueError:
        return "not JSON"
    if path == "/mcp" and status in (400, 406) and is_jsonrpc_error(body):
        return None
    error = body.get("error") if isinstance(body, dict) else None
    if path.startswith("/api/"):  # Ollama's shape: {"error": "message"}
        return (
            None
            if isinstance(body, dict) and list(body) == ["error"] and isinstance(error, str)
            else "not {'error': str}"
        )
    if list(body) != ["error"] or not isinstance(error, dict):
        return "not {'error': {...}}"
    if not (isinstance(error.get("code"), str) and isinstance(error.get("message"), str)):
        return "no code and message"
    if error["code"] not in ERROR_CODES.get(status, set()):
        return f"code {error['code']!r} with status {status}"
    if path.startswith("/v1/") and not {"type", "param"} <= set(error):
        return "no OpenAI type and param"
    return None


@pytest.mark.slow
def test_fuzzed_requests_find_no_500_and_no_cross_user_read(
    make_client: Callable[..., TestClient], chat_sections: Any, upstream: Any, database: Database
) -> None:
    client = make_client(
        **chat_sections(
            auth=KEYS_AUTH, memory={"agent": None, "tokenLimit": 400}, chat={"headers": USER_HEADER}
        )
    )
    cast = cast_of(client, upstream, database)
    victim_before = {
        path: raw(client.get(path, headers=service(VICTIM)))
        for path in (
            "/memory",
            "/conversations",
            f"/conversations/{cast.conversations[VICTIM]}",
            "/memory/proposals",
        )
    }
    problems: dict[str, list[str]] = {}  # kind of problem: examples
    erased: set[str | None] = set()  # users a DELETE /me erased

    def problem(kind: str, example: str) -> None:
        problems.setdefault(kind, []).append(example)

    @settings(
        max_examples=FUZZ_EXAMPLES,
        deadline=None,
        database=None,
        derandomize=not os.environ.get(FUZZ_ENV),
        suppress_health_check=list(HealthCheck),
    )
    @given(request=fuzz_requests(cast))
    def one_request(request: tuple[int, str, str, bytes | None]) -> None:
        who, method, path, body = request
        acting, headers = cast.credentials[who]
        if path == "/mcp" and body is not None and body.startswith(b"{"):  # most, not all
            headers = {**headers, **MCP_HEADERS, "Content-Type": "application/json"}
        response = client.request(method, path, content=body, headers=headers)
        label = f"{method} {path[:80]} as {acting} body={body[:120] if body else body!r}"
        if response.status_code >= 500:
            problem(
                f"{response.status_code} on {method} {route_of(path)}",
                f"{response.content[:160]!r}: {label}",
            )
        elif response.status_code >= 400 and method != "HEAD":
            shape = error_shape_problem(path, response.status_code, response.content)
            if shape:
                problem(f"error shape: {shape} ({response.status_code} on {route_of(path)})", label)
        text = response.content.decode("utf-8", "replace") + repr(response.headers)
        for user, own in cast.markers.items():
            if user != acting and any(m in text for m in own):
                problem(f"{user}'s data answered to {acting}", label)
        if path == "/me" and method == "DELETE" and response.status_code == 200:
            erased.add(acting)  # its user keys are gone: they answer 401 from now on
        for owner, conversation_id in cast.conversations.items():
            others = acting not in (None, owner, *erased) and method in ("GET", "DELETE")
            if (
                others
                and path == f"/conversations/{conversation_id}"
                and (response.status_code, response.content)
                != (404, compact(not_found_conversation(conversation_id)))
            ):
                problem(f"{owner}'s conversation answered {response.status_code}", label)

    one_request()

    # What each user's requests made the main model see: never another user's data.
    for request in upstream.requests:
        whose = request.headers.get("x-kvmem-user")
        for user, own in cast.markers.items():
            if user != whose and any(m in upstream_text(request) for m in own):
                problem(f"{user}'s data went upstream for {whose}", upstream_text(request)[:200])
    victim_after = {path: raw(client.get(path, headers=service(VICTIM))) for path in victim_before}
    if victim_after != victim_before:
        problem(f"{VICTIM}'s data changed", repr(victim_after)[:300])
    # One line per kind of problem: how often, and the first example.
    assert not problems, "\n".join(
        f"{kind}: {len(examples)}x, e.g. {examples[0]}" for kind, examples in problems.items()
    )


def test_the_page_is_the_same_for_everyone(world: World) -> None:
    """/ui holds no user's data: alice, bob and a caller without a key get the same bytes
    (the page reads everything else through the API, with the caller's own credentials)."""
    client = world.client
    pages = [
        client.get("/ui"),
        client.get("/ui", headers=world.alice),
        client.get("/ui", headers=bearer(world.bob_key, **{"X-User-Id": "alice"})),
    ]
    assert [page.status_code for page in pages] == [200, 200, 200]
    assert pages[0].content == pages[1].content == pages[2].content
