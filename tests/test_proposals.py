"""Review before remembering: with `memory.review` in effect the memory agent's writes become
proposals that the person keeps (accept) or dismisses (reject); every rule holds at accept."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime
from typing import Any

import pytest

from kvmem.agent.prompts import ChatLine, render_agent_input
from kvmem.memory.proposals import MAX_PENDING, Proposal, ProposalStore
from tests.support.apps import (
    AGENT_MODEL,
    MAIN_MODEL,
    delete_memory,
    set_memory,
    sse_events,
    wait_agents_idle,
)
from tests.support.matchers import ISO_TIME, entry
from tests.support.upstream import Reply

KEYS_AUTH = {"mode": "keys", "service_keys": ["service-secret"]}


def service(user: str) -> dict[str, str]:
    return {"Authorization": "Bearer service-secret", "X-User-Id": user}


def tools(*calls: dict[str, Any]) -> Reply:
    return Reply(content=None, tool_calls=list(calls))


def proposal(id: int, key: str, op: str, value: str | None, conversation_id: str | None) -> dict:
    return {
        "id": id,
        "key": key,
        "op": op,
        "value": value,
        "conversation_id": conversation_id,
        "created_at": ISO_TIME,
        "expires_at": None,
    }


def error(code: str, message: str, **details: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, **details}}


def chat(client, message: str = "Remember that my name is Ada.", **body: Any) -> dict[str, Any]:
    response = client.post("/chat", json={"message": message, **body})
    assert response.status_code == 200, response.text
    wait_agents_idle(client)
    return response.json()


def pending(client, headers=None) -> list[dict[str, Any]]:
    response = client.get("/memory/proposals", headers=headers)
    assert response.status_code == 200
    return response.json()["proposals"]


def review_client(upstream, chat_sections, make_client, **memory: Any):
    return make_client(**chat_sections(memory={"review": "on", **memory}))


# --- the agent proposes -----------------------------------------------------------------------


def test_agent_writes_become_proposals_and_the_model_is_told(upstream, chat_sections, make_client):
    client = review_client(upstream, chat_sections, make_client)
    client.put("/memory/city", json={"value": "Paris"})
    upstream.script(AGENT_MODEL, tools(set_memory("name", "Ada"), delete_memory("city")))
    response = client.post("/chat", json={"message": "Ada; forget my city", "stream": True})
    event, done = sse_events(response.text)[-1]
    conversation = done["conversation_id"]
    assert (event, done["memory"]) == (
        "done",
        {
            "injected": ["city"],
            "agent": "done",
            "updates": [
                {"op": "set", "key": "name", "value": "Ada", "pending": True},
                {"op": "delete", "key": "city", "pending": True},
            ],
        },
    )
    assert client.get("/memory").json()["memories"] == [entry("city", "Paris", 1)]
    assert pending(client) == [
        proposal(2, "city", "delete", None, conversation),
        proposal(1, "name", "set", "Ada", conversation),
    ]
    # The results a second call would carry: the model is told, and does not retry.
    upstream.script(AGENT_MODEL, tools(set_memory("name", "Ada"), set_memory("Bad Key", "x")))
    chat(client, "Remember my name again.", conversation_id=conversation)
    second = upstream.received(AGENT_MODEL)[-1]
    assert [m["content"] for m in second.messages if m["role"] == "tool"] == [
        'Proposed for review: set key "name". The user will keep or dismiss it; do not repeat it.',
        'Invalid key "Bad Key". Keys are lowercase letters, digits and _, start with a letter, '
        "and are at most 128 characters.",
    ]


def test_pending_proposals_are_in_the_agent_input_after_existing_memory(
    upstream, chat_sections, make_client
):
    client = review_client(upstream, chat_sections, make_client)
    client.put("/memory/city", json={"value": "Paris"})
    upstream.script(AGENT_MODEL, tools(set_memory("name", "Ada\nLovelace")))
    chat(client)
    chat(client, "What is my name?")
    prompt = upstream.received(AGENT_MODEL)[-1].messages[1]["content"]
    assert (
        "# Existing memory:\n- city (1 tokens): Paris\n\n# Pending review:\n"
        "(proposed earlier and waiting for the user's decision: not stored yet; do not propose "
        "them again)\n- set name: Ada\\nLovelace\n\n# Current Chat:" in prompt
    )


def test_no_pending_review_section_without_review(upstream, chat_sections, make_client):
    client = make_client(**chat_sections())
    chat(client)
    assert "# Pending review:" not in upstream.received(AGENT_MODEL)[-1].messages[1]["content"]


@pytest.mark.parametrize(
    ("call", "result"),
    [
        (set_memory("food", "x"), 'Invalid key "food". Must be one of: name, city'),
        (
            set_memory("name", "x" * 11),
            'Value for key "name" is too long (11 characters; the limit is 10). Shorten it.',
        ),
        (set_memory("name", "  "), 'Empty value for key "name". Cannot save an empty memory.'),
        (delete_memory("city"), 'No memory with key "city". Nothing to delete.'),
    ],
)
def test_proposals_are_validated_like_writes(upstream, chat_sections, make_client, call, result):
    client = review_client(
        upstream, chat_sections, make_client, validKeys=["name", "city"], charLimit=10
    )
    upstream.script(AGENT_MODEL, tools(call), tools())
    chat(client)
    first, _second = upstream.received(AGENT_MODEL)
    assert [m["content"] for m in _second.messages if m["role"] == "tool"] == [result]
    assert first.messages == _second.messages[:2]
    assert pending(client) == []


def test_streamed_chat_and_the_agent_hook_mark_proposals_pending(
    upstream, chat_sections, make_client
):
    client = review_client(upstream, chat_sections, make_client)
    upstream.script(AGENT_MODEL, tools(set_memory("name", "Ada")))
    response = client.post("/chat", json={"message": "I'm Ada", "stream": True})
    update = {"op": "set", "key": "name", "value": "Ada", "pending": True}
    assert [e for e in sse_events(response.text) if e[0] == "memory"] == [("memory", update)]
    upstream.script(AGENT_MODEL, tools(set_memory("city", "Rome")))
    hook = client.post("/memory/agent", json={"messages": [{"role": "user", "content": "Rome"}]})
    assert (hook.status_code, hook.json()) == (
        200,
        {
            "agent": "done",
            "updates": [{"op": "set", "key": "city", "value": "Rome", "pending": True}],
        },
    )
    assert [p["key"] for p in pending(client)] == ["city", "name"]
    assert client.get("/memory").json()["memories"] == []


def test_inline_markers_become_proposals_whole_and_streamed(upstream, chat_sections, make_client):
    # placement: inline: the main model's markers are held for review like the agent's calls.
    client = make_client(**chat_sections(memory={"review": "on"}, agent={"placement": "inline"}))
    client.put("/memory/city", json={"value": "Paris"})
    upstream.script(MAIN_MODEL, Reply(content="Hello Ada!\n[MEMORY: name = Ada]\n[FORGET: city]"))
    body = chat(client, "I'm Ada; forget my city")
    conversation = body["conversation_id"]
    assert body == {
        "conversation_id": conversation,
        "response": "Hello Ada!",
        "memory": {
            "injected": ["city"],
            "agent": "done",
            "updates": [
                {"op": "set", "key": "name", "value": "Ada", "pending": True},
                {"op": "delete", "key": "city", "pending": True},
            ],
        },
    }
    upstream.script(MAIN_MODEL, Reply(chunks=["Rome, ", "noted.\n[MEM", "ORY: city = Rome]"]))
    response = client.post(
        "/chat", json={"message": "Now Rome.", "stream": True, "conversation_id": conversation}
    )
    update = {"op": "set", "key": "city", "value": "Rome", "pending": True}
    assert [e for e in sse_events(response.text) if e[0] == "memory"] == [("memory", update)]
    # Nothing written until accepted; the newer city proposal replaced the pending delete.
    assert client.get("/memory").json()["memories"] == [entry("city", "Paris", 1)]
    assert pending(client) == [
        proposal(3, "city", "set", "Rome", conversation),
        proposal(1, "name", "set", "Ada", conversation),
    ]
    assert upstream.received(AGENT_MODEL) == []
    accepted = client.post("/memory/proposals/1/accept")
    assert (accepted.status_code, accepted.json()) == (
        200,
        {"memory": entry("name", "Ada", 1, source="agent"), "total_tokens": 2, "token_limit": None},
    )
    changes = client.get("/memory/history").json()["changes"]
    assert [(c["key"], c["op"], c["source"], c["conversation_id"]) for c in changes] == [
        ("name", "set", "agent", conversation),
        ("city", "set", "manual", None),
    ]


def test_usage_counts_no_proposal_as_a_write(upstream, chat_sections, make_client):
    client = review_client(upstream, chat_sections, make_client)
    upstream.script(AGENT_MODEL, tools(set_memory("name", "Ada")))
    chat(client)
    assert client.get("/usage").json()["totals"]["writes"] == 0


# --- the proposal store -----------------------------------------------------------------------


def test_a_newer_proposal_replaces_the_pending_one_for_its_key(make_store):
    proposals = ProposalStore(make_store())
    proposals.propose("u", "name", "Ada", conversation_id="c1")
    proposals.propose("u", "city", "Rome")
    newer = proposals.propose("u", "name", "Ada L.", conversation_id="c2")
    assert [(p.id, p.key, p.value, p.conversation_id) for p in proposals.pending("u")] == [
        (newer.id, "name", "Ada L.", "c2"),
        (2, "city", "Rome", None),
    ]
    assert newer.id == 3


def test_at_most_fifty_are_pending_the_oldest_dropped(make_store):
    proposals = ProposalStore(make_store())
    for n in range(MAX_PENDING + 3):
        proposals.propose("u", f"k{n}", f"v{n}")
    proposals.propose("v", "other", "x")
    kept = proposals.pending("u")
    assert MAX_PENDING == 50
    assert [p.key for p in kept] == [f"k{n}" for n in range(MAX_PENDING + 2, 2, -1)]
    assert [p.key for p in proposals.pending("v")] == ["other"]


# --- accept and reject --------------------------------------------------------------------------


def seeded(make_client, config: dict[str, Any] | None = None):
    """An app with two proposals of the default user: set name=Ada (id 1), delete city (2)."""
    client = make_client(**(config or {}))
    client.put("/memory/city", json={"value": "Paris"})
    proposals = client.app_state["services"].proposals
    proposals.propose("local", "name", "Ada", conversation_id="conv-1")
    proposals.propose("local", "city", None, conversation_id="conv-2")
    return client


def test_accepting_writes_as_the_agent_with_the_proposals_conversation(make_client):
    client = seeded(make_client)
    accepted = client.post("/memory/proposals/1/accept")
    assert (accepted.status_code, accepted.json()) == (
        200,
        {"memory": entry("name", "Ada", 1, source="agent"), "total_tokens": 2, "token_limit": None},
    )
    deleted = client.post("/memory/proposals/2/accept")
    assert (deleted.status_code, deleted.json()) == (
        200,
        {"memory": None, "total_tokens": 1, "token_limit": None},
    )
    assert client.get("/memory").json()["memories"] == [entry("name", "Ada", 1, source="agent")]
    changes = client.get("/memory/history").json()["changes"]
    assert [(c["key"], c["op"], c["source"], c["conversation_id"]) for c in changes] == [
        ("city", "delete", "agent", "conv-2"),
        ("name", "set", "agent", "conv-1"),
        ("city", "set", "manual", None),
    ]
    assert pending(client) == []
    again = client.post("/memory/proposals/1/accept")
    assert (again.status_code, again.json()) == (404, error("not_found", "no pending proposal 1"))


def test_an_accept_over_the_token_limit_is_409_and_stays_pending(make_client, make_value):
    client = make_client(memory={"tokenLimit": 5})
    client.put("/memory/city", json={"value": make_value(4)})
    client.app_state["services"].proposals.propose("local", "name", make_value(2))
    response = client.post("/memory/proposals/1/accept")
    assert (response.status_code, response.json()) == (
        409,
        error(
            "memory_full",
            "storing 2 tokens would take memory to 6 tokens, over the limit of 5",
            token_limit=5,
            total_tokens=4,
            requested_tokens=2,
        ),
    )
    assert pending(client) == [proposal(1, "name", "set", make_value(2), None)]
    assert [m["key"] for m in client.get("/memory").json()["memories"]] == ["city"]
    # Room made, the same proposal is kept.
    client.delete("/memory/city")
    assert client.post("/memory/proposals/1/accept").status_code == 200
    assert pending(client) == []


def test_an_accept_under_rules_changed_since_is_422_and_stays_pending(make_client):
    make_client().app_state["services"].proposals.propose("local", "food", "tea")
    stricter = make_client(memory={"validKeys": ["name"]})
    response = stricter.post("/memory/proposals/1/accept")
    assert (response.status_code, response.json()) == (
        422,
        error(
            "key_not_allowed", "key 'food' is not allowed; valid keys: name", valid_keys=["name"]
        ),
    )
    assert [p["key"] for p in pending(stricter)] == ["food"]


def test_rejecting_one_and_all(make_client):
    client = seeded(make_client)
    assert client.post("/memory/proposals/1/reject").status_code == 204
    again = client.post("/memory/proposals/1/reject")
    assert (again.status_code, again.json()) == (404, error("not_found", "no pending proposal 1"))
    assert [p["id"] for p in pending(client)] == [2]
    client.app_state["services"].proposals.propose("local", "food", "tea")
    cleared = client.delete("/memory/proposals")
    assert (cleared.status_code, cleared.json()) == (200, {"rejected": 2})
    assert client.delete("/memory/proposals").json() == {"rejected": 0}
    assert client.get("/memory").json()["memories"] == [entry("city", "Paris", 1)]


@pytest.mark.parametrize(
    "path",
    [
        "/memory/proposals/99/accept",
        "/memory/proposals/x/reject",
        "/memory/proposals/-1/accept",
        "/memory/proposals/1234567890123456789/reject",
    ],
)
def test_unknown_proposal_ids_are_404(make_client, path):
    client = seeded(make_client)
    response = client.post(path)
    raw = path.split("/")[3]
    message = f"no pending proposal {raw}" if raw == "99" else f"no pending proposal {raw!r}"
    assert (response.status_code, response.json()) == (404, error("not_found", message))
    assert len(pending(client)) == 2


def test_another_users_proposal_is_404(make_client):
    client = make_client(auth=KEYS_AUTH)
    client.app_state["services"].proposals.propose("alice", "name", "Ada")
    for method, path in [
        ("POST", "/memory/proposals/1/accept"),
        ("POST", "/memory/proposals/1/reject"),
    ]:
        response = client.request(method, path, headers=service("bob"))
        assert (response.status_code, response.json()) == (
            404,
            error("not_found", "no pending proposal 1"),
        )
    assert client.delete("/memory/proposals", headers=service("bob")).json() == {"rejected": 0}
    assert pending(client, service("bob")) == []
    assert [p["key"] for p in pending(client, service("alice"))] == ["name"]


def test_proposals_is_a_reserved_key(make_client):
    client = make_client()
    response = client.put("/memory/proposals", json={"value": "x"})
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "invalid_key"


def test_clearing_memory_and_erasing_the_user_remove_proposals(make_client):
    client = seeded(make_client)
    assert client.delete("/memory").json() == {"deleted": 1}
    assert pending(client) == []
    seeded_again = client.app_state["services"].proposals
    seeded_again.propose("local", "name", "Ada")
    assert client.delete("/me").status_code == 200
    assert pending(client) == []


def test_concurrent_accepts_apply_a_proposal_once(make_client_for_url, database_url, database):
    first, second = make_client_for_url(database_url), make_client_for_url(database_url)
    proposals = ProposalStore(first.app_state["services"].store)
    rounds = 10
    for n in range(rounds):
        proposals.propose("local", f"k{n}", f"v{n}")
    for proposal_id in range(1, rounds + 1):
        barrier = threading.Barrier(2)
        statuses: list[int] = []

        def accept(client, proposal_id=proposal_id, barrier=barrier, statuses=statuses) -> None:
            barrier.wait()
            statuses.append(client.post(f"/memory/proposals/{proposal_id}/accept").status_code)

        threads = [threading.Thread(target=accept, args=(c,)) for c in (first, second)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(statuses) == [200, 404]
    changes = first.get("/memory/history?limit=100").json()["changes"]
    assert sorted(c["key"] for c in changes) == sorted(f"k{n}" for n in range(rounds))
    assert pending(first) == []


# --- the switch ---------------------------------------------------------------------------------


def test_preferences_show_review_as_the_operator_set_it(make_client):
    assert make_client().get("/preferences").json() == {"memories": True, "review": False}
    assert make_client(memory={"review": "on"}).get("/preferences").json() == {
        "memories": True,
        "review": True,
    }


@pytest.mark.parametrize("mode", ["off", "on"])
def test_the_user_switch_is_403_unless_per_user(make_client, mode):
    client = make_client(memory={"review": mode})
    response = client.patch("/preferences", json={"memories": False, "review": True})
    assert (response.status_code, response.json()) == (
        403,
        error(
            "review_not_per_user",
            f"users cannot choose review on this server (memory.review is {mode}, not per_user)",
        ),
    )
    assert client.get("/preferences").json() == {"memories": True, "review": mode == "on"}


def test_per_user_review_holds_only_that_users_agent_writes(upstream, chat_sections, make_client):
    client = make_client(**chat_sections(memory={"review": "per_user"}, auth=KEYS_AUTH))
    on = client.patch("/preferences", json={"review": True}, headers=service("alice"))
    assert (on.status_code, on.json()) == (200, {"memories": True, "review": True})
    assert client.get("/preferences", headers=service("bob")).json() == {
        "memories": True,
        "review": False,
    }
    for user in ("alice", "bob"):
        upstream.script(AGENT_MODEL, tools(set_memory("name", user)))
        response = client.post("/chat", json={"message": "I am here"}, headers=service(user))
        assert response.status_code == 200
        wait_agents_idle(client)
    assert [p["value"] for p in pending(client, service("alice"))] == ["alice"]
    assert client.get("/memory", headers=service("alice")).json()["memories"] == []
    assert client.get("/memory", headers=service("bob")).json()["memories"] == [
        entry("name", "bob", 1, source="agent")
    ]
    off = client.patch("/preferences", json={"review": False}, headers=service("alice"))
    assert off.json() == {"memories": True, "review": False}


def test_an_empty_preferences_body_is_400(make_client):
    response = make_client().patch("/preferences", json={})
    assert (response.status_code, response.json()) == (
        400,
        error("bad_request", "invalid request body: give memories, review or both"),
    )


def test_json_mode_operations_become_proposals_too(upstream, chat_sections, make_client):
    client = make_client(**chat_sections(memory={"review": "on"}, agent={"mode": "json"}))
    client.put("/memory/city", json={"value": "Paris"})
    operations = [
        {"op": "set", "key": "name", "value": "Ada"},
        {"op": "delete", "key": "city"},
        {"op": "set", "key": "Bad Key", "value": "x"},
    ]
    upstream.script(
        AGENT_MODEL,
        Reply(content=json.dumps({"operations": operations})),
        Reply(content='{"operations": []}'),
    )
    body = chat(client)
    assert [(p["key"], p["op"], p["value"]) for p in pending(client)] == [
        ("city", "delete", None),
        ("name", "set", "Ada"),
    ]
    assert client.get("/memory").json()["memories"] == [entry("city", "Paris", 1)]
    results = upstream.received(AGENT_MODEL)[1].messages[-1]["content"]
    assert results.splitlines()[1:4] == [
        '1. set "name": Proposed for review: set key "name". The user will keep or dismiss it; '
        "do not repeat it.",
        '2. delete "city": Proposed for review: delete key "city". The user will keep or dismiss '
        "it; do not repeat it.",
        '3. set "Bad Key": Invalid key "Bad Key". Keys are lowercase letters, digits and _, '
        "start with a letter, and are at most 128 characters.",
    ]
    assert body["conversation_id"] == pending(client)[0]["conversation_id"]


def test_the_pending_section_lists_sets_and_deletes_escaped(tokens):
    now = datetime.now(UTC)
    pending = [
        Proposal(2, "city", "delete", None, None, now),
        Proposal(1, "name", "set", "Ada</user_memory>", "c", now),
    ]
    text = render_agent_input([], None, None, [ChatLine("user", "hi")], 100, tokens, pending)
    assert text.split("\n\n")[2:] == [
        "# Pending review:\n(proposed earlier and waiting for the user's decision: not stored "
        "yet; do not propose them again)\n- delete city\n- set name: Ada\\u003c/user_memory\\u003e",
        "# Current Chat:\nHuman: hi",
    ]
    assert "# Pending review:" not in render_agent_input([], None, None, [], 100, tokens)
