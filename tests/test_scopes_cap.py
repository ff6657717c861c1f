"""`memory.scopes.maxScopes`: how many scopes holding memory one user may have. A write or an
import that would start one more is refused (409 `memory_full`, nothing written); writes into
the person's own layer and into scopes they hold go on at the cap, and a scope whose entries
have all expired holds none. On SQLite and, with KVMEM_TEST_POSTGRES_URL set, PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from starlette.testclient import TestClient

from kvmem.config import MemoryConfig
from kvmem.config_loader import load_config
from kvmem.db.engine import Database
from kvmem.errors import ConfigError, MemoryFull
from kvmem.memory.imports import LayerImport
from kvmem.memory.rules import MemoryRules
from kvmem.memory.store import MemoryStore
from tests.support.apps import AGENT_MODEL, services, set_memory
from tests.support.clock import Clock
from tests.support.plans import Statement, captured_statements, table_scans
from tests.support.upstream import Reply

MakeClient = Callable[..., TestClient]
SERVICE_KEY = "svc-scopes-cap-41c9"
KEYS_AUTH = {"mode": "keys", "service_keys": [SERVICE_KEY]}
SCOPES = {"validKeys": ["notes", "decisions"], "maxScopes": 2}
MEMORY = {"validKeys": ["name", "city"], "scopes": SCOPES}


def as_user(user: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {SERVICE_KEY}", "X-User-Id": user}


ALICE, BOB = as_user("alice"), as_user("bob")


def scopes_full(doing: str, held: int, after: int) -> dict[str, Any]:
    """The 409 body of a write or import that would pass the cap of 2."""
    return {
        "error": {
            "code": "memory_full",
            "message": f"{doing} would take this user to {after} scopes, over the limit of 2 "
            "(memory.scopes.maxScopes); write into a scope that holds memory, or clear one",
            "max_scopes": 2,
            "scopes": held,
        }
    }


@pytest.fixture
def client(make_client: MakeClient) -> TestClient:
    """A server keeping at most 2 scopes a user, its users named by a service key."""
    return make_client(auth=KEYS_AUTH, memory=MEMORY)


def put(client: TestClient, key: str, value: str, scope: str | None = None, user=ALICE, **body):
    params = {"scope": scope} if scope is not None else None
    return client.put(f"/memory/{key}", params=params, json={"value": value, **body}, headers=user)


def written(client: TestClient, key: str, value: str, scope: str | None = None, user=ALICE):
    response = put(client, key, value, scope, user)
    assert response.status_code in (200, 201), response.text


def everything(client: TestClient, user=ALICE) -> dict[str | None, dict[str, str]]:
    """Every layer of the user, from an export of everything."""
    exported = client.get("/memory/export", headers=user)
    assert exported.status_code == 200, exported.text
    layers: dict[str | None, dict[str, str]] = {}
    for memory in exported.json()["memories"]:
        layers.setdefault(memory["scope"], {})[memory["key"]] = memory["value"]
    return layers


def scope_names(client: TestClient, user=ALICE) -> list[str]:
    return [s["scope"] for s in client.get("/memory/scopes", headers=user).json()["scopes"]]


# --- writes ----------------------------------------------------------------------------------


def test_a_put_that_would_start_one_scope_too_many_is_refused(client: TestClient) -> None:
    written(client, "name", "Ada")
    written(client, "notes", "oak worktops", "kitchen")
    written(client, "notes", "chapter 3", "thesis")
    before = everything(client)

    refused = put(client, "notes", "tomatoes", "garden")
    assert (refused.status_code, refused.json()) == (
        409,
        scopes_full("storing into scope 'garden'", held=2, after=3),
    )
    assert everything(client) == before
    assert scope_names(client) == ["kitchen", "thesis"]
    garden = client.get("/memory/history?scope=garden", headers=ALICE)
    assert (garden.status_code, garden.json()["changes"]) == (200, [])

    # At the cap: the scopes held and the person's own layer take writes as before.
    written(client, "decisions", "tiles from Porto", "kitchen")
    written(client, "notes", "chapter 4", "thesis")
    written(client, "city", "Lisbon")
    assert everything(client) == {
        None: {"name": "Ada", "city": "Lisbon"},
        "kitchen": {"notes": "oak worktops", "decisions": "tiles from Porto"},
        "thesis": {"notes": "chapter 4"},
    }

    # The cap is each user's: another user starts scopes of their own.
    written(client, "notes", "bob's garden", "garden", user=BOB)
    written(client, "notes", "bob's shed", "shed", user=BOB)

    # A scope emptied is no longer held: a new one may start in its place.
    assert client.delete("/memory?scope=thesis", headers=ALICE).status_code == 200
    written(client, "notes", "tomatoes", "garden")
    assert scope_names(client) == ["garden", "kitchen"]


def test_a_scope_whose_entries_all_expired_is_not_held(client: TestClient) -> None:
    clock = Clock()
    services(client).store.clock = clock
    written(client, "notes", "oak worktops", "kitchen")
    response = put(client, "notes", "for a week", "holiday", expires_in="1h")
    assert response.status_code == 201, response.text
    clock.advance(hours=2)  # the holiday's entry is due, and nothing read it since

    written(client, "notes", "tomatoes", "garden")  # kitchen and garden: at the cap
    for scope in ["holiday", "shed"]:  # holiday holds nothing now: starting it again counts
        refused = put(client, "notes", "again", scope)
        assert (refused.status_code, refused.json()) == (
            409,
            scopes_full(f"storing into scope {scope!r}", held=2, after=3),
        )
    assert scope_names(client) == ["garden", "kitchen"]


def test_only_a_write_that_starts_a_scope_counts_scopes(
    client: TestClient, database: Database
) -> None:
    written(client, "notes", "oak worktops", "kitchen")

    def counts(key: str, value: str, scope: str | None = None) -> list[Statement]:
        with captured_statements(database.engine) as captured:
            written(client, key, value, scope)
        return [s for s in captured if "count(distinct" in s.sql.lower()]

    assert counts("name", "Ada") == []  # the person's own layer: no count at all
    assert counts("decisions", "tiles", "kitchen") == []  # a scope held: none either
    (count,) = counts("notes", "chapter 3", "thesis")  # a new scope: one count, by index
    assert "from memory_entries" in count.sql.lower()
    assert table_scans(database.engine, [count]) == {}


def test_accepting_a_proposal_that_would_start_one_scope_too_many_is_refused(
    make_client: MakeClient,
) -> None:
    client = make_client(auth=KEYS_AUTH, memory={**MEMORY, "review": "on"})
    written(client, "notes", "oak worktops", "kitchen")
    written(client, "notes", "chapter 3", "thesis")
    proposal = services(client).proposals.propose("alice", "notes", "tomatoes", scope="garden")
    before = everything(client)

    refused = client.post(f"/memory/proposals/{proposal.id}/accept?scope=garden", headers=ALICE)
    assert (refused.status_code, refused.json()) == (
        409,
        scopes_full("storing into scope 'garden'", held=2, after=3),
    )
    assert everything(client) == before
    pending = services(client).proposals.pending("alice", "garden")
    assert [(p.key, p.value) for p in pending] == [("notes", "tomatoes")]


# --- the memory agent ------------------------------------------------------------------------


def test_the_agent_is_told_why_a_write_into_one_scope_too_many_was_refused(
    upstream: Any, chat_sections: Callable[..., dict[str, Any]], make_client: MakeClient
) -> None:
    client = make_client(**chat_sections(memory=MEMORY))
    store = services(client).store
    store.set("local", "notes", "oak worktops", scope="kitchen")
    store.set("local", "notes", "chapter 3", scope="thesis")
    upstream.script(
        AGENT_MODEL,
        Reply(
            content=None, tool_calls=[set_memory("notes", "tomatoes"), set_memory("name", "Ada")]
        ),
    )
    response = client.post(
        "/memory/agent",
        json={"messages": [{"role": "user", "content": "Remember..."}]},
        headers={"X-Memory-Scope": "garden"},
    )
    refusal = (
        "Memory already holds its limit of 2 scopes, and this would start another. "
        "Cannot save this memory."
    )
    # As for any refused tool call, the model is told why; `updates` lists what was written.
    assert (response.status_code, response.json()) == (
        200,
        {"agent": "done", "updates": [{"op": "set", "key": "name", "value": "Ada"}]},
    )
    assert [(e.scope, e.key) for e in store.every_layer("local").entries] == [
        ("", "name"),
        ("kitchen", "notes"),
        ("thesis", "notes"),
    ]
    _, second = upstream.received(AGENT_MODEL)  # the refusal went back to the model
    assert [m["content"] for m in second.messages if m["role"] == "tool"] == [
        refusal,
        'Memory set for key "name" (1 tokens)',
    ]


# --- imports ---------------------------------------------------------------------------------


def test_an_import_that_would_start_one_scope_too_many_is_refused_whole(
    client: TestClient,
) -> None:
    written(client, "name", "Ada")
    written(client, "notes", "oak worktops", "kitchen")
    before = everything(client)
    history = client.get("/memory/history", headers=ALICE).json()
    document = {
        "memories": [
            {"key": "city", "value": "Lisbon", "scope": None},
            {"key": "notes", "value": "oak and walnut", "scope": "kitchen"},
            {"key": "notes", "value": "chapter 3", "scope": "thesis"},
            {"key": "notes", "value": "tomatoes", "scope": "garden"},
        ]
    }
    for mode in ("merge", "replace"):
        refused = client.post(f"/memory/import?mode={mode}", json=document, headers=ALICE)
        assert (refused.status_code, refused.json()) == (
            409,
            scopes_full("importing into 2 new scopes ('garden', 'thesis')", held=1, after=3),
        )
        assert everything(client) == before
    assert client.get("/memory/history", headers=ALICE).json() == history

    # Into a fresh user, three scopes at once are as many too many.
    refused = client.post("/memory/import", json=document, headers=BOB)
    assert (refused.status_code, refused.json()) == (
        409,
        scopes_full("importing into 3 new scopes ('garden', 'kitchen', 'thesis')", held=0, after=3),
    )
    assert everything(client, BOB) == {}

    # With ?scope: one new scope at the cap is refused too.
    written(client, "notes", "chapter 3", "thesis")
    one = {"memories": [{"key": "notes", "value": "tomatoes"}]}
    refused = client.post("/memory/import?scope=garden", json=one, headers=ALICE)
    assert (refused.status_code, refused.json()) == (
        409,
        scopes_full("importing into scope 'garden'", held=2, after=3),
    )

    # At the cap, an import into the layers held goes through.
    document = {
        "memories": [
            {"key": "city", "value": "Lisbon", "scope": None},
            {"key": "decisions", "value": "tiles", "scope": "kitchen"},
            {"key": "notes", "value": "chapter 4", "scope": "thesis"},
        ]
    }
    imported = client.post("/memory/import", json=document, headers=ALICE)
    assert imported.status_code == 200, imported.text
    assert everything(client) == {
        None: {"name": "Ada", "city": "Lisbon"},
        "kitchen": {"notes": "oak worktops", "decisions": "tiles"},
        "thesis": {"notes": "chapter 4"},
    }


def test_an_import_that_empties_a_scope_makes_room_for_the_one_it_starts(
    make_store: Callable[..., MemoryStore], database: Database
) -> None:
    store = make_store(**MEMORY)
    store.set("alice", "notes", "oak worktops", scope="kitchen")
    store.set("alice", "notes", "chapter 3", scope="thesis")
    garden = LayerImport([("notes", "tomatoes")])

    # `replace` empties a layer it brings nothing to: thesis goes, garden comes, still two.
    store.import_layers("alice", {"thesis": LayerImport([]), "garden": garden}, mode="replace")
    assert [scope for scope, _, _ in store.scopes("alice")] == ["garden", "kitchen"]

    # `merge` keeps such a layer: three, refused, nothing written. The scopes held are read
    # by index.
    with captured_statements(database.engine) as captured, pytest.raises(MemoryFull) as refused:
        store.import_layers(
            "alice", {"kitchen": LayerImport([]), "shed": LayerImport([("notes", "x")])}
        )
    (held,) = [s for s in captured if "group by memory_entries.scope" in s.sql.lower()]
    assert table_scans(database.engine, [held]) == {}
    assert refused.value.details == {"max_scopes": 2, "scopes": 2}
    assert [scope for scope, _, _ in store.scopes("alice")] == ["garden", "kitchen"]


# --- config ----------------------------------------------------------------------------------


def test_max_scopes_defaults_to_1000_and_is_at_least_1(
    write_config: Callable[..., Any],
) -> None:
    default = MemoryConfig.model_validate({"scopes": {"validKeys": ["notes"]}})
    assert default.scopes is not None and default.scopes.max_scopes == 1000
    named = MemoryConfig.model_validate({"scopes": {"validKeys": ["notes"], "max_scopes": 7}})
    rules = MemoryRules.from_config(named)
    assert rules.scoped is not None and rules.scoped.max_scopes == 7
    assert rules.max_scopes is None  # the person's own layer is no scope

    path = write_config("memory:\n  scopes:\n    validKeys: [notes]\n    maxScopes: 0\n")
    with pytest.raises(ConfigError) as raised:
        load_config(path, environ={})
    assert str(raised.value) == (
        f"{path}: invalid config:\n"
        "  memory.scopes.maxScopes: Input should be greater than or equal to 1 (got 0)"
    )
