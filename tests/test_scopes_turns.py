"""Scoped turns (CONTRACT section 23): naming a turn's scope on /chat, /v1, /api and the hooks,
the block's two parts, and the memory agent writing each key where it belongs."""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.testclient import TestClient

from kvmem.agent.prompts import BLOCK_PREAMBLE, SCOPED_BLOCK_PREAMBLE
from kvmem.entries import Entry
from kvmem.memory.store import MemoryStore
from tests.support.apps import (
    AGENT_MODEL,
    MAIN_MODEL,
    outcomes,
    services,
    set_memory,
    sse_events,
    wait_agents_idle,
)
from tests.support.plans import captured_statements
from tests.support.upstream import Reply

SYSTEM_PROMPT = "You are a helpful assistant."
OWN_KEYS = ["name", "city", "food"]
SCOPED_KEYS = ["project_notes", "project_decisions", "project_goals"]
SCOPES = {"validKeys": SCOPED_KEYS}
MEMORY = {"validKeys": OWN_KEYS, "scopes": SCOPES}
NO_AGENT = {"agent": None}
MODEL = f"openai/{MAIN_MODEL}"
SERVICE = {"Authorization": "Bearer service-secret"}
KEYS_AUTH = {"mode": "keys", "service_keys": ["service-secret"]}


def tools(*calls: dict[str, Any]) -> Reply:
    """An agent reply that makes these tool calls."""
    return Reply(content=None, tool_calls=list(calls))


def line(entry: Entry) -> str:
    return f"[{entry.updated_at.date().isoformat()}] {entry.key}: {entry.value}"


def own_block(*entries: Entry) -> str:
    """The unscoped block, as kvmem rendered it before scopes."""
    return "\n".join([BLOCK_PREAMBLE, "<user_memory>", *map(line, entries), "</user_memory>"])


def scoped_block(own: list[Entry], scope: str, scoped: list[Entry]) -> str:
    own_part = ["<user_memory>", *map(line, own), "</user_memory>"] if own else []
    return "\n".join(
        [
            SCOPED_BLOCK_PREAMBLE,
            *own_part,
            f'<scope_memory scope="{scope}">',
            *map(line, scoped),
            "</scope_memory>",
        ]
    )


def seed(store: MemoryStore, user: str = "local") -> dict[str, Entry]:
    """The person's own entries and two scopes' entries, by "scope/key"."""
    written = [
        ("", "name", "Ada"),
        ("work", "project_notes", "kvmem ships Friday"),
        ("home", "project_notes", "paint the kitchen"),
        ("", "city", "Rome"),
        ("work", "project_decisions", "SQLite first"),
    ]
    return {
        f"{scope}/{key}": store.set(user, key, value, scope=scope).entry
        for scope, key, value in written
    }


def context(client: TestClient, scope: str | None = None, **body: Any) -> dict[str, Any]:
    headers = {"X-Memory-Scope": scope} if scope is not None else {}
    response = client.post("/memory/context", json=body, headers=headers)
    assert response.status_code == 200, response.text
    return response.json()


def completion(content: str = "hi", **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}


def layer(store: MemoryStore, scope: str, user: str = "local") -> dict[str, str]:
    return {entry.key: entry.value for entry in store.layer(user, scope).entries}


def every_layer(store: MemoryStore, user: str = "local") -> list[tuple[str, str, str]]:
    return [(e.scope, e.key, e.value) for e in store.every_layer(user).entries]


# --- the block ----------------------------------------------------------------------------


def test_a_scoped_turn_injects_its_scope_and_the_persons_own_but_no_other_scope(
    upstream, chat_sections, make_client, make_store
):
    seeded = seed(make_store(**MEMORY))
    own = [seeded["/name"], seeded["/city"]]
    work = [seeded["work/project_notes"], seeded["work/project_decisions"]]
    client = make_client(**chat_sections(memory={**NO_AGENT, **MEMORY}))

    body = client.post("/chat", json={"message": "hi", "scope": "work"}).json()
    assert body["memory"] == {
        "injected": ["name", "city", "project_notes", "project_decisions"],
        "agent": "disabled",
        "updates": [],
    }
    block = scoped_block(own, "work", work)
    assert upstream.received(MAIN_MODEL)[-1].system == f"{SYSTEM_PROMPT}\n\n{block}"
    assert "paint the kitchen" not in block

    # /v1 with the header, and the hook, give the same block; so does the other scope, its own.
    v1 = client.post("/v1/chat/completions", json=completion(), headers={"X-Memory-Scope": "work"})
    assert v1.status_code == 200 and v1.headers["X-Memory-Injected"] == "4"
    assert upstream.received(MAIN_MODEL)[-1].system == block
    assert context(client, "work")["block"] == block
    home = context(client, "home")
    assert home["block"] == scoped_block(own, "home", [seeded["home/project_notes"]])
    assert home["injected"] == ["name", "city", "project_notes"]
    assert context(client, **{"scope": "work"})["block"] == block  # the body's scope

    # An unscoped turn's block is the one kvmem always rendered: the person's own only.
    client.post("/chat", json={"message": "hi"})
    assert upstream.received(MAIN_MODEL)[-1].system == f"{SYSTEM_PROMPT}\n\n{own_block(*own)}"
    assert context(client)["block"] == own_block(*own)


def test_a_scope_without_entries_of_its_own_gets_the_unscoped_block(
    upstream, chat_sections, make_client, make_store
):
    seeded = seed(make_store(**MEMORY))
    client = make_client(**chat_sections(memory={**NO_AGENT, **MEMORY}))
    own = own_block(seeded["/name"], seeded["/city"])
    assert context(client, **{"scope": "empty"})["block"] == own
    client.post("/chat", json={"message": "hi", "scope": "empty"})
    assert upstream.received(MAIN_MODEL)[-1].system == f"{SYSTEM_PROMPT}\n\n{own}"


def test_each_part_of_the_block_keeps_within_its_own_token_limit(
    upstream, chat_sections, make_client, make_store, make_value
):
    store = make_store(**MEMORY)  # no limits when they were written
    own = [store.set("local", key, make_value(2)).entry for key in OWN_KEYS]
    work = [store.set("local", key, make_value(2), scope="work").entry for key in SCOPED_KEYS]
    limited = {**MEMORY, "tokenLimit": 4, "scopes": {**SCOPES, "tokenLimit": 2}}
    client = make_client(**chat_sections(memory={**NO_AGENT, **limited}))

    given = context(client, "work")
    # The newest that fit each part's limit: two own entries (4 tokens), one scoped (2).
    assert given["injected"] == ["city", "food", "project_goals"]
    assert given["block"] == scoped_block(own[1:], "work", work[2:])
    assert context(client)["injected"] == ["city", "food"]


def test_an_isolated_scope_injects_only_its_own_part(
    upstream, chat_sections, make_client, make_store
):
    seeded = seed(make_store(**MEMORY))
    isolated = {**MEMORY, "scopes": {**SCOPES, "isolated": True}}
    client = make_client(**chat_sections(memory={**NO_AGENT, **isolated}))

    body = client.post("/chat", json={"message": "hi", "scope": "work"}).json()
    block = scoped_block(
        [], "work", [seeded["work/project_notes"], seeded["work/project_decisions"]]
    )
    assert body["memory"]["injected"] == ["project_notes", "project_decisions"]
    assert upstream.received(MAIN_MODEL)[-1].system == f"{SYSTEM_PROMPT}\n\n{block}"
    assert context(client)["injected"] == ["name", "city"]  # an unscoped turn: the own part


def test_the_scope_named_in_the_block_is_escaped_like_a_value(
    upstream, chat_sections, make_client, make_store
):
    """The scope is client input: its characters are few (no `<`, `>` or `"`), but it goes
    through the value escaping all the same; a name that could break out is refused."""
    store = make_store(**MEMORY)
    store.set("local", "project_notes", "x", scope="a/b:c@d.e-f_g")
    client = make_client(**chat_sections(memory={**NO_AGENT, **MEMORY}))
    assert '<scope_memory scope="a/b:c@d.e-f_g">' in context(client, "a/b:c@d.e-f_g")["block"]
    for name in ['work">', "</scope_memory>", "a b"]:
        response = client.post("/memory/context", json={"scope": name})
        assert response.status_code == 400, name


def test_a_scoped_block_is_one_store_read(
    upstream, chat_sections, make_client, make_store, database
):
    seed(make_store(**MEMORY))
    client = make_client(**chat_sections(memory={**NO_AGENT, **MEMORY}))
    context(client)  # the first request's own work (the user's row, expiry) is done

    def reads(scope: str) -> list[str]:
        """The statements of a read of the block, about this user (the background sweeps
        of expired entries and old history read every user's, and may run meanwhile)."""
        with captured_statements(database.engine) as statements:
            assert context(client, scope)["injected"]
        return [
            " ".join(s.sql.lower().split())
            for s in statements
            if "'local'" in s.sql or "local" in repr(s.parameters)
        ]

    first, again = reads("work"), reads("work")
    # The user's memory version, then one read of their own entries and the scope's.
    assert len(first) == 2 and "from users" in first[0]
    assert "from memory_entries" in first[1] and "memory_entries.scope in" in first[1]
    assert again == first[:1]  # unchanged memory: the entries read before are reused
    assert len(reads("home")) == 2  # another scope is a read of its own


# --- the agent ----------------------------------------------------------------------------


def test_a_scoped_turns_agent_writes_each_key_where_it_belongs(
    upstream, chat_sections, make_client, make_store
):
    store = make_store(**MEMORY)
    seeded = seed(store)
    client = make_client(**chat_sections(memory=MEMORY))
    upstream.script(
        AGENT_MODEL,
        tools(set_memory("project_goals", "ship 1.0"), set_memory("food", "pasta")),
    )
    response = client.post(
        "/chat", json={"message": "Remember...", "stream": True}, headers={"X-Memory-Scope": "work"}
    )
    events = sse_events(response.text)
    updates = [
        {"op": "set", "key": "project_goals", "value": "ship 1.0", "scope": "work"},
        {"op": "set", "key": "food", "value": "pasta"},
    ]
    assert events[-1][1]["memory"] == {
        "injected": ["name", "city", "project_notes", "project_decisions"],
        "agent": "done",
        "updates": updates,
    }
    assert layer(store, "work") == {
        "project_notes": "kvmem ships Friday",
        "project_decisions": "SQLite first",
        "project_goals": "ship 1.0",
    }
    assert layer(store, "") == {"name": "Ada", "city": "Rome", "food": "pasta"}
    assert layer(store, "home") == {"project_notes": "paint the kitchen"}

    (request,) = upstream.received(AGENT_MODEL)
    prompt = request.messages[1]["content"]
    assert 'This chat\'s scope: "work"' in prompt
    assert f"Keys kept per scope (written to this chat's scope): {', '.join(SCOPED_KEYS)}" in prompt
    assert f"Valid keys: {', '.join(OWN_KEYS)}" in prompt
    assert "# Existing memory:\n- name (1 tokens): Ada\n- city (1 tokens): Rome\n" in prompt
    assert (
        '# Existing memory of scope "work":\n'
        f"- project_notes ({seeded['work/project_notes'].token_count} tokens): kvmem ships Friday\n"
    ) in prompt
    assert "paint the kitchen" not in prompt
    key = request.body["tools"][0]["function"]["parameters"]["properties"]["key"]
    assert key["description"].endswith(f"Must be one of: {', '.join(OWN_KEYS + SCOPED_KEYS)}.")


def test_an_unscoped_turn_cannot_write_a_scoped_key(
    upstream, chat_sections, make_client, make_store
):
    store = make_store(**MEMORY)
    client = make_client(**chat_sections(memory=MEMORY))
    upstream.script(AGENT_MODEL, tools(set_memory("project_notes", "x"), set_memory("name", "Ada")))
    response = client.post("/chat", json={"message": "Remember...", "stream": True})
    events = sse_events(response.text)
    refusal = (
        f'Invalid key "project_notes". Must be one of: {", ".join(OWN_KEYS)} '
        "(it is kept per scope, and this chat names no scope)"
    )
    refused = {"op": "set", "key": "project_notes", "value": "x", "error": refusal}
    written = {"op": "set", "key": "name", "value": "Ada"}
    assert [e for e in events if e[0] == "memory"] == [("memory", refused), ("memory", written)]
    assert events[-1][1]["memory"] == {
        "injected": [],
        "agent": "done",
        "updates": [refused, written],
    }
    assert every_layer(store) == [("", "name", "Ada")]

    first, second = upstream.received(AGENT_MODEL)  # the refusal went back to the model
    assert [m["content"] for m in second.messages if m["role"] == "tool"] == [
        refusal,
        'Memory set for key "name" (1 tokens)',
    ]
    key = first.body["tools"][0]["function"]["parameters"]["properties"]["key"]
    assert key["description"].endswith(f"Must be one of: {', '.join(OWN_KEYS)}.")
    assert "project_notes" not in first.messages[1]["content"]


def test_an_isolated_turn_writes_only_its_scope(upstream, chat_sections, make_client, make_store):
    store = make_store(**MEMORY)
    seed(store)
    isolated = {**MEMORY, "scopes": {**SCOPES, "isolated": True}}
    client = make_client(**chat_sections(memory=isolated))
    upstream.script(
        AGENT_MODEL, tools(set_memory("city", "Oslo"), set_memory("project_goals", "ship"))
    )
    response = client.post(
        "/memory/agent",
        json={"messages": [{"role": "user", "content": "Remember..."}], "scope": "work"},
    )
    refusal = (
        f'Invalid key "city". Must be one of: {", ".join(SCOPED_KEYS)} '
        "(this chat's scope is isolated: only its keys are written)"
    )
    assert response.json() == {
        "agent": "done",
        "updates": [
            {"op": "set", "key": "city", "value": "Oslo", "error": refusal},
            {"op": "set", "key": "project_goals", "value": "ship", "scope": "work"},
        ],
    }
    assert layer(store, "") == {"name": "Ada", "city": "Rome"}
    assert layer(store, "work")["project_goals"] == "ship"
    prompt = upstream.received(AGENT_MODEL)[0].messages[1]["content"]
    assert "(isolated: only its memory is seen and written)" in prompt
    assert "Ada" not in prompt and "Rome" not in prompt and "Valid keys" not in prompt
    assert "kvmem ships Friday" in prompt


def test_json_mode_routes_each_operation_by_its_key(
    upstream, chat_sections, make_client, make_store
):
    store = make_store(**MEMORY)
    client = make_client(**chat_sections(memory=MEMORY, agent={"mode": "json"}))
    operations = [
        {"op": "set", "key": "project_goals", "value": "ship"},
        {"op": "set", "key": "name", "value": "Ada"},
    ]
    upstream.script(AGENT_MODEL, Reply(content=json.dumps({"operations": operations})))
    body = {"messages": [{"role": "user", "content": "Remember..."}], "scope": "work"}
    # Each update says the scope it went to; the person's own layer's say none.
    assert client.post("/memory/agent", json=body).json() == {
        "agent": "done",
        "updates": [{**operations[0], "scope": "work"}, operations[1]],
    }
    assert every_layer(store) == [("", "name", "Ada"), ("work", "project_goals", "ship")]

    upstream.script(
        AGENT_MODEL,
        Reply(content=json.dumps({"operations": operations[:1]})),
        Reply(content='{"operations": []}'),  # the corrective call gives up
    )
    unscoped = client.post("/memory/agent", json={"messages": body["messages"]}).json()
    assert unscoped["agent"] == "done"
    assert unscoped["updates"] == [
        {
            **operations[0],
            "error": f'Invalid key "project_goals". Must be one of: {", ".join(OWN_KEYS)} '
            "(it is kept per scope, and this chat names no scope)",
        }
    ]
    assert every_layer(store) == [("", "name", "Ada"), ("work", "project_goals", "ship")]


def test_a_scoped_turns_writes_under_review_are_proposed_in_its_scope(
    upstream, chat_sections, make_client, make_store
):
    store = make_store(**MEMORY)
    client = make_client(**chat_sections(memory={**MEMORY, "review": "on"}))
    upstream.script(
        AGENT_MODEL, tools(set_memory("project_goals", "ship"), set_memory("name", "Ada"))
    )
    response = client.post(
        "/memory/agent",
        json={"messages": [{"role": "user", "content": "Remember..."}]},
        headers={"X-Memory-Scope": "work"},
    )
    assert response.json()["updates"] == [
        {"op": "set", "key": "project_goals", "value": "ship", "pending": True, "scope": "work"},
        {"op": "set", "key": "name", "value": "Ada", "pending": True},
    ]
    proposals = services(client).proposals
    assert [(p.key, p.scope) for p in proposals.pending("local", "work")] == [
        ("project_goals", "work")
    ]
    assert [(p.key, p.scope) for p in proposals.pending("local")] == [("name", "")]
    assert every_layer(store) == []


def test_inline_markers_of_a_scoped_turn_go_where_their_keys_belong(
    upstream, chat_sections, make_client, make_store
):
    store = make_store(**MEMORY)
    client = make_client(**chat_sections(memory=MEMORY, agent={"placement": "inline"}))
    reply = "Noted.\n[MEMORY: project_goals = ship]\n[MEMORY: city = Oslo]"
    upstream.script(MAIN_MODEL, Reply(content=reply), Reply(content=reply))
    scoped = client.post("/chat", json={"message": "Remember...", "scope": "work"}).json()
    assert scoped["memory"]["updates"] == [
        {"op": "set", "key": "project_goals", "value": "ship", "scope": "work"},
        {"op": "set", "key": "city", "value": "Oslo"},
    ]
    assert f"Use only these keys: {', '.join(OWN_KEYS + SCOPED_KEYS)}." in (
        upstream.received(MAIN_MODEL)[0].system
    )
    assert every_layer(store) == [("", "city", "Oslo"), ("work", "project_goals", "ship")]

    # Unscoped: the scoped marker is refused, reported once, and nothing of it is written.
    store.delete("local", "city")
    unscoped = client.post("/chat", json={"message": "Remember..."}).json()
    assert unscoped["memory"]["updates"] == [
        {
            "op": "set",
            "key": "project_goals",
            "value": "ship",
            "error": f'Invalid key "project_goals". Must be one of: {", ".join(OWN_KEYS)} '
            "(it is kept per scope, and this chat names no scope)",
        },
        {"op": "set", "key": "city", "value": "Oslo"},
    ]
    assert every_layer(store) == [("", "city", "Oslo"), ("work", "project_goals", "ship")]


# --- whose scope, and naming it ------------------------------------------------------------


def test_another_users_scope_of_the_same_name_is_invisible(
    upstream, chat_sections, make_client, make_store
):
    store = make_store(**MEMORY)
    seed(store, "alice")
    client = make_client(**chat_sections(memory=MEMORY, auth=KEYS_AUTH))
    bob = {**SERVICE, "X-User-Id": "bob", "X-Memory-Scope": "work"}
    given = client.post("/memory/context", headers=bob)
    assert given.json() == {
        "block": "",
        "injected": [],
        "token_count": 0,
        "enabled": True,
        "system": "",
    }
    upstream.script(AGENT_MODEL, tools(set_memory("project_notes", "bob's")))
    response = client.post("/chat", json={"message": "Remember...", "stream": True}, headers=bob)
    assert sse_events(response.text)[-1][1]["memory"]["injected"] == []
    assert "kvmem ships Friday" not in upstream.received(AGENT_MODEL)[0].messages[1]["content"]
    assert layer(store, "work", "bob") == {"project_notes": "bob's"}
    assert layer(store, "work", "alice")["project_notes"] == "kvmem ships Friday"


def test_by_model_scopes_a_v1_or_api_turn_by_its_model(
    upstream, chat_sections, make_client, make_store
):
    store = make_store(**MEMORY)
    note = store.set("local", "project_notes", "for main", scope=f"model:{MODEL}").entry
    store.set("local", "project_notes", "for other", scope="model:openai/other")
    by_model = {**MEMORY, "scopes": {**SCOPES, "by_model": True}}
    client = make_client(**chat_sections(memory={**NO_AGENT, **by_model}))
    block = scoped_block([], f"model:{MODEL}", [note])

    assert client.post("/v1/chat/completions", json=completion()).status_code == 200
    assert upstream.received(MAIN_MODEL)[-1].system == block
    ollama = client.post("/api/chat", json={**completion(), "stream": False})
    assert ollama.status_code == 200, ollama.text
    assert upstream.received(MAIN_MODEL)[-1].system == block
    # A named scope wins; /chat and the hooks have no model to go by.
    client.post("/v1/chat/completions", json=completion(), headers={"X-Memory-Scope": "x"})
    assert upstream.received(MAIN_MODEL)[-1].system == ""
    client.post("/chat", json={"message": "hi"})
    assert upstream.received(MAIN_MODEL)[-1].system == SYSTEM_PROMPT
    assert context(client)["block"] == ""


def test_by_model_writes_land_in_the_models_scope(upstream, chat_sections, make_client, make_store):
    store = make_store(**MEMORY)
    by_model = {**MEMORY, "scopes": {**SCOPES, "by_model": True}}
    client = make_client(**chat_sections(memory=by_model))
    upstream.script(AGENT_MODEL, tools(set_memory("project_notes", "n")))
    assert client.post("/api/chat", json={**completion(), "stream": False}).status_code == 200
    wait_agents_idle(client)
    assert every_layer(store) == [(f"model:{MODEL}", "project_notes", "n")]


def test_a_model_id_that_cannot_form_a_scope_is_400(
    upstream, chat_sections, make_client, make_store
):
    by_model = {**MEMORY, "scopes": {**SCOPES, "by_model": True}}
    client = make_client(**chat_sections(memory=by_model, chat={"models": ["openai/bad model"]}))
    response = client.post(
        "/v1/chat/completions", json={**completion(), "model": "openai/bad model"}
    )
    assert response.status_code == 400
    assert response.json()["error"]["message"] == (
        "the model id 'openai/bad model' cannot form a scope (memory.scopes.by_model makes it "
        "'model:<model id>', 1-128 characters of A-Z, a-z, 0-9 and . _ : @ / -): "
        "send X-Memory-Scope to name the scope"
    )
    named = client.post(
        "/v1/chat/completions",
        json={**completion(), "model": "openai/bad model"},
        headers={"X-Memory-Scope": "mine"},
    )
    assert named.status_code == 200
    # A call that reads no memory needs no scope of its model's: X-Memory: off, a front
    # end's task call, an Ollama model load.
    for headers in ({"X-Memory": "off"}, {"X-Memory-Task": "title"}):
        quiet = client.post(
            "/v1/chat/completions",
            json={**completion(), "model": "openai/bad model"},
            headers=headers,
        )
        assert quiet.status_code == 200, quiet.json()
    loaded = client.post("/api/generate", json={"model": "openai/bad model", "stream": False})
    assert loaded.status_code == 200, loaded.json()


INVALID_SCOPE = "invalid scope: a scope is 1-128 characters of A-Z, a-z, 0-9 and . _ : @ / -"
NO_SCOPES = "this server keeps no scopes (memory.scopes is not configured); send no scope"


def bad_turns(client: TestClient, scope: str) -> list[tuple[int, Any]]:
    """Every turn route naming `scope`: status and error body."""
    header = {"X-Memory-Scope": scope}
    message = [{"role": "user", "content": "Remember that my name is Ada."}]
    responses = [
        client.post("/v1/chat/completions", json=completion(), headers=header),
        client.post(
            "/api/chat",
            json={"model": MODEL, "messages": message, "stream": False},
            headers=header,
        ),
        client.post("/memory/context", headers=header),
        client.post("/memory/agent", json={"messages": message}, headers=header),
        client.post("/chat", json={"message": "hi", "scope": scope}),
        client.post("/memory/context", json={"scope": scope}),
        client.post("/memory/agent", json={"messages": message, "scope": scope}),
    ]
    return [(r.status_code, r.json()) for r in responses]


def expected_errors(message: str) -> list[tuple[int, Any]]:
    plain = {"error": {"code": "bad_request", "message": message}}
    openai = {
        "error": {
            "code": "bad_request",
            "message": message,
            "type": "invalid_request_error",
            "param": None,
        }
    }
    return [(400, openai), (400, {"error": message}), *[(400, plain)] * 5]


@pytest.mark.parametrize("scope", ["has space", "x" * 129, "semi;colon", 'a"b', ""])
def test_a_malformed_scope_is_400_and_changes_nothing(
    upstream, chat_sections, make_client, make_store, scope
):
    store = make_store(**MEMORY)
    seed(store)
    before = every_layer(store)
    client = make_client(**chat_sections(memory=MEMORY))
    answers = bad_turns(client, scope)
    if scope == "":  # an empty header names no scope (as an empty X-Conversation-Id)
        assert [status for status, _ in answers[:4]] == [200, 200, 200, 200]
        assert answers[4:] == expected_errors(INVALID_SCOPE)[4:]
        return
    assert answers == expected_errors(INVALID_SCOPE)
    assert upstream.requests == []
    assert outcomes(client) == {}
    assert every_layer(store) == before


def test_naming_a_scope_without_memory_scopes_is_400(upstream, chat_sections, make_client):
    client = make_client(**chat_sections(memory={"validKeys": OWN_KEYS}))
    assert bad_turns(client, "work") == expected_errors(NO_SCOPES)
    assert upstream.requests == []
    assert outcomes(client) == {}


def test_the_header_and_the_body_must_name_the_same_scope(
    upstream, chat_sections, make_client, make_store
):
    seed(make_store(**MEMORY))
    client = make_client(**chat_sections(memory={**NO_AGENT, **MEMORY}))
    clash = {
        "error": {
            "code": "bad_request",
            "message": "X-Memory-Scope and the body's scope name different scopes",
        }
    }
    for path, body in [
        ("/chat", {"message": "hi", "scope": "home"}),
        ("/memory/context", {"scope": "home"}),
        ("/memory/agent", {"messages": [{"role": "user", "content": "hi"}], "scope": "home"}),
    ]:
        response = client.post(path, json=body, headers={"X-Memory-Scope": "work"})
        assert (response.status_code, response.json()) == (400, clash), path
    agreed = client.post(
        "/memory/context", json={"scope": "work"}, headers={"X-Memory-Scope": "work"}
    )
    assert agreed.json()["injected"] == ["name", "city", "project_notes", "project_decisions"]
    assert upstream.requests == []


def test_a_task_call_gets_no_block_and_no_run_in_a_scope(
    upstream, chat_sections, make_client, make_store
):
    seed(make_store(**MEMORY))
    client = make_client(**chat_sections(memory=MEMORY))
    scoped = {"X-Memory-Scope": "work"}
    turn = client.post("/v1/chat/completions", json=completion(), headers=scoped)
    assert turn.headers["X-Memory-Injected"] == "4"
    response = client.post(
        "/v1/chat/completions",
        json=completion(),
        headers={**scoped, "X-Memory-Task": "title_generation"},
    )
    assert response.headers["X-Memory-Agent"] == "task"
    assert response.headers["X-Memory-Injected"] == "0"
    assert upstream.received(MAIN_MODEL)[-1].system == ""
    wait_agents_idle(client)
    assert len(upstream.received(AGENT_MODEL)) == 1  # the turn's, not the task call's


def test_the_scope_is_per_request_in_a_conversation(
    upstream, chat_sections, make_client, make_store
):
    seed(make_store(**MEMORY))
    client = make_client(**chat_sections(memory={**NO_AGENT, **MEMORY}))
    first = client.post("/chat", json={"message": "hi", "scope": "work"}).json()
    conversation = first["conversation_id"]
    second = client.post("/chat", json={"message": "hi", "conversation_id": conversation}).json()
    third = client.post(
        "/chat", json={"message": "hi", "conversation_id": conversation, "scope": "home"}
    ).json()
    assert [turn["memory"]["injected"] for turn in (first, second, third)] == [
        ["name", "city", "project_notes", "project_decisions"],
        ["name", "city"],
        ["name", "city", "project_notes"],
    ]
