"""CONTRACT section 10: the history of every change, revert, export/import over REST, erasure
(`DELETE /me`) and retention, through the HTTP API on both backends."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, insert, select
from starlette.testclient import TestClient

from kvmem.config_loader import load_config
from kvmem.db.engine import Database
from kvmem.db.tables import (
    AgentRunRecord,
    Base,
    Conversation,
    MemoryChange,
    MemoryProposal,
    Message,
    UserSession,
)
from kvmem.entries import utcnow
from kvmem.errors import ConfigError
from kvmem.server.credentials import KeyStore
from tests.support.apps import (
    AGENT_MODEL,
    MAIN_MODEL,
    set_memory,
    wait_agents_idle,
    wait_until,
)
from tests.support.matchers import ISO_TIME, entry
from tests.support.upstream import Reply

MakeClient = Callable[..., TestClient]
MakeValue = Callable[[int], str]
KEYS_AUTH = {"mode": "keys", "service_keys": ["svc-history-2c41"]}


def change(
    id: int,
    key: str,
    op: str,
    old: str | None,
    new: str | None,
    source: str = "manual",
    conversation_id: str | None = None,
) -> dict[str, Any]:
    """A change as the API shows it, with any time."""
    return {
        "id": id,
        "key": key,
        "op": op,
        "old_value": old,
        "new_value": new,
        "source": source,
        "conversation_id": conversation_id,
        "at": ISO_TIME,
    }


def ids_of(client: TestClient, **params: Any) -> list[int]:
    """The ids of the user's changes, newest first (and checked to be newest first)."""
    changes = client.get("/memory/history", params={"limit": 500, **params}).json()["changes"]
    ids = [c["id"] for c in changes]
    assert ids == sorted(ids, reverse=True)
    return ids


def error(code: str, message: str, **details: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, **details}}


def state(client: TestClient) -> tuple[Any, Any]:
    """Everything a refused request must leave as it was: the listing and the history."""
    return client.get("/memory").json(), client.get("/memory/history").json()


# --- recording ------------------------------------------------------------------------------


def test_every_rest_write_is_recorded_newest_first(make_client: MakeClient) -> None:
    client = make_client()
    client.put("/memory/likes", json={"value": "tea"})
    client.put("/memory/likes", json={"value": "coffee"})
    client.put("/memory/job", json={"value": "baker"})
    assert client.delete("/memory/likes").status_code == 204
    ids = ids_of(client)
    assert len(ids) == 4
    response = client.get("/memory/history")
    assert (response.status_code, response.json()) == (
        200,
        {
            "changes": [
                change(ids[0], "likes", "delete", "coffee", None),
                change(ids[1], "job", "set", None, "baker"),
                change(ids[2], "likes", "set", "tea", "coffee"),
                change(ids[3], "likes", "set", None, "tea"),
            ],
            "next": None,
        },
    )


def test_a_set_that_does_not_change_the_value_records_nothing(make_client: MakeClient) -> None:
    """...and changes nothing else either: `updated_at` and `source` stay as they were."""
    client = make_client()
    first = client.put("/memory/likes", json={"value": "tea"}).json()["memory"]
    again = client.put("/memory/likes", json={"value": "  tea  "})
    assert (again.status_code, again.json()) == (
        200,
        {"memory": first, "total_tokens": 1, "token_limit": None},
    )
    assert client.post(
        "/memory/import", json={"memories": [{"key": "likes", "value": "tea"}]}
    ).json() == {"imported": 1, "deleted": 0, "total_tokens": 1, "token_limit": None}
    assert client.get("/memory/likes").json() == first
    assert len(ids_of(client)) == 1


def test_agent_writes_name_the_chat_conversation(
    upstream: Any, chat_sections: Callable[..., dict[str, Any]], make_client: MakeClient
) -> None:
    client = make_client(**chat_sections())
    upstream.script(MAIN_MODEL, Reply(content="Noted."))
    upstream.script(AGENT_MODEL, Reply(content=None, tool_calls=[set_memory("name", "Ada")]))
    reply = client.post("/chat", json={"message": "Remember my name is Ada."}).json()
    wait_agents_idle(client)
    [only] = ids_of(client)
    assert client.get("/memory/history").json() == {
        "changes": [change(only, "name", "set", None, "Ada", "agent", reply["conversation_id"])],
        "next": None,
    }


def test_agent_writes_name_the_x_conversation_id_of_a_completion(
    upstream: Any, chat_sections: Callable[..., dict[str, Any]], make_client: MakeClient
) -> None:
    client = make_client(**chat_sections())
    upstream.script(MAIN_MODEL, Reply(content="Noted."), Reply(content="Noted."))
    upstream.script(
        AGENT_MODEL,
        Reply(content=None, tool_calls=[set_memory("name", "Ada")]),
        Reply(content=None, tool_calls=[set_memory("name", "Ada L.")]),
    )
    body = {"model": f"openai/{MAIN_MODEL}", "messages": [{"role": "user", "content": "I am Ada"}]}
    headers = {"X-Conversation-Id": "lc-convo 42/a"}
    assert client.post("/v1/chat/completions", json=body, headers=headers).status_code == 200
    wait_agents_idle(client)
    assert client.post("/v1/chat/completions", json=body).status_code == 200  # no header: null
    wait_agents_idle(client)
    newest, oldest = ids_of(client)
    assert client.get("/memory/history").json()["changes"] == [
        change(newest, "name", "set", "Ada", "Ada L.", "agent", None),
        change(oldest, "name", "set", None, "Ada", "agent", "lc-convo 42/a"),
    ]


@pytest.mark.parametrize("conversation_id", ["x" * 201, "caf\u00e9", "tab\there"])
def test_a_malformed_x_conversation_id_is_refused(
    upstream: Any,
    chat_sections: Callable[..., dict[str, Any]],
    make_client: MakeClient,
    conversation_id: str,
) -> None:
    client = make_client(**chat_sections())
    body = {"model": f"openai/{MAIN_MODEL}", "messages": [{"role": "user", "content": "hi"}]}
    response = client.post(
        "/v1/chat/completions",
        json=body,
        headers={"X-Conversation-Id": conversation_id.encode("utf-8")},
    )
    assert (response.status_code, response.json()) == (
        400,
        {
            "error": {
                "code": "bad_request",
                "message": "invalid conversation id: use 1-200 printable ASCII characters",
                "type": "invalid_request_error",
                "param": None,
            }
        },
    )
    assert upstream.received(MAIN_MODEL) == []


# --- reading --------------------------------------------------------------------------------


def test_history_pages_by_id(make_client: MakeClient) -> None:
    client = make_client()
    for n in range(5):
        client.put("/memory/counter", json={"value": f"v{n}"})
    client.put("/memory/other", json={"value": "x"})
    ids = ids_of(client)
    first = client.get("/memory/history", params={"limit": 2}).json()
    assert first == {
        "changes": [
            change(ids[0], "other", "set", None, "x"),
            change(ids[1], "counter", "set", "v3", "v4"),
        ],
        "next": ids[1],
    }
    second = client.get("/memory/history", params={"limit": 2, "before": first["next"]}).json()
    assert [c["id"] for c in second["changes"]] == ids[2:4]
    assert second["next"] == ids[3]
    last = client.get("/memory/history", params={"limit": 2, "before": second["next"]}).json()
    assert last == {
        "changes": [
            change(ids[4], "counter", "set", "v0", "v1"),
            change(ids[5], "counter", "set", None, "v0"),
        ],
        "next": None,
    }
    # One key only.
    counter = client.get("/memory/history", params={"key": "counter", "limit": 4}).json()
    assert [c["id"] for c in counter["changes"]] == ids[1:5]
    assert counter["next"] == ids[4]


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("limit=0", "limit must be an integer from 1 to 500, not 0"),
        ("limit=501", "limit must be an integer from 1 to 500, not 501"),
        ("limit=ten", "limit must be an integer from 1 to 500, not 'ten'"),
        ("limit=-1", "limit must be an integer from 1 to 500, not '-1'"),
        ("before=1.5", "before must be an integer from 1 to 9223372036854775807, not '1.5'"),
        ("before=", "before must be an integer from 1 to 9223372036854775807, not ''"),
        ("before=0", "before must be an integer from 1 to 9223372036854775807, not 0"),
    ],
)
def test_bad_paging_parameters_are_400(make_client: MakeClient, query: str, message: str) -> None:
    client = make_client()
    response = client.get(f"/memory/history?{query}")
    assert (response.status_code, response.json()) == (400, error("bad_request", message))


def test_key_history_pages_by_id_as_the_history_does(make_client: MakeClient) -> None:
    client = make_client()
    for n in range(3):
        client.put("/memory/counter", json={"value": f"v{n}"})
    client.put("/memory/other", json={"value": "x"})
    client.delete("/memory/counter")
    ids = ids_of(client, key="counter")
    first = client.get("/memory/counter/history", params={"limit": 2}).json()
    assert first == {
        "changes": [
            change(ids[0], "counter", "delete", "v2", None),
            change(ids[1], "counter", "set", "v1", "v2"),
        ],
        "next": ids[1],
    }
    last = client.get("/memory/counter/history", params={"limit": 2, "before": ids[1]}).json()
    assert last == {
        "changes": [
            change(ids[2], "counter", "set", "v0", "v1"),
            change(ids[3], "counter", "set", None, "v0"),
        ],
        "next": None,
    }
    # Past the last page of a key that has changes: an empty page, not a 404.
    past = client.get("/memory/counter/history", params={"before": ids[3]})
    assert (past.status_code, past.json()) == (200, {"changes": [], "next": None})
    missing = client.get("/memory/never/history", params={"before": ids[3]})
    assert (missing.status_code, missing.json()) == (
        404,
        error("not_found", "no memory and no history with key 'never'"),
    )


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("limit=0", "limit must be an integer from 1 to 500, not 0"),
        ("limit=501", "limit must be an integer from 1 to 500, not 501"),
        ("before=x", "before must be an integer from 1 to 9223372036854775807, not 'x'"),
    ],
)
def test_bad_paging_parameters_of_key_history_are_400(
    make_client: MakeClient, query: str, message: str
) -> None:
    client = make_client()
    client.put("/memory/likes", json={"value": "tea"})
    response = client.get(f"/memory/likes/history?{query}")
    assert (response.status_code, response.json()) == (400, error("bad_request", message))


def test_a_huge_before_reads_from_the_newest(make_client: MakeClient) -> None:
    client = make_client()
    client.put("/memory/likes", json={"value": "tea"})
    body = client.get("/memory/history", params={"before": 2**63 - 1}).json()
    assert [c["new_value"] for c in body["changes"]] == ["tea"]


def test_key_history_outlives_the_entry(make_client: MakeClient) -> None:
    client = make_client()
    client.put("/memory/likes", json={"value": "tea"})
    client.put("/memory/job", json={"value": "baker"})
    client.delete("/memory/likes")
    ids = ids_of(client, key="likes")
    response = client.get("/memory/likes/history")
    assert (response.status_code, response.json()) == (
        200,
        {
            "changes": [
                change(ids[0], "likes", "delete", "tea", None),
                change(ids[1], "likes", "set", None, "tea"),
            ],
            "next": None,
        },
    )
    missing = client.get("/memory/never/history")
    assert (missing.status_code, missing.json()) == (
        404,
        error("not_found", "no memory and no history with key 'never'"),
    )
    bad = client.get("/memory/Bad/history")
    assert bad.status_code == 422
    assert bad.json()["error"]["code"] == "invalid_key"
    assert client.get("/memory/history?key=Bad").json()["error"]["code"] == "invalid_key"


def test_key_history_of_an_entry_without_changes_is_empty(make_client: MakeClient) -> None:
    client = make_client(memory={"history": {"keep_days": 0}})
    client.put("/memory/likes", json={"value": "tea"})
    response = client.get("/memory/likes/history")
    assert (response.status_code, response.json()) == (200, {"changes": [], "next": None})


def test_reserved_keys_keep_the_fixed_paths(make_client: MakeClient) -> None:
    client = make_client()
    for key in ("history", "export"):
        response = client.put(f"/memory/{key}", json={"value": "x"})
        assert (response.status_code, response.json()["error"]["code"]) == (422, "invalid_key")
    assert client.get("/memory/export").json()["format"] == "kvmem.memory.v1"
    assert client.get("/memory/history").json() == {"changes": [], "next": None}
    # A key that only names a POST route elsewhere is an ordinary key.
    assert client.put("/memory/import", json={"value": "x"}).status_code == 201
    assert client.get("/memory/import").json() == entry("import", "x", 1)


# --- revert ---------------------------------------------------------------------------------


def test_revert_sets_the_value_after_a_change_back(make_client: MakeClient) -> None:
    client = make_client(memory={"tokenLimit": 100})
    client.put("/memory/likes", json={"value": "tea"})
    client.put("/memory/likes", json={"value": "coffee"})
    [to_coffee, to_tea] = ids_of(client)
    response = client.post("/memory/likes/revert", json={"to": to_tea})
    assert (response.status_code, response.json()) == (
        200,
        {"memory": entry("likes", "tea", 1, "revert"), "total_tokens": 1, "token_limit": 100},
    )
    newest = ids_of(client)[0]
    assert client.get("/memory/likes/history").json()["changes"][0] == change(
        newest, "likes", "set", "coffee", "tea", "revert"
    )
    # Reverting to the value the key has records nothing.
    again = client.post("/memory/likes/revert", json={"to": to_tea})
    assert (again.status_code, again.json()["memory"]["value"]) == (200, "tea")
    assert ids_of(client)[0] == newest
    assert to_coffee < newest


def test_revert_to_a_delete_deletes_and_undoes_a_delete(make_client: MakeClient) -> None:
    client = make_client()
    client.put("/memory/likes", json={"value": "tea"})
    client.delete("/memory/likes")
    [deleted, created] = ids_of(client)
    undo = client.post("/memory/likes/revert", json={"to": created})
    assert (undo.status_code, undo.json()) == (
        200,
        {"memory": entry("likes", "tea", 1, "revert"), "total_tokens": 1, "token_limit": None},
    )
    redo = client.post("/memory/likes/revert", json={"to": deleted})
    assert (redo.status_code, redo.json()) == (
        200,
        {"memory": None, "total_tokens": 0, "token_limit": None},
    )
    assert client.get("/memory/likes").status_code == 404
    newest = ids_of(client)[0]
    assert client.get("/memory/history").json()["changes"][0] == change(
        newest, "likes", "delete", "tea", None, "revert"
    )
    # The key is already gone: reverting to a delete again changes nothing.
    assert client.post("/memory/likes/revert", json={"to": deleted}).json() == redo.json()
    assert ids_of(client)[0] == newest


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"to": "1"}, "invalid request body: to: Input should be a valid integer"),
        ({"to": 1.5}, "invalid request body: to: Input should be a valid integer"),
        ({"to": True}, "invalid request body: to: Input should be a valid integer"),
        ({"to": None}, "invalid request body: to: Input should be a valid integer"),
        ({}, "invalid request body: to: Field required"),
        (
            [1],
            "invalid request body: body: Input should be a valid dictionary or instance of RevertBody",
        ),
    ],
)
def test_revert_to_a_non_integer_is_400(make_client: MakeClient, body: Any, message: str) -> None:
    client = make_client()
    client.put("/memory/likes", json={"value": "tea"})
    before = state(client)
    response = client.post("/memory/likes/revert", json=body)
    assert (response.status_code, response.json()) == (400, error("bad_request", message))
    assert state(client) == before


def test_revert_to_another_keys_or_a_missing_change_is_404(make_client: MakeClient) -> None:
    client = make_client()
    client.put("/memory/likes", json={"value": "tea"})
    client.put("/memory/job", json={"value": "baker"})
    [job, likes] = ids_of(client)
    before = state(client)
    for to in (job, job + 1000, 0, -1, 2**31, 2**63 - 1):
        response = client.post("/memory/likes/revert", json={"to": to})
        assert (response.status_code, response.json()) == (
            404,
            error("not_found", f"no change {to} of key 'likes'"),
        )
    # Past 64 bits no body holds an integer (issue 22): a bad request, not a missing change.
    response = client.post("/memory/likes/revert", json={"to": 2**70})
    assert (response.status_code, response.json()) == (
        400,
        error(
            "bad_request",
            "the JSON body holds an integer outside the signed 64-bit range (1180591620717411303424)",
        ),
    )
    assert client.post("/memory/never/revert", json={"to": likes}).status_code == 404
    assert state(client) == before


def test_revert_to_another_users_change_is_404(make_client: MakeClient, database: Database) -> None:
    client = make_client(auth=KEYS_AUTH)
    keys = KeyStore(database)
    alice = {"Authorization": f"Bearer {keys.create('alice')[1]}"}
    bob = {"Authorization": f"Bearer {keys.create('bob')[1]}"}
    client.put("/memory/likes", json={"value": "alice's tea"}, headers=alice)
    client.put("/memory/likes", json={"value": "alice's coffee"}, headers=alice)
    client.put("/memory/likes", json={"value": "bob's tea"}, headers=bob)
    alices = [c["id"] for c in client.get("/memory/history", headers=alice).json()["changes"]]
    response = client.post("/memory/likes/revert", json={"to": alices[1]}, headers=bob)
    assert (response.status_code, response.json()) == (
        404,
        error("not_found", f"no change {alices[1]} of key 'likes'"),
    )
    assert client.get("/memory/likes", headers=bob).json()["value"] == "bob's tea"
    assert client.get("/memory/likes", headers=alice).json()["value"] == "alice's coffee"


def test_revert_applies_every_write_rule(make_client: MakeClient, make_value: MakeValue) -> None:
    lenient = make_client(memory={"tokenLimit": 100})
    lenient.put("/memory/likes", json={"value": make_value(8)})
    lenient.put("/memory/likes", json={"value": "tea"})
    lenient.put("/memory/job", json={"value": make_value(4)})
    tea, eight = ids_of(lenient, key="likes")
    # The rules as they are now apply, not those of the time of the change.
    full = make_client(memory={"tokenLimit": 10})
    response = full.post("/memory/likes/revert", json={"to": eight})
    assert (response.status_code, response.json()) == (
        409,
        error(
            "memory_full",
            "storing 8 tokens would take memory to 12 tokens, over the limit of 10",
            token_limit=10,
            total_tokens=5,
            requested_tokens=8,
        ),
    )
    short = make_client(memory={"charLimit": 5})
    assert (
        short.post("/memory/likes/revert", json={"to": eight}).json()["error"]["code"]
        == "value_too_long"
    )
    allowed = make_client(memory={"validKeys": ["job"]})
    response = allowed.post("/memory/likes/revert", json={"to": tea})
    assert (response.status_code, response.json()) == (
        422,
        error("key_not_allowed", "key 'likes' is not allowed; valid keys: job", valid_keys=["job"]),
    )
    assert lenient.get("/memory/likes").json()["value"] == "tea"
    assert len(ids_of(lenient)) == 3


# --- clearing -------------------------------------------------------------------------------


def test_delete_history_keeps_the_entries(make_client: MakeClient) -> None:
    client = make_client()
    client.put("/memory/likes", json={"value": "tea"})
    client.put("/memory/likes", json={"value": "coffee"})
    listing = client.get("/memory").json()
    response = client.delete("/memory/history")
    assert (response.status_code, response.json()) == (200, {"deleted": 2})
    assert client.get("/memory").json() == listing
    assert client.get("/memory/history").json() == {"changes": [], "next": None}
    assert client.get("/memory/likes/history").json() == {"changes": [], "next": None}


def test_clearing_memory_also_erases_its_history(make_client: MakeClient) -> None:
    client = make_client()
    client.put("/memory/likes", json={"value": "tea"})
    client.put("/memory/job", json={"value": "baker"})
    client.delete("/memory/job")
    response = client.delete("/memory")
    assert (response.status_code, response.json()) == (200, {"deleted": 1})
    assert client.get("/memory/history").json() == {"changes": [], "next": None}
    assert client.get("/memory/job/history").status_code == 404


# --- export and import ----------------------------------------------------------------------


def test_export_is_the_memory_document(make_client: MakeClient) -> None:
    client = make_client()
    client.put("/memory/likes", json={"value": "tea"})
    client.put("/memory/job", json={"value": "baker"})
    client.patch("/preferences", json={"memories": False})
    response = client.get("/memory/export")
    assert (response.status_code, response.json()) == (
        200,
        {
            "format": "kvmem.memory.v1",
            "user": "local",
            "exported_at": ISO_TIME,
            "preferences": {"memories": False},
            "memories": [entry("likes", "tea", 1), entry("job", "baker", 2)],
        },
    )


def test_import_merges_or_replaces(make_client: MakeClient, database: Database) -> None:
    client = make_client(auth=KEYS_AUTH)
    keys = KeyStore(database)
    alice = {"Authorization": f"Bearer {keys.create('alice')[1]}"}
    bob = {"Authorization": f"Bearer {keys.create('bob')[1]}"}
    client.put("/memory/likes", json={"value": "tea"}, headers=alice)
    client.put("/memory/job", json={"value": "baker"}, headers=alice)
    document = client.get("/memory/export", headers=alice).json()

    # Another user takes the document whole: every entry with source import.
    merged = client.post("/memory/import", json=document, headers=bob)
    assert (merged.status_code, merged.json()) == (
        200,
        {"imported": 2, "deleted": 0, "total_tokens": 3, "token_limit": None},
    )
    assert client.get("/memory", headers=bob).json()["memories"] == [
        entry("job", "baker", 2, "import"),
        entry("likes", "tea", 1, "import"),
    ]
    # merge (the default) keeps the keys not in the file; replace deletes them, recorded.
    one = {"memories": [{"key": "likes", "value": "coffee", "token_count": "ignored"}]}
    kept = client.post("/memory/import?mode=merge", json=one, headers=bob).json()
    assert kept == {"imported": 1, "deleted": 0, "total_tokens": 3, "token_limit": None}
    replaced = client.post("/memory/import?mode=replace", json=one, headers=bob).json()
    assert replaced == {"imported": 1, "deleted": 1, "total_tokens": 1, "token_limit": None}
    assert client.get("/memory", headers=bob).json()["memories"] == [
        entry("likes", "coffee", 1, "import")
    ]
    history = client.get("/memory/history", headers=bob).json()["changes"]
    # The import into "bob" recorded its entries in document order; the replace, the delete
    # of the key it dropped (its "likes" was already "coffee": no change).
    assert [(c["key"], c["op"], c["old_value"], c["new_value"], c["source"]) for c in history] == [
        ("job", "delete", "baker", None, "import"),
        ("likes", "set", "tea", "coffee", "import"),
        ("job", "set", None, "baker", "import"),
        ("likes", "set", None, "tea", "import"),
    ]
    # Alice's memory is untouched.
    assert [m["value"] for m in client.get("/memory", headers=alice).json()["memories"]] == [
        "baker",
        "tea",
    ]


def ten_thousand(last: dict[str, Any] | None = None) -> dict[str, Any]:
    memories = [{"key": f"k{i:05d}", "value": "hello"} for i in range(10_000)]
    return {"format": "kvmem.memory.v1", "memories": memories + ([last] if last else [])}


@pytest.mark.parametrize(
    ("document", "status", "body"),
    [
        (
            ten_thousand({"key": "Bad", "value": "x"}),
            422,
            error(
                "invalid_key",
                "memories[10000] (key 'Bad'): invalid key 'Bad': a key is 1-128 characters of "
                "a-z, 0-9 and _, starts with a letter, and is not 'export', 'history', 'nothing', 'proposals' or 'scopes'",
                key="Bad",
            ),
        ),
        (
            ten_thousand({"key": "k00007", "value": "again"}),
            400,
            error(
                "bad_request",
                "memories[10000] (key 'k00007'): the key 'k00007' appears more than once in the document",
                key="k00007",
            ),
        ),
        (
            ten_thousand({"key": "last", "value": "   "}),
            422,
            error("empty_value", "memories[10000] (key 'last'): the value is empty", key="last"),
        ),
        (
            ten_thousand({"key": "last", "value": "hello " * 5}),
            409,
            error(
                "memory_full",
                "importing 10005 tokens would take memory over the limit of 10002 tokens "
                "(passed at key 'last')",
                token_limit=10_002,
                total_tokens=1,
                requested_tokens=10_005,
                key="last",
            ),
        ),
        (
            {"format": "kvmem.memory.v2", "memories": []},
            400,
            error(
                "bad_request",
                "invalid memory document: format: Input should be 'kvmem.memory.v1'",
            ),
        ),
        (
            {"memories": [{"key": "likes"}]},
            400,
            error("bad_request", "invalid memory document: memories.0.value: Field required"),
        ),
        (
            {"memories": {"likes": "tea"}},
            400,
            error("bad_request", "invalid memory document: memories: Input should be a valid list"),
        ),
        (
            {"user": "local"},
            400,
            error("bad_request", "invalid memory document: memories: Field required"),
        ),
        (
            [{"key": "likes", "value": "tea"}],
            400,
            error(
                "bad_request",
                'the document must be a JSON object {"format": "kvmem.memory.v1", "memories": '
                '[{"key": ..., "value": ...}, ...]}',
            ),
        ),
    ],
    ids=[
        "bad-key",
        "duplicate",
        "empty",
        "over-limit",
        "format",
        "no-value",
        "not-a-list",
        "no-memories",
        "not-an-object",
    ],
)
def test_a_refused_import_names_the_key_and_writes_nothing(
    make_client: MakeClient, document: Any, status: int, body: dict[str, Any]
) -> None:
    client = make_client(memory={"tokenLimit": 10_002}, server={"max_body_bytes": 4_000_000})
    client.put("/memory/likes", json={"value": "tea"})
    client.put("/memory/likes", json={"value": "coffee"})
    before = state(client)
    for mode in ("merge", "replace"):
        response = client.post(f"/memory/import?mode={mode}", json=document)
        assert (response.status_code, response.json()) == (status, body)
        assert state(client) == before


def test_an_import_of_ten_thousand_entries_within_the_limits_lands_whole(
    make_client: MakeClient,
) -> None:
    client = make_client(memory={"tokenLimit": 10_000}, server={"max_body_bytes": 4_000_000})
    response = client.post("/memory/import", json=ten_thousand())
    assert (response.status_code, response.json()) == (
        200,
        {"imported": 10_000, "deleted": 0, "total_tokens": 10_000, "token_limit": 10_000},
    )
    assert len(ids_of(client)) == 500  # one page; there are 10,000 changes
    assert client.get("/memory/k09999/history").json()["changes"][0]["new_value"] == "hello"


def test_import_refuses_a_bad_mode_a_malformed_body_and_an_oversized_one(
    make_client: MakeClient,
) -> None:
    client = make_client(server={"max_body_bytes": 200})
    client.put("/memory/likes", json={"value": "tea"})
    before = state(client)
    document = {"memories": [{"key": "job", "value": "baker"}]}
    mode = client.post("/memory/import?mode=overwrite", json=document)
    assert (mode.status_code, mode.json()) == (
        400,
        error("bad_request", "mode must be 'merge' or 'replace', not 'overwrite'"),
    )
    broken = client.post("/memory/import", content=b'{"memories": [')
    assert (broken.status_code, broken.json()["error"]["code"]) == (400, "bad_request")
    big = {"memories": [{"key": f"k{i}", "value": "hello"} for i in range(20)]}
    too_large = client.post("/memory/import", content=json.dumps(big).encode())
    assert (too_large.status_code, too_large.json()["error"]["code"]) == (413, "body_too_large")
    assert state(client) == before


# --- memory disabled ------------------------------------------------------------------------


def test_history_routes_answer_403_when_memory_is_disabled(make_client: MakeClient) -> None:
    client = make_client(memory={"disabled": True})
    requests = [
        ("GET", "/memory/history", None),
        ("DELETE", "/memory/history", None),
        ("GET", "/memory/likes/history", None),
        ("POST", "/memory/likes/revert", {"to": 1}),
        ("GET", "/memory/export", None),
        ("POST", "/memory/import", {"memories": []}),
    ]
    for method, path, body in requests:
        response = client.request(method, path, json=body)
        assert (response.status_code, response.json()) == (
            403,
            error("memory_disabled", "memory is disabled on this server (memory.disabled is true)"),
        ), path
    # Erasing oneself does not depend on memory being on.
    assert client.delete("/me").status_code == 200


# --- retention ------------------------------------------------------------------------------


def old_change(database: Database, user_id: str, key: str, days: float) -> None:
    """A change recorded `days` ago, as if kvmem had been running that long."""
    with database.writing() as session:
        database.lock_user(session, user_id)
        session.execute(
            insert(MemoryChange).values(
                user_id=user_id,
                key=key,
                op="set",
                old_value=None,
                new_value="old",
                source="manual",
                conversation_id=None,
                at=utcnow() - timedelta(days=days),
            )
        )


def stored_changes(database: Database, user_id: str) -> int:
    with database.reading() as session:
        return session.scalar(
            select(func.count()).select_from(MemoryChange).where(MemoryChange.user_id == user_id)
        )


def test_changes_older_than_keep_days_are_never_shown_and_removed_on_the_next_write(
    make_client: MakeClient, database: Database
) -> None:
    old_change(database, "sentinel", "likes", days=31)
    client = make_client(memory={"history": {"keep_days": 30}})
    # The app sweeps expired changes when it starts: wait for that, then plant old ones.
    wait_until(lambda: stored_changes(database, "sentinel") == 0, 10, "the history sweep")
    old_change(database, "local", "likes", days=31)
    old_change(database, "local", "likes", days=29)
    old_change(database, "other", "likes", days=31)
    assert [c["at"] for c in client.get("/memory/history").json()["changes"]] == [ISO_TIME]
    assert stored_changes(database, "local") == 2
    client.put("/memory/likes", json={"value": "tea"})
    assert stored_changes(database, "local") == 2  # the 29-day-old one and the new one
    assert len(client.get("/memory/likes/history").json()["changes"]) == 2
    assert stored_changes(database, "other") == 1  # pruned when "other" next writes


def test_the_sweep_removes_expired_changes_of_users_who_no_longer_write(
    make_client: MakeClient, database: Database
) -> None:
    old_change(database, "idle", "likes", days=31)
    old_change(database, "idle", "likes", days=29)
    old_change(database, "gone", "job", days=400)
    make_client(memory={"history": {"keep_days": 30}})  # the app sweeps when it starts
    wait_until(lambda: stored_changes(database, "gone") == 0, 10, "the history sweep")
    wait_until(lambda: stored_changes(database, "idle") == 1, 10, "the history sweep")
    assert stored_changes(database, "idle") == 1  # the 29-day-old change stays


def test_keep_days_zero_records_no_history(make_client: MakeClient, database: Database) -> None:
    client = make_client(memory={"history": {"keep_days": 0}})
    old_change(database, "local", "likes", days=1)
    client.put("/memory/likes", json={"value": "tea"})
    client.put("/memory/likes", json={"value": "coffee"})
    client.post("/memory/import", json={"memories": [{"key": "job", "value": "baker"}]})
    client.delete("/memory/job")
    assert client.get("/memory/history").json() == {"changes": [], "next": None}
    assert stored_changes(database, "local") == 0


# --- erasure --------------------------------------------------------------------------------


def seed_everything(
    client: TestClient, database: Database, user_id: str, headers: dict[str, str]
) -> None:
    """A row of the user's in every table kvmem has: entries, history, a conversation and its
    messages, a session, an agent run, a proposal (the API key is the caller's)."""
    assert (
        client.put(
            "/memory/likes", json={"value": f"{user_id} likes tea"}, headers=headers
        ).status_code
        == 201
    )
    client.put("/memory/likes", json={"value": f"{user_id} likes coffee"}, headers=headers)
    client.put("/memory/job", json={"value": f"{user_id} bakes"}, headers=headers)
    now = utcnow()
    with database.writing() as session:
        session.execute(
            insert(Conversation).values(
                id=f"conv-{user_id}", user_id=user_id, title="t", created_at=now, updated_at=now
            )
        )
        session.execute(
            insert(Message),
            [
                {
                    "conversation_id": f"conv-{user_id}",
                    "role": "user",
                    "content": "hi",
                    "created_at": now,
                },
                {
                    "conversation_id": f"conv-{user_id}",
                    "role": "assistant",
                    "content": "yo",
                    "created_at": now,
                },
            ],
        )
        session.execute(
            insert(UserSession).values(
                id=f"s-{user_id}",
                user_id=user_id,
                token_hash=f"{user_id:0>64}"[:64],
                created_at=now,
                expires_at=now + timedelta(hours=1),
            )
        )
        session.execute(
            insert(AgentRunRecord).values(
                user_id=user_id,
                conversation_id=f"conv-{user_id}",
                started_at=now,
                duration_seconds=0.5,
                model_calls=1,
                input_tokens=10,
                output_tokens=2,
                cost_usd=None,
                state="done",
                writes=1,
            )
        )
        session.execute(
            insert(MemoryProposal).values(
                user_id=user_id,
                key="city",
                op="set",
                value=f"{user_id}'s city",
                conversation_id=f"conv-{user_id}",
                created_at=now,
            )
        )


def rows_of(database: Database, user_id: str) -> dict[str, int]:
    """How many rows of the user's every table holds: by `user_id`, through a foreign key to
    `users`, or one level down through a table that has `user_id` (messages)."""
    counts = {}
    with database.reading() as session:
        for table in Base.metadata.sorted_tables:
            if table.name == "user_erasures":
                continue  # the erasure's fence: a hash of the id, for a day (see test_erasure)
            conditions = []
            if table.name == "users":
                conditions.append(table.c.id == user_id)
            if "user_id" in table.c:
                conditions.append(table.c.user_id == user_id)
            for foreign_key in table.foreign_keys:
                parent = foreign_key.column.table
                if parent.name == "users":
                    conditions.append(foreign_key.parent == user_id)
                elif "user_id" in parent.c:
                    conditions.append(
                        foreign_key.parent.in_(
                            select(foreign_key.column).where(parent.c.user_id == user_id)
                        )
                    )
            assert conditions, f"table {table.name} holds no user data? the erasure test must know"
            for condition in conditions:
                counts[table.name] = counts.get(table.name, 0) + session.scalar(
                    select(func.count()).select_from(table).where(condition)
                )
    return counts


def test_delete_me_erases_every_row_of_the_user_in_every_table(
    make_client: MakeClient, database: Database
) -> None:
    client = make_client(auth=KEYS_AUTH)
    keys = KeyStore(database)
    alice = {"Authorization": f"Bearer {keys.create('alice')[1]}"}
    keys.create("alice")  # a second key
    bob = {"Authorization": f"Bearer {keys.create('bob')[1]}"}
    seed_everything(client, database, "alice", alice)
    seed_everything(client, database, "bob", bob)
    bobs_rows = rows_of(database, "bob")
    assert all(rows_of(database, "alice").values()), rows_of(database, "alice")

    response = client.delete("/me", headers=alice)
    assert (response.status_code, response.json()) == (
        200,
        {
            "deleted": {
                "memories": 2,
                "changes": 3,
                "conversations": 1,
                "messages": 2,
                "keys": 2,
                "sessions": 1,
                "agent_runs": 1,
            }
        },
    )
    assert rows_of(database, "alice") == dict.fromkeys(bobs_rows, 0)
    assert rows_of(database, "bob") == bobs_rows
    gone = client.get("/memory", headers=alice)
    assert (gone.status_code, gone.json()["error"]["code"]) == (401, "unauthorized")
    assert client.get("/memory/likes", headers=bob).json()["value"] == "bob likes coffee"


def test_an_erased_user_seen_again_starts_empty(make_client: MakeClient) -> None:
    """The entry cache must not serve what was erased, whatever the new memory version."""
    client = make_client()
    client.put("/memory/likes", json={"value": "tea"})
    assert [m["key"] for m in client.get("/memory").json()["memories"]] == ["likes"]
    assert client.delete("/me").json()["deleted"]["memories"] == 1
    client.put("/memory/job", json={"value": "baker"})  # the version is back where it was
    assert [m["key"] for m in client.get("/memory").json()["memories"]] == ["job"]
    assert client.delete("/me").json() == {
        "deleted": {
            "memories": 1,
            "changes": 1,
            "conversations": 0,
            "messages": 0,
            "keys": 0,
            "sessions": 0,
            "agent_runs": 0,
        }
    }


# --- config ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            "memory: {history: {keep_days: -1}}\n",
            "memory.history.keep_days: Input should be greater than or equal to 0 (got -1)",
        ),
        (
            "memory: {history: {keep_days: forever}}\n",
            "memory.history.keep_days: Input should be a valid integer, unable to parse string as an integer (got 'forever')",
        ),
        (
            "memory: {history: {keepDays: 5}}\n",
            "memory.history.keepDays: unknown field; did you mean 'keep_days'?",
        ),
    ],
)
def test_keep_days_must_be_a_whole_number_of_days(
    write_config: Callable[..., Any], text: str, problem: str
) -> None:
    path = write_config(text)
    with pytest.raises(ConfigError) as raised:
        load_config(path, environ={})
    assert str(raised.value) == f"{path}: invalid config:\n  {problem}"


def test_keep_days_defaults_to_90_and_context_stays_an_ordinary_key(
    write_config: Callable[..., Any],
) -> None:
    """LibreChat's examples use validKeys 'context': only 'history' and 'export' are taken."""
    config = load_config(write_config("memory: {validKeys: [context, facts]}\n"), environ={}).config
    assert (config.memory.history.keep_days, config.memory.valid_keys) == (90, ["context", "facts"])


def test_erasing_a_user_while_they_write_leaves_a_consistent_user(make_client: MakeClient) -> None:
    """Writes racing `DELETE /me` either land before it (and are erased), or are refused
    (409 `user_erased`: begun before it answered, issue 45), or begin after it (and are kept
    whole, with their history); the history still replays to the entries."""
    client = make_client()
    stop = threading.Event()
    statuses: list[int] = []

    def writer(number: int) -> None:
        count = 0
        while not stop.is_set():
            count += 1
            response = client.put(f"/memory/k{number}", json={"value": f"w{number} v{count}"})
            statuses.append(response.status_code)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    erasures = [client.delete("/me") for _ in range(5)]
    stop.set()
    for thread in threads:
        thread.join(timeout=60)
    assert [r.status_code for r in erasures] == [200] * 5
    assert set(statuses) <= {200, 201, 409} and {200, 201} & set(statuses)
    changes = client.get("/memory/history", params={"limit": 500}).json()["changes"]
    replayed: dict[str, str | None] = {}
    for one in sorted(changes, key=lambda c: c["id"]):
        assert one["old_value"] == replayed.get(one["key"]), one
        replayed[one["key"]] = one["new_value"]
    listing = client.get("/memory").json()
    assert {m["key"]: m["value"] for m in listing["memories"]} == {
        k: v for k, v in replayed.items() if v is not None
    }
