"""Scopes (CONTRACT section 23) under a reviewer's probes: a scope named twice, a scoped
entry's expiry in its layer's history, and the per-user cap on pending proposals seen from
the own layer. Each test fails on the code as merged (main at 28ba2f9), but for the REST
expiry test when the app's sweep gets there first (it says so). On SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from starlette.testclient import TestClient

from kvmem.errors import NotFound
from kvmem.importers.records import ForeignMemory, UserMemories
from kvmem.importers.run import ForeignImport
from kvmem.memory.proposals import MAX_PENDING, ProposalStore
from kvmem.memory.store import MemoryStore
from tests.support.apps import MAIN_MODEL, services

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


# --- a scoped entry's expiry ----------------------------------------------------------------


def test_a_scoped_entrys_expiry_is_in_its_history_when_the_history_is_read(
    client: TestClient,
) -> None:
    """Section 24: an expired entry's history holds its `expire` change "by the time any route
    reads that user's memory after it". A history read settled the person's own layer only, so
    a scope's entry that came due showed no `expire` (until a turn in that scope, the page's
    list of it, or the sweep). The app's sweep, on the same clock, may get there first when
    the machine is busy: the store-level test below is the one that cannot pass by chance."""
    now = datetime.now(UTC)
    store = services(client).store
    store.set("alice", "notes", "oak", scope="kitchen", expires_at=now + timedelta(hours=1))
    store.clock = lambda: now + timedelta(hours=2)

    history = client.get("/memory/history?scope=kitchen", headers=ALICE).json()
    assert [(c["key"], c["op"], c["source"]) for c in history["changes"]] == [
        ("notes", "expire", "system"),
        ("notes", "set", "manual"),
    ]
    key_history = client.get("/memory/notes/history?scope=kitchen", headers=ALICE).json()
    assert [c["op"] for c in key_history["changes"]] == ["expire", "set"]
    assert client.get("/memory/history", headers=ALICE).json()["changes"] == []


@pytest.mark.parametrize("read", ["history", "key_history", "key_history_page", "get"])
def test_a_scoped_entrys_expiry_is_recorded_by_any_read_of_its_layer(
    make_store: Callable[..., MemoryStore], read: str
) -> None:
    """The store's reads of one layer (no app, so no sweep that might mark the entry first)."""
    store = make_store(**MEMORY)
    now = datetime.now(UTC)
    store.set("alice", "notes", "oak", scope="kitchen", expires_at=now + timedelta(hours=1))
    store.clock = lambda: now + timedelta(hours=2)
    if read == "get":
        with pytest.raises(NotFound):
            store.get("alice", "notes", scope="kitchen")
    elif read == "history":
        store.history("alice", scope="kitchen")
    else:
        getattr(store, read)("alice", "notes", scope="kitchen")
    # Read straight from the change log: no read of the layer that would settle it.
    with store.database.reading() as session:
        changes = store.history_log.of_key(session, "alice", "notes", "kitchen")
    assert [(c.op, c.source) for c in changes] == [("expire", "system"), ("set", "manual")]


# --- the per-user cap on pending proposals --------------------------------------------------


def test_an_import_under_review_counts_the_proposals_pending_in_the_users_scopes(
    make_store: Callable[..., MemoryStore],
) -> None:
    """At most `MAX_PENDING` proposals are pending per user, every layer counted (CONTRACT
    section 19; the oldest is dropped). `kvmem import --review` refuses an import that would
    push pending ones out unseen, but counted the own layer's only (`pending` became one
    layer's): with proposals waiting in scopes, it dropped them."""
    store = make_store(**{**MEMORY, "validKeys": None})
    proposals = ProposalStore(store)
    waiting = MAX_PENDING - 5
    for number in range(waiting):
        proposals.propose("alice", "notes", f"note {number}", scope=f"project-{number}")
    memories = tuple(
        ForeignMemory(f"fact {number}", float(number), f"line {number}", key=f"fact_{number}")
        for number in range(10)
    )
    importer = ForeignImport(store, free_key="imported", review=True)

    outcome = importer.import_user(UserMemories("alice", memories))
    assert [refusal.reason for refusal in outcome.refused] == [
        f"10 keys to propose, {waiting} proposals pending in the user's scopes, and at most "
        f"{MAX_PENDING} proposals are kept per user: import without --review, or review the "
        "pending ones first"
    ]
    assert proposals.pending("alice") == ()
    for number in range(waiting):
        assert [p.value for p in proposals.pending("alice", f"project-{number}")] == [
            f"note {number}"
        ]

    # Within the cap, the import is proposed as before.
    fits = UserMemories("alice", memories[:5])
    assert importer.import_user(fits).proposed == 5
    assert len(proposals.pending("alice")) == 5


# --- a scope where the route takes none, or takes it another way ------------------------------


SCOPE_BY_QUERY = bad_request(
    "the /memory routes name a scope with ?scope=NAME, not X-Memory-Scope (which the chat "
    "routes read): send ?scope, or no header"
)


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("DELETE", "/memory", None),
        ("DELETE", "/memory/history", None),
        ("DELETE", "/memory/proposals", None),
        ("PUT", "/memory/city", {"value": "Oslo"}),
        ("GET", "/memory", None),
        ("POST", "/memory/import", {"memories": [{"key": "city", "value": "Oslo"}]}),
    ],
)
def test_the_rest_routes_refuse_x_memory_scope_rather_than_act_on_the_own_layer(
    client: TestClient, method: str, path: str, body: Any
) -> None:
    """A client that set X-Memory-Scope for every call (the chat routes' way) and cleared
    memory would have cleared the person's own layer: the REST routes read only `?scope`."""
    client.put("/memory/city", json={"value": "Rome"}, headers=ALICE)
    client.put("/memory/notes?scope=kitchen", json={"value": "walnut"}, headers=ALICE)
    before = layers(client)
    headers = {**ALICE, "X-Memory-Scope": "kitchen"}
    response = client.request(method, path, json=body, headers=headers)
    assert (response.status_code, response.json()) == (400, SCOPE_BY_QUERY)
    assert layers(client) == before
    # An empty header names nothing, as on the chat routes.
    listed = client.get("/memory", headers={**ALICE, "X-Memory-Scope": ""})
    assert listed.status_code == 200


@pytest.mark.parametrize(
    ("method", "path", "body", "route"),
    [
        ("DELETE", "/me", None, "DELETE /me"),
        ("PATCH", "/preferences", {"memories": False}, "PATCH /preferences"),
    ],
)
@pytest.mark.parametrize("how", ["query", "header"])
def test_routes_acting_on_every_scope_refuse_one_named(
    client: TestClient, method: str, path: str, body: Any, route: str, how: str
) -> None:
    """`DELETE /me?scope=kitchen` erased every layer: what the caller meant is a guess, and
    the erasure cannot be undone. The switches of /preferences are the person's, not a
    scope's."""
    client.put("/memory/city", json={"value": "Rome"}, headers=ALICE)
    client.put("/memory/notes?scope=kitchen", json={"value": "walnut"}, headers=ALICE)
    before = layers(client)
    query, headers = (
        ("?scope=kitchen", ALICE)
        if how == "query"
        else ("", {**ALICE, "X-Memory-Scope": "kitchen"})
    )
    response = client.request(method, f"{path}{query}", json=body, headers=headers)
    message = f"{route} acts on every scope of the person's memory: send no scope"
    assert (response.status_code, response.json()) == (400, bad_request(message))
    assert layers(client) == before
    assert client.get("/preferences", headers=ALICE).json()["memories"] is True
