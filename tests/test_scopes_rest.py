"""Scopes over REST (CONTRACT section 23): `?scope=NAME` on every `/memory` route acts on that
scope's layer, under its keys and limits; without it, on the person's own. `GET /memory/scopes`,
export of everything and import back where each entry was, `DELETE /memory?scope=X` and
`DELETE /me`; a scope belongs to its user; a bad scope is 400 and changes nothing. On SQLite and
PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from starlette.testclient import TestClient

from kvmem.tokens import TokenCounter
from tests.support.apps import services
from tests.support.clock import Clock
from tests.support.matchers import ISO_TIME, entry

MakeClient = Callable[..., TestClient]
SERVICE_KEY = "svc-scopes-rest-7d1e"
KEYS_AUTH = {"mode": "keys", "service_keys": [SERVICE_KEY]}
OWN_KEYS = ["name", "city"]
SCOPED_KEYS = ["notes", "decisions"]
MEMORY = {
    "validKeys": OWN_KEYS,
    "tokenLimit": 100,
    "charLimit": 500,
    "scopes": {"validKeys": SCOPED_KEYS, "tokenLimit": 20, "charLimit": 150},
}


def as_user(user: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {SERVICE_KEY}", "X-User-Id": user}


ALICE, BOB = as_user("alice"), as_user("bob")


def error(code: str, message: str, **details: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, **details}}


def bad_request(message: str) -> dict[str, Any]:
    return error("bad_request", message)


NO_SCOPES = bad_request(
    "this server keeps no scopes (memory.scopes is not configured); send no scope"
)
INVALID_SCOPE = bad_request(
    "invalid scope: a scope is 1-128 characters of A-Z, a-z, 0-9 and . _ : @ / -"
)


def change(id: int, key: str, op: str, old: str | None, new: str | None, source: str = "manual"):
    return {
        "id": id,
        "key": key,
        "op": op,
        "old_value": old,
        "new_value": new,
        "source": source,
        "conversation_id": None,
        "at": ISO_TIME,
    }


@pytest.fixture
def client(make_client: MakeClient) -> TestClient:
    """A server keeping scopes, its users named by a service key."""
    return make_client(auth=KEYS_AUTH, memory=MEMORY)


def put(client: TestClient, key: str, value: str, scope: str | None = None, user=ALICE, **body):
    params = {"scope": scope} if scope is not None else None
    response = client.put(
        f"/memory/{key}", params=params, json={"value": value, **body}, headers=user
    )
    assert response.status_code in (200, 201), response.text
    return response.json()


def listed(client: TestClient, scope: str | None = None, user=ALICE) -> dict[str, str]:
    """The entries of one layer as {key: value}."""
    params = {"scope": scope} if scope is not None else None
    response = client.get("/memory", params=params, headers=user)
    assert response.status_code == 200, response.text
    return {memory["key"]: memory["value"] for memory in response.json()["memories"]}


def everything(client: TestClient, user=ALICE) -> dict[str | None, dict[str, str]]:
    """Every layer of the user, as GET /memory and GET /memory/scopes show them."""
    scopes = client.get("/memory/scopes", headers=user).json()["scopes"]
    layers: dict[str | None, dict[str, str]] = {None: listed(client, user=user)}
    for scope in scopes:
        layers[scope["scope"]] = listed(client, scope["scope"], user)
    return layers


def seed(client: TestClient, user=ALICE) -> None:
    put(client, "name", "Ada", user=user)
    put(client, "notes", "kitchen: oak worktops", "kitchen", user=user)
    put(client, "decisions", "tiles from Porto", "kitchen", user=user)
    put(client, "notes", "thesis: chapter 3 due", "thesis", user=user)


# --- one layer at a time ---------------------------------------------------------------------


def test_put_get_list_and_delete_act_on_the_named_scope(
    client: TestClient, tokens: TokenCounter
) -> None:
    put(client, "name", "Ada")
    value = "kitchen: oak worktops"
    count = tokens.count(value)

    created = client.put("/memory/notes?scope=kitchen", json={"value": value}, headers=ALICE)
    assert (created.status_code, created.json()) == (
        201,
        {
            "memory": entry("notes", value, count),
            "total_tokens": count,
            "token_limit": 20,
            "scope": "kitchen",
        },
    )
    listing = client.get("/memory?scope=kitchen", headers=ALICE)
    assert (listing.status_code, listing.json()) == (
        200,
        {
            "memories": [entry("notes", value, count)],
            "total_tokens": count,
            "token_limit": 20,
            "char_limit": 150,
            "usage_percentage": round(100 * count / 20, 1),
            "valid_keys": SCOPED_KEYS,
            "enabled": True,
            "scope": "kitchen",
        },
    )
    got = client.get("/memory/notes?scope=kitchen", headers=ALICE)
    assert (got.status_code, got.json()) == (
        200,
        {**entry("notes", value, count), "scope": "kitchen"},
    )

    # The person's own layer is as it was, and holds no scoped key.
    own = client.get("/memory", headers=ALICE).json()
    assert own == {
        "memories": [entry("name", "Ada", tokens.count("Ada"))],
        "total_tokens": tokens.count("Ada"),
        "token_limit": 100,
        "char_limit": 500,
        "usage_percentage": round(100 * tokens.count("Ada") / 100, 1),
        "valid_keys": OWN_KEYS,
        "enabled": True,
    }
    assert client.get("/memory/notes", headers=ALICE).json() == error(
        "not_found", "no memory with key 'notes'"
    )
    assert listed(client, "other") == {}

    assert client.delete("/memory/notes", headers=ALICE).status_code == 404  # not in own
    assert client.delete("/memory/notes?scope=other", headers=ALICE).status_code == 404
    assert client.delete("/memory/notes?scope=kitchen", headers=ALICE).status_code == 204
    assert listed(client, "kitchen") == {}
    assert listed(client) == {"name": "Ada"}


def test_the_same_key_in_two_scopes_is_two_entries(client: TestClient) -> None:
    seed(client)
    put(client, "notes", "kitchen: walnut after all", "kitchen")
    assert everything(client) == {
        None: {"name": "Ada"},
        "kitchen": {"notes": "kitchen: walnut after all", "decisions": "tiles from Porto"},
        "thesis": {"notes": "thesis: chapter 3 due"},
    }


def test_an_own_key_with_a_scope_and_a_scoped_key_without_are_refused(client: TestClient) -> None:
    seed(client)
    before = everything(client)

    own_in_scope = client.put("/memory/name?scope=kitchen", json={"value": "Bo"}, headers=ALICE)
    assert (own_in_scope.status_code, own_in_scope.json()) == (
        422,
        error(
            "key_not_allowed",
            "key 'name' is not allowed; valid keys: notes, decisions",
            valid_keys=SCOPED_KEYS,
        ),
    )
    scoped_in_own = client.put("/memory/notes", json={"value": "loose"}, headers=ALICE)
    assert (scoped_in_own.status_code, scoped_in_own.json()) == (
        422,
        error(
            "key_not_allowed",
            "key 'notes' is kept per scope: name the scope to write it "
            "(scoped keys: notes, decisions)",
            valid_keys=SCOPED_KEYS,
        ),
    )
    too_long = client.put("/memory/notes?scope=kitchen", json={"value": "x" * 151}, headers=ALICE)
    assert (too_long.status_code, too_long.json()["error"]["code"]) == (422, "value_too_long")
    assert everything(client) == before


def test_each_scope_has_its_own_token_limit(
    client: TestClient, make_value: Callable[[int], str]
) -> None:
    put(client, "name", make_value(50))  # the own layer's limit is 100
    put(client, "notes", make_value(15), "kitchen")
    put(client, "notes", make_value(20), "thesis")  # exactly up to the limit

    full = client.put(
        "/memory/decisions?scope=kitchen", json={"value": make_value(6)}, headers=ALICE
    )
    assert (full.status_code, full.json()) == (
        409,
        error(
            "memory_full",
            "storing 6 tokens would take scope 'kitchen' to 21 tokens, over the limit of 20",
            token_limit=20,
            total_tokens=15,
            requested_tokens=6,
        ),
    )
    assert listed(client, "kitchen") == {"notes": make_value(15)}


def test_include_expired_lists_one_scope(client: TestClient) -> None:
    clock = Clock()
    services(client).store.clock = clock
    put(client, "city", "Lisbon", expires_in="1h")
    put(client, "notes", "kitchen: call the plumber", "kitchen", expires_in="1h")
    put(client, "decisions", "tiles from Porto", "kitchen")
    clock.advance(hours=2)
    response = client.get("/memory?scope=kitchen&include_expired=true", headers=ALICE)
    assert response.status_code == 200
    body = response.json()
    assert body["scope"] == "kitchen"
    assert [(m["key"], m["expired"]) for m in body["memories"]] == [
        ("decisions", False),
        ("notes", True),
    ]


# --- GET /memory/scopes ----------------------------------------------------------------------


def test_memory_scopes_lists_the_scopes_that_hold_entries(
    client: TestClient, tokens: TokenCounter
) -> None:
    clock = Clock()
    services(client).store.clock = clock
    assert client.get("/memory/scopes", headers=ALICE).json() == {"scopes": []}
    seed(client)
    put(client, "notes", "for a while", "holiday", expires_in="1h")  # expires below
    put(client, "notes", "emptied again", "garden")
    assert client.delete("/memory/notes?scope=garden", headers=ALICE).status_code == 204
    put(client, "notes", "bob's kitchen", "kitchen", user=BOB)  # another user's, same name
    clock.advance(hours=2)

    kitchen = ["kitchen: oak worktops", "tiles from Porto"]
    response = client.get("/memory/scopes", headers=ALICE)
    assert (response.status_code, response.json()) == (
        200,
        {
            "scopes": [
                {
                    "scope": "kitchen",
                    "entries": 2,
                    "total_tokens": sum(tokens.count(value) for value in kitchen),
                },
                {
                    "scope": "thesis",
                    "entries": 1,
                    "total_tokens": tokens.count("thesis: chapter 3 due"),
                },
            ]
        },
    )


def test_scopes_is_a_reserved_key_and_lists_nothing_without_scopes(
    make_client: MakeClient,
) -> None:
    client = make_client()
    assert client.get("/memory/scopes").json() == {"scopes": []}
    refused = client.put("/memory/scopes", json={"value": "x"})
    assert (refused.status_code, refused.json()["error"]["code"]) == (422, "invalid_key")
    assert client.get("/memory").json()["memories"] == []


# --- a scope belongs to its user -------------------------------------------------------------


def test_another_users_scope_of_the_same_name_is_invisible(client: TestClient) -> None:
    seed(client)
    alices = everything(client)
    changes = client.get("/memory/history?scope=kitchen", headers=ALICE).json()["changes"]
    theirs = changes[0]["id"]

    assert listed(client, "kitchen", BOB) == {}
    assert client.get("/memory/scopes", headers=BOB).json() == {"scopes": []}
    assert client.get("/memory/notes?scope=kitchen", headers=BOB).status_code == 404
    assert client.get("/memory/history?scope=kitchen", headers=BOB).json() == {
        "changes": [],
        "next": None,
        "scope": "kitchen",
    }
    assert client.get("/memory/notes/history?scope=kitchen", headers=BOB).status_code == 404
    revert = client.post("/memory/decisions/revert?scope=kitchen", json={"to": theirs}, headers=BOB)
    assert revert.status_code == 404
    assert client.get("/memory/export?scope=kitchen", headers=BOB).json()["memories"] == []
    assert client.get("/memory/export", headers=BOB).json()["memories"] == []
    assert client.delete("/memory?scope=kitchen", headers=BOB).json() == {
        "deleted": 0,
        "scope": "kitchen",
    }
    assert client.delete("/memory/notes?scope=kitchen", headers=BOB).status_code == 404

    put(client, "notes", "bob's own kitchen", "kitchen", user=BOB)
    assert listed(client, "kitchen", BOB) == {"notes": "bob's own kitchen"}
    assert everything(client) == alices


# --- clearing --------------------------------------------------------------------------------


def test_delete_memory_with_a_scope_clears_that_scope_only(client: TestClient) -> None:
    seed(client)
    proposals = services(client).proposals
    proposals.propose("alice", "notes", "proposed for the kitchen", scope="kitchen")
    proposals.propose("alice", "notes", "proposed for the thesis", scope="thesis")

    response = client.delete("/memory?scope=kitchen", headers=ALICE)
    assert (response.status_code, response.json()) == (200, {"deleted": 2, "scope": "kitchen"})
    assert everything(client) == {
        None: {"name": "Ada"},
        "thesis": {"notes": "thesis: chapter 3 due"},
    }
    # Its history and proposals went with it; the others' stayed.
    assert client.get("/memory/history?scope=kitchen", headers=ALICE).json()["changes"] == []
    assert client.get("/memory/proposals?scope=kitchen", headers=ALICE).json()["proposals"] == []
    assert len(client.get("/memory/history?scope=thesis", headers=ALICE).json()["changes"]) == 1
    assert len(client.get("/memory/history", headers=ALICE).json()["changes"]) == 1
    thesis = client.get("/memory/proposals?scope=thesis", headers=ALICE).json()["proposals"]
    assert [p["value"] for p in thesis] == ["proposed for the thesis"]

    # Without a scope: the person's own entries only.
    assert client.delete("/memory", headers=ALICE).json() == {"deleted": 1}
    assert everything(client) == {None: {}, "thesis": {"notes": "thesis: chapter 3 due"}}


def test_delete_me_erases_every_layer(client: TestClient) -> None:
    seed(client)
    seed(client, BOB)
    services(client).proposals.propose("alice", "notes", "pending", scope="kitchen")
    bobs = everything(client, BOB)

    response = client.delete("/me", headers=ALICE)
    assert response.status_code == 200
    assert response.json()["deleted"]["memories"] == 4
    assert response.json()["deleted"]["changes"] == 4
    assert everything(client) == {None: {}}
    for scope in ("kitchen", "thesis"):
        assert client.get(f"/memory/history?scope={scope}", headers=ALICE).json()["changes"] == []
    assert client.get("/memory/proposals?scope=kitchen", headers=ALICE).json()["proposals"] == []
    assert everything(client, BOB) == bobs


# --- history and revert ----------------------------------------------------------------------


def test_history_and_revert_per_scope(client: TestClient, tokens: TokenCounter) -> None:
    put(client, "name", "Ada")  # change 1, own
    put(client, "notes", "oak", "kitchen")  # 2
    put(client, "notes", "chapter 3", "thesis")  # 3
    put(client, "notes", "walnut", "kitchen")  # 4
    ids = [c["id"] for c in client.get("/memory/history", headers=ALICE).json()["changes"]]
    kitchen = client.get("/memory/history?scope=kitchen", headers=ALICE)
    assert kitchen.status_code == 200
    first, second = sorted(c["id"] for c in kitchen.json()["changes"])
    assert kitchen.json() == {
        "changes": [
            change(second, "notes", "set", "oak", "walnut"),
            change(first, "notes", "set", None, "oak"),
        ],
        "next": None,
        "scope": "kitchen",
    }
    assert len(ids) == 1  # the own layer's history holds the own change only
    paged = client.get("/memory/history?scope=kitchen&limit=1", headers=ALICE).json()
    assert paged == {
        "changes": [change(second, "notes", "set", "oak", "walnut")],
        "next": second,
        "scope": "kitchen",
    }
    keyed = client.get("/memory/history?scope=kitchen&key=notes", headers=ALICE).json()
    assert keyed["changes"] == kitchen.json()["changes"]
    per_key = client.get("/memory/notes/history?scope=thesis", headers=ALICE)
    assert (per_key.status_code, [c["new_value"] for c in per_key.json()["changes"]]) == (
        200,
        ["chapter 3"],
    )
    assert per_key.json()["scope"] == "thesis"
    assert client.get("/memory/notes/history", headers=ALICE).status_code == 404  # not in own

    # Revert works within the change's own layer; from another layer the change is unknown.
    for wrong in ("", "?scope=thesis"):
        refused = client.post(f"/memory/notes/revert{wrong}", json={"to": first}, headers=ALICE)
        assert (refused.status_code, refused.json()) == (
            404,
            error("not_found", f"no change {first} of key 'notes'"),
        )
    reverted = client.post("/memory/notes/revert?scope=kitchen", json={"to": first}, headers=ALICE)
    assert (reverted.status_code, reverted.json()) == (
        200,
        {
            "memory": entry("notes", "oak", tokens.count("oak"), "revert"),
            "total_tokens": tokens.count("oak"),
            "token_limit": 20,
            "scope": "kitchen",
        },
    )
    assert everything(client) == {
        None: {"name": "Ada"},
        "kitchen": {"notes": "oak"},
        "thesis": {"notes": "chapter 3"},
    }


def test_delete_history_with_a_scope_erases_that_scopes_history_only(client: TestClient) -> None:
    seed(client)
    response = client.delete("/memory/history?scope=kitchen", headers=ALICE)
    assert (response.status_code, response.json()) == (200, {"deleted": 2, "scope": "kitchen"})
    assert client.get("/memory/history?scope=kitchen", headers=ALICE).json()["changes"] == []
    assert len(client.get("/memory/history?scope=thesis", headers=ALICE).json()["changes"]) == 1
    assert len(client.get("/memory/history", headers=ALICE).json()["changes"]) == 1
    assert client.delete("/memory/history", headers=ALICE).json() == {"deleted": 1}
    assert len(client.get("/memory/history?scope=thesis", headers=ALICE).json()["changes"]) == 1
    assert listed(client, "kitchen") == {
        "notes": "kitchen: oak worktops",
        "decisions": "tiles from Porto",
    }


# --- export and import -----------------------------------------------------------------------


def test_export_then_import_into_a_fresh_user_restores_every_scope(client: TestClient) -> None:
    seed(client)
    put(client, "city", "Lisbon", expires_in="3d")
    exported = client.get("/memory/export", headers=ALICE)
    assert exported.status_code == 200
    document = exported.json()
    assert [(m["scope"], m["key"]) for m in document["memories"]] == [
        (None, "name"),
        (None, "city"),
        ("kitchen", "notes"),
        ("kitchen", "decisions"),
        ("thesis", "notes"),
    ]
    assert document["memories"][1]["expires_at"] is not None

    imported = client.post("/memory/import", json=document, headers=BOB)
    assert imported.status_code == 200, imported.text
    own = client.get("/memory", headers=BOB).json()["total_tokens"]
    scopes = client.get("/memory/scopes", headers=BOB).json()["scopes"]
    assert imported.json() == {
        "imported": 2,
        "deleted": 0,
        "total_tokens": own,
        "token_limit": 100,
        "scopes": [
            {
                "scope": "kitchen",
                "imported": 2,
                "deleted": 0,
                "total_tokens": scopes[0]["total_tokens"],
                "token_limit": 20,
            },
            {
                "scope": "thesis",
                "imported": 1,
                "deleted": 0,
                "total_tokens": scopes[1]["total_tokens"],
                "token_limit": 20,
            },
        ],
    }
    assert everything(client, BOB) == everything(client)
    assert (
        client.get("/memory/scopes", headers=BOB).json()
        == client.get("/memory/scopes", headers=ALICE).json()
    )
    bobs_city = client.get("/memory/city", headers=BOB).json()
    assert bobs_city["expires_at"] == document["memories"][1]["expires_at"]
    history = client.get("/memory/history?scope=kitchen", headers=BOB).json()["changes"]
    assert {(c["key"], c["source"]) for c in history} == {
        ("notes", "import"),
        ("decisions", "import"),
    }


def test_export_with_a_scope_holds_that_scope_only(
    client: TestClient, tokens: TokenCounter
) -> None:
    seed(client)
    response = client.get("/memory/export?scope=thesis", headers=ALICE)
    assert response.status_code == 200
    assert response.json() == {
        "format": "kvmem.memory.v1",
        "user": "alice",
        "exported_at": ISO_TIME,
        "preferences": {"memories": True},
        "memories": [
            {
                **entry("notes", "thesis: chapter 3 due", tokens.count("thesis: chapter 3 due")),
                "scope": "thesis",
            }
        ],
    }


def test_import_with_a_scope_puts_every_entry_there(client: TestClient) -> None:
    seed(client)
    document = client.get("/memory/export?scope=kitchen", headers=ALICE).json()
    moved = client.post(
        "/memory/import?scope=garden",
        json={
            "memories": [
                {"key": "notes", "value": "garden: plant tomatoes"},
            ]
        },
        headers=ALICE,
    )
    assert (moved.status_code, moved.json()["scope"], moved.json()["imported"]) == (
        200,
        "garden",
        1,
    )
    assert "scopes" not in moved.json()
    again = client.post("/memory/import?scope=kitchen", json=document, headers=BOB)
    assert (again.status_code, again.json()["token_limit"]) == (200, 20)
    assert everything(client, BOB) == {
        None: {},
        "kitchen": {"notes": "kitchen: oak worktops", "decisions": "tiles from Porto"},
    }

    # A document entry naming another scope than the import's is refused: nothing changes.
    before = everything(client)
    refused = client.post("/memory/import?scope=thesis", json=document, headers=ALICE)
    assert (refused.status_code, refused.json()) == (
        400,
        bad_request(
            "memories[0] belongs to scope 'kitchen', not to 'thesis', the scope this import names"
        ),
    )
    assert everything(client) == before


def test_an_import_is_all_or_nothing_across_layers(
    client: TestClient, make_value: Callable[[int], str]
) -> None:
    seed(client)
    before = everything(client)
    history = client.get("/memory/history?scope=kitchen", headers=ALICE).json()
    for document, status, code in [
        (  # the scope's entries over its limit, the own entry fine
            {
                "memories": [
                    {"key": "name", "value": "Grace"},
                    {"key": "notes", "value": make_value(21), "scope": "kitchen"},
                ]
            },
            409,
            "memory_full",
        ),
        (  # an own key placed in a scope
            {
                "memories": [
                    {"key": "notes", "value": "fine", "scope": "thesis"},
                    {"key": "name", "value": "Grace", "scope": "thesis"},
                ]
            },
            422,
            "key_not_allowed",
        ),
        (  # a scoped key in the own layer
            {"memories": [{"key": "name", "value": "Grace"}, {"key": "notes", "value": "x"}]},
            422,
            "key_not_allowed",
        ),
        (  # a malformed scope
            {
                "memories": [
                    {"key": "name", "value": "Grace"},
                    {"key": "notes", "value": "x", "scope": "a b"},
                ]
            },
            400,
            "bad_request",
        ),
    ]:
        for mode in ("merge", "replace"):
            refused = client.post(f"/memory/import?mode={mode}", json=document, headers=ALICE)
            assert (refused.status_code, refused.json()["error"]["code"]) == (status, code)
            assert everything(client) == before
    assert client.get("/memory/history?scope=kitchen", headers=ALICE).json() == history


def test_import_replace_replaces_the_own_layer_and_the_scopes_it_names(client: TestClient) -> None:
    seed(client)
    document = {
        "memories": [
            {"key": "city", "value": "Porto", "scope": None},
            {"key": "decisions", "value": "tiles from Lisbon", "scope": "kitchen"},
        ]
    }
    response = client.post("/memory/import?mode=replace", json=document, headers=ALICE)
    assert response.status_code == 200
    body = response.json()
    assert (body["imported"], body["deleted"]) == (1, 1)
    assert [(s["scope"], s["imported"], s["deleted"]) for s in body["scopes"]] == [
        ("kitchen", 1, 1)
    ]
    assert everything(client) == {
        None: {"city": "Porto"},
        "kitchen": {"decisions": "tiles from Lisbon"},
        "thesis": {"notes": "thesis: chapter 3 due"},  # not named: untouched
    }


# --- proposals -------------------------------------------------------------------------------


def test_proposals_per_scope(make_client: MakeClient, tokens: TokenCounter) -> None:
    client = make_client(auth=KEYS_AUTH, memory={**MEMORY, "review": "on"})
    proposals = services(client).proposals
    own = proposals.propose("alice", "name", "Ada")
    kitchen = proposals.propose("alice", "notes", "oak", scope="kitchen")
    thesis = proposals.propose("alice", "notes", "chapter 3", scope="thesis")
    proposals.propose("alice", "decisions", "walnut", scope="thesis")
    proposals.propose("bob", "notes", "bob's", scope="kitchen")

    listing = client.get("/memory/proposals?scope=kitchen", headers=ALICE)
    assert (listing.status_code, listing.json()) == (
        200,
        {
            "proposals": [
                {
                    "id": kitchen.id,
                    "key": "notes",
                    "op": "set",
                    "value": "oak",
                    "conversation_id": None,
                    "created_at": ISO_TIME,
                    "expires_at": None,
                }
            ],
            "scope": "kitchen",
        },
    )
    assert [
        p["id"] for p in client.get("/memory/proposals", headers=ALICE).json()["proposals"]
    ] == [own.id]

    # An id of another layer is unknown here.
    for path in (
        f"/memory/proposals/{kitchen.id}/accept",
        f"/memory/proposals/{kitchen.id}/reject",
    ):
        for wrong in ("", "?scope=thesis"):
            refused = client.post(path + wrong, headers=ALICE)
            assert (refused.status_code, refused.json()) == (
                404,
                error("not_found", f"no pending proposal {kitchen.id}"),
            )
    accepted = client.post(f"/memory/proposals/{kitchen.id}/accept?scope=kitchen", headers=ALICE)
    assert (accepted.status_code, accepted.json()) == (
        200,
        {
            "memory": entry("notes", "oak", tokens.count("oak"), "agent"),
            "total_tokens": tokens.count("oak"),
            "token_limit": 20,
            "scope": "kitchen",
        },
    )
    rejected = client.post(f"/memory/proposals/{thesis.id}/reject?scope=thesis", headers=ALICE)
    assert rejected.status_code == 204
    assert client.delete("/memory/proposals?scope=thesis", headers=ALICE).json() == {
        "rejected": 1,
        "scope": "thesis",
    }
    assert everything(client) == {None: {}, "kitchen": {"notes": "oak"}}
    assert [
        p["id"] for p in client.get("/memory/proposals", headers=ALICE).json()["proposals"]
    ] == [own.id]
    bobs = client.get("/memory/proposals?scope=kitchen", headers=BOB).json()["proposals"]
    assert [p["value"] for p in bobs] == ["bob's"]


# --- a bad scope -----------------------------------------------------------------------------

ROUTES = [
    ("GET", "/memory", None),
    ("DELETE", "/memory", None),
    ("GET", "/memory/notes", None),
    ("PUT", "/memory/notes", {"value": "changed"}),
    ("DELETE", "/memory/notes", None),
    ("GET", "/memory/history", None),
    ("DELETE", "/memory/history", None),
    ("GET", "/memory/notes/history", None),
    ("POST", "/memory/notes/revert", {"to": 1}),
    ("GET", "/memory/export", None),
    ("POST", "/memory/import", {"memories": [{"key": "notes", "value": "changed"}]}),
    ("GET", "/memory/proposals", None),
    ("DELETE", "/memory/proposals", None),
    ("POST", "/memory/proposals/1/accept", None),
    ("POST", "/memory/proposals/1/reject", None),
]


def state(client: TestClient) -> Any:
    """Everything of alice's that a bad request might change."""
    layers = everything(client)
    history = {
        scope: client.get(
            "/memory/history", params={"scope": scope} if scope else None, headers=ALICE
        ).json()
        for scope in layers
    }
    proposals = {
        scope: client.get(
            "/memory/proposals", params={"scope": scope} if scope else None, headers=ALICE
        ).json()
        for scope in layers
    }
    return layers, history, proposals


@pytest.mark.parametrize(("method", "path", "body"), ROUTES)
def test_a_bad_scope_is_400_and_changes_nothing(
    client: TestClient, method: str, path: str, body: Any
) -> None:
    seed(client)
    services(client).proposals.propose("alice", "notes", "pending", scope="kitchen")
    before = state(client)
    for scope in ("", "kitchen sink", "k" * 129, "küche", "a\\b"):
        response = client.request(method, path, params={"scope": scope}, json=body, headers=ALICE)
        assert (response.status_code, response.json()) == (400, INVALID_SCOPE), (scope, path)
    assert state(client) == before


@pytest.mark.parametrize(("method", "path", "body"), ROUTES)
def test_naming_a_scope_on_a_server_without_scopes_is_400(
    make_client: MakeClient, method: str, path: str, body: Any
) -> None:
    client = make_client(memory={"review": "on"})
    client.put("/memory/notes", json={"value": "kept"})
    services(client).proposals.propose("local", "notes", "pending")
    before = (client.get("/memory").json(), client.get("/memory/history").json())
    response = client.request(method, path, params={"scope": "kitchen"}, json=body)
    assert (response.status_code, response.json()) == (400, NO_SCOPES)
    assert (client.get("/memory").json(), client.get("/memory/history").json()) == before
    assert len(client.get("/memory/proposals").json()["proposals"]) == 1


def test_a_scope_may_use_every_allowed_character(client: TestClient) -> None:
    scope = "model:openai/gpt-4o.mini_@team-" + "x" * 97
    assert len(scope) == 128
    put(client, "notes", "long name", scope)
    assert client.get("/memory/scopes", headers=ALICE).json()["scopes"][0]["scope"] == scope
    assert listed(client, scope) == {"notes": "long name"}


def test_an_import_error_names_the_entry_by_its_place_in_the_document(
    client: TestClient,
) -> None:
    """The entries of one document go to several layers; the error still names the entry as
    the file holds it (its index there) and the scope it was for."""
    document = {
        "memories": [
            {"key": "name", "value": "Ada"},
            {"key": "city", "value": "Lisbon", "scope": None},
            {"key": "notes", "value": "   ", "scope": "kitchen"},
        ]
    }
    refused = client.post("/memory/import", json=document, headers=ALICE)
    assert (refused.status_code, refused.json()) == (
        422,
        error(
            "empty_value",
            "memories[2] (key 'notes', scope 'kitchen'): the value is empty",
            key="notes",
        ),
    )
    assert everything(client) == {None: {}}
