"""Stored /chat conversations: history sent upstream, max_turns, restarts, ownership, shapes,
and failed turns that leave nothing behind."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from kvmem.db.tables import Conversation, Message
from tests.support.apps import MAIN_MODEL, Containing, sse_events
from tests.support.matchers import ISO_TIME
from tests.support.upstream import Reply

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
NO_AGENT = {"agent": None}
SERVICE = {"Authorization": "Bearer service-secret"}
KEYS_AUTH = {"mode": "keys", "service_keys": ["service-secret"]}


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


def as_user(name: str) -> dict[str, str]:
    return {**SERVICE, "X-User-Id": name}


def chat_turns(client, upstream, turns: list[tuple[str, str]], conversation_id=None, **headers):
    """Send each (message, scripted reply) in one conversation; its id."""
    for message, reply in turns:
        upstream.script(MAIN_MODEL, Reply(content=reply))
        response = client.post(
            "/chat",
            json={"message": message, "conversation_id": conversation_id},
            headers=headers or None,
        )
        assert response.status_code == 200, response.text
        conversation_id = response.json()["conversation_id"]
    return conversation_id


THREE_TURNS = [("one", "reply one"), ("two", "reply two"), ("three", "reply three")]


def test_two_turns_send_the_history_upstream(upstream, chat_sections, make_client):
    client = make_client(**chat_sections(memory=NO_AGENT))
    upstream.script(MAIN_MODEL, Reply(content="Hello Ada."), Reply(content="You are Ada."))

    first = client.post("/chat", json={"message": "My name is Ada."})
    assert first.status_code == 200
    conversation_id = first.json()["conversation_id"]
    assert first.json() == {
        "conversation_id": conversation_id,
        "response": "Hello Ada.",
        "memory": {"injected": [], "agent": "disabled", "updates": []},
    }
    second = client.post(
        "/chat", json={"message": "What is my name?", "conversation_id": conversation_id}
    )
    assert second.status_code == 200
    assert second.json() == {
        "conversation_id": conversation_id,
        "response": "You are Ada.",
        "memory": {"injected": [], "agent": "disabled", "updates": []},
    }

    sent = [r.messages for r in upstream.received(MAIN_MODEL)]
    assert sent == [
        [SYSTEM, user("My name is Ada.")],
        [SYSTEM, user("My name is Ada."), assistant("Hello Ada."), user("What is my name?")],
    ]


def test_a_new_conversation_each_time_without_an_id(upstream, chat_sections, make_client):
    client = make_client(**chat_sections(memory=NO_AGENT))
    first = client.post("/chat", json={"message": "a"}).json()["conversation_id"]
    second = client.post("/chat", json={"message": "b", "conversation_id": None}).json()
    assert second["conversation_id"] != first
    assert upstream.received(MAIN_MODEL)[1].messages == [SYSTEM, user("b")]


def test_config_max_turns_trims_the_history(upstream, chat_sections, make_client):
    client = make_client(**chat_sections(memory=NO_AGENT, chat={"max_turns": 1}))
    conversation_id = chat_turns(client, upstream, THREE_TURNS)
    chat_turns(client, upstream, [("four", "reply four")], conversation_id)
    assert upstream.received(MAIN_MODEL)[-1].messages == [
        SYSTEM,
        user("three"),
        assistant("reply three"),
        user("four"),
    ]


def test_request_max_turns_overrides_the_config(upstream, chat_sections, make_client):
    client = make_client(**chat_sections(memory=NO_AGENT, chat={"max_turns": 1}))
    conversation_id = chat_turns(client, upstream, THREE_TURNS)
    response = client.post(
        "/chat", json={"message": "four", "conversation_id": conversation_id, "max_turns": 2}
    )
    assert response.status_code == 200
    assert upstream.received(MAIN_MODEL)[-1].messages == [
        SYSTEM,
        user("two"),
        assistant("reply two"),
        user("three"),
        assistant("reply three"),
        user("four"),
    ]


def test_max_turns_zero_sends_no_history(upstream, chat_sections, make_client):
    client = make_client(**chat_sections(memory=NO_AGENT))
    conversation_id = chat_turns(client, upstream, THREE_TURNS)
    response = client.post(
        "/chat", json={"message": "four", "conversation_id": conversation_id, "max_turns": 0}
    )
    assert response.status_code == 200
    assert upstream.received(MAIN_MODEL)[-1].messages == [SYSTEM, user("four")]
    # The turn itself is still kept in the conversation.
    listed = client.get(f"/conversations/{conversation_id}").json()
    assert listed["message_count"] == 8


def test_config_max_turns_zero_sends_no_history(upstream, chat_sections, make_client):
    client = make_client(**chat_sections(memory=NO_AGENT, chat={"max_turns": 0}))
    conversation_id = chat_turns(client, upstream, THREE_TURNS[:2])
    assert upstream.received(MAIN_MODEL)[-1].messages == [SYSTEM, user("two")]
    assert client.get(f"/conversations/{conversation_id}").json()["message_count"] == 4


def test_max_turns_above_the_stored_turns_sends_them_all(upstream, chat_sections, make_client):
    # Two stored turns and max_turns 3: all four stored messages go upstream.
    client = make_client(**chat_sections(memory=NO_AGENT, chat={"max_turns": 3}))
    conversation_id = chat_turns(client, upstream, THREE_TURNS)
    assert upstream.received(MAIN_MODEL)[-1].messages == [
        SYSTEM,
        user("one"),
        assistant("reply one"),
        user("two"),
        assistant("reply two"),
        user("three"),
    ]
    chat_turns(client, upstream, [("four", "reply four")], conversation_id)
    assert upstream.received(MAIN_MODEL)[-1].messages == [
        SYSTEM,
        user("one"),
        assistant("reply one"),
        user("two"),
        assistant("reply two"),
        user("three"),
        assistant("reply three"),
        user("four"),
    ]


def test_max_turns_must_be_a_non_negative_integer(upstream, chat_sections, make_client):
    client = make_client(**chat_sections(memory=NO_AGENT))
    for bad in (-1, "2", 1.5):
        response = client.post("/chat", json={"message": "hi", "max_turns": bad})
        assert response.status_code == 400
        assert response.json() == {
            "error": {"code": "bad_request", "message": Containing("max_turns")}
        }
    assert upstream.received(MAIN_MODEL) == []


def test_conversations_survive_a_restart(upstream, chat_sections, make_client):
    sections = chat_sections(memory=NO_AGENT)
    first_app = make_client(**sections)
    conversation_id = chat_turns(first_app, upstream, THREE_TURNS[:2])
    before = first_app.get(f"/conversations/{conversation_id}").json()
    first_app.__exit__(None, None, None)

    second_app = make_client(**sections)
    assert second_app.get(f"/conversations/{conversation_id}").json() == before
    assert second_app.get("/conversations").json() == {
        "conversations": [{k: v for k, v in before.items() if k != "messages"}],
        "next": None,
    }
    chat_turns(second_app, upstream, [("three", "reply three")], conversation_id)
    assert upstream.received(MAIN_MODEL)[-1].messages == [
        SYSTEM,
        user("one"),
        assistant("reply one"),
        user("two"),
        assistant("reply two"),
        user("three"),
    ]


def not_found(conversation_id: str) -> dict[str, Any]:
    message = f"no conversation with id {conversation_id!r}"
    return {"error": {"code": "not_found", "message": message}}


def test_another_users_conversation_is_404_like_a_missing_one(upstream, chat_sections, make_client):
    client = make_client(**chat_sections(memory=NO_AGENT, auth=KEYS_AUTH))
    alices = chat_turns(client, upstream, THREE_TURNS[:1], **as_user("alice"))
    missing = str(uuid.uuid4())
    calls_before = len(upstream.received(MAIN_MODEL))

    for conversation_id in (alices, missing):
        chat = client.post(
            "/chat",
            json={"message": "hi", "conversation_id": conversation_id},
            headers=as_user("bob"),
        )
        read = client.get(f"/conversations/{conversation_id}", headers=as_user("bob"))
        delete = client.delete(f"/conversations/{conversation_id}", headers=as_user("bob"))
        for response in (chat, read, delete):
            assert response.status_code == 404
            assert response.json() == not_found(conversation_id)

    assert len(upstream.received(MAIN_MODEL)) == calls_before
    assert client.get("/conversations", headers=as_user("bob")).json() == {
        "conversations": [],
        "next": None,
    }
    alice_view = client.get(f"/conversations/{alices}", headers=as_user("alice"))
    assert alice_view.status_code == 200
    assert alice_view.json()["message_count"] == 2
    assert [
        c["id"]
        for c in client.get("/conversations", headers=as_user("alice")).json()["conversations"]
    ] == [alices]


def test_conversation_routes_need_credentials_in_keys_mode(chat_sections, make_client):
    client = make_client(**chat_sections(memory=NO_AGENT, auth=KEYS_AUTH))
    for response in (
        client.get("/conversations"),
        client.post("/chat", json={"message": "hi"}),
        client.get("/conversations", headers={"Authorization": "Bearer wrong"}),
    ):
        assert response.status_code == 401
        assert response.json() == {"error": {"code": "unauthorized", "message": Containing("")}}


def test_list_get_and_delete_shapes(upstream, chat_sections, make_client):
    client = make_client(**chat_sections(memory=NO_AGENT))
    older = chat_turns(client, upstream, [("  Plan a trip\n to Rome ", "Sure.")])
    newer = chat_turns(client, upstream, [("Second chat", "Hi.")])
    assert client.get("/conversations").json() == {
        "conversations": [
            {
                "id": newer,
                "title": "Second chat",
                "created_at": ISO_TIME,
                "updated_at": ISO_TIME,
                "message_count": 2,
            },
            {
                "id": older,
                "title": "Plan a trip to Rome",
                "created_at": ISO_TIME,
                "updated_at": ISO_TIME,
                "message_count": 2,
            },
        ],
        "next": None,
    }
    # A new turn makes a conversation the most recently updated one.
    chat_turns(client, upstream, [("More?", "More.")], older)
    listing = client.get("/conversations").json()["conversations"]
    assert [(c["id"], c["message_count"]) for c in listing] == [(older, 4), (newer, 2)]
    assert listing[0]["updated_at"] > listing[0]["created_at"]

    conversation = client.get(f"/conversations/{older}")
    assert conversation.status_code == 200
    assert conversation.json() == {
        "id": older,
        "title": "Plan a trip to Rome",
        "created_at": listing[0]["created_at"],
        "updated_at": listing[0]["updated_at"],
        "message_count": 4,
        "messages": [
            {"role": "user", "content": "  Plan a trip\n to Rome ", "created_at": ISO_TIME},
            {"role": "assistant", "content": "Sure.", "created_at": ISO_TIME},
            {"role": "user", "content": "More?", "created_at": ISO_TIME},
            {"role": "assistant", "content": "More.", "created_at": ISO_TIME},
        ],
    }

    deleted = client.delete(f"/conversations/{older}")
    assert deleted.status_code == 204
    assert deleted.content == b""
    assert client.get(f"/conversations/{older}").status_code == 404
    assert client.delete(f"/conversations/{older}").json() == not_found(older)
    assert [c["id"] for c in client.get("/conversations").json()["conversations"]] == [newer]
    again = client.post("/chat", json={"message": "back?", "conversation_id": older})
    assert again.status_code == 404


def test_a_long_first_message_makes_a_cut_title(upstream, chat_sections, make_client):
    client = make_client(**chat_sections(memory=NO_AGENT))
    chat_turns(client, upstream, [("word " * 40, "ok")])
    (conversation,) = client.get("/conversations").json()["conversations"]
    assert conversation["title"] == ("word " * 16)[:79] + "…"
    assert len(conversation["title"]) == 80


def test_an_empty_list_before_any_chat(chat_sections, make_client):
    client = make_client(**chat_sections(memory=NO_AGENT))
    response = client.get("/conversations")
    assert response.status_code == 200
    assert response.json() == {"conversations": [], "next": None}


def test_an_empty_message_is_refused(upstream, chat_sections, make_client):
    client = make_client(**chat_sections(memory=NO_AGENT))
    response = client.post("/chat", json={"message": "  \n "})
    assert response.status_code == 400
    assert response.json() == {"error": {"code": "bad_request", "message": "message is empty"}}
    assert upstream.received(MAIN_MODEL) == []


def upstream_500() -> dict[str, Any]:
    return {
        "error": {
            "code": "upstream_error",
            "message": Containing("scripted 500"),
            "upstream_status": 500,
        }
    }


def test_a_failed_first_turn_stores_no_conversation(upstream, chat_sections, make_client):
    client = make_client(**chat_sections(memory=NO_AGENT))
    upstream.script(MAIN_MODEL, Reply(status=500))
    response = client.post("/chat", json={"message": "hi"})
    assert response.status_code == 502
    assert response.json() == upstream_500()
    assert client.get("/conversations").json() == {"conversations": [], "next": None}


def test_a_failed_turn_stores_nothing_and_the_next_turn_works(upstream, chat_sections, make_client):
    client = make_client(**chat_sections(memory=NO_AGENT))
    conversation_id = chat_turns(client, upstream, THREE_TURNS[:1])

    upstream.script(MAIN_MODEL, Reply(status=500))
    failed = client.post("/chat", json={"message": "lost", "conversation_id": conversation_id})
    assert failed.status_code == 502
    assert failed.json() == upstream_500()
    assert client.get(f"/conversations/{conversation_id}").json()["message_count"] == 2

    upstream.script(MAIN_MODEL, Reply(content="still here"))
    after = client.post("/chat", json={"message": "next", "conversation_id": conversation_id})
    assert after.status_code == 200
    assert after.json()["response"] == "still here"
    assert upstream.received(MAIN_MODEL)[-1].messages == [
        SYSTEM,
        user("one"),
        assistant("reply one"),
        user("next"),
    ]
    messages = client.get(f"/conversations/{conversation_id}").json()["messages"]
    assert [(m["role"], m["content"]) for m in messages] == [
        ("user", "one"),
        ("assistant", "reply one"),
        ("user", "next"),
        ("assistant", "still here"),
    ]


def test_a_dropped_connection_stores_nothing(upstream, chat_sections, make_client):
    client = make_client(**chat_sections(memory=NO_AGENT))
    conversation_id = chat_turns(client, upstream, THREE_TURNS[:1])
    upstream.script(MAIN_MODEL, Reply(reset=True))
    failed = client.post("/chat", json={"message": "lost", "conversation_id": conversation_id})
    assert failed.status_code == 502
    assert failed.json()["error"]["code"] == "upstream_error"
    assert client.get(f"/conversations/{conversation_id}").json()["message_count"] == 2


def test_a_mid_stream_failure_stores_nothing_and_the_next_turn_works(
    upstream, chat_sections, make_client
):
    client = make_client(**chat_sections(memory=NO_AGENT))
    conversation_id = chat_turns(client, upstream, THREE_TURNS[:1])

    upstream.script(MAIN_MODEL, Reply(content="abcdef", fail_after=3))
    streamed = client.post(
        "/chat", json={"message": "lost", "conversation_id": conversation_id, "stream": True}
    )
    assert streamed.status_code == 200
    events = sse_events(streamed.text)
    assert [name for name, _ in events] in (["delta", "delta", "error"], ["delta", "error"])
    assert events[0][1] == {"content": "ab"}
    assert events[-1][1]["error"]["code"] == "upstream_error"
    assert client.get(f"/conversations/{conversation_id}").json()["message_count"] == 2

    chat_turns(client, upstream, [("next", "fine")], conversation_id)
    assert upstream.received(MAIN_MODEL)[-1].messages == [
        SYSTEM,
        user("one"),
        assistant("reply one"),
        user("next"),
    ]


def test_a_streamed_failure_before_the_first_delta_stores_nothing(
    upstream, chat_sections, make_client
):
    client = make_client(**chat_sections(memory=NO_AGENT))
    upstream.script(MAIN_MODEL, Reply(status=500))
    response = client.post("/chat", json={"message": "hi", "stream": True})
    assert response.status_code == 502
    assert response.headers["content-type"] == "application/json"
    assert response.json() == upstream_500()
    assert client.get("/conversations").json() == {"conversations": [], "next": None}


def plant_conversations(database, user_id: str, stamps: list[tuple[str, str]]) -> None:
    """Conversations (id, updated_at ISO time) of `user_id`, each with one message."""
    with database.writing() as session:
        database.lock_user(session, user_id)
        for conversation_id, stamp in stamps:
            at = datetime.fromisoformat(stamp)
            session.add(
                Conversation(
                    id=conversation_id,
                    user_id=user_id,
                    title=conversation_id[:4],
                    created_at=at,
                    updated_at=at,
                )
            )
            session.flush()
            session.add(
                Message(conversation_id=conversation_id, role="user", content="hi", created_at=at)
            )


def listed(conversation_id: str, stamp: str) -> dict[str, Any]:
    at = stamp.replace("+00:00", "Z")
    return {
        "id": conversation_id,
        "title": conversation_id[:4],
        "created_at": at,
        "updated_at": at,
        "message_count": 1,
    }


def test_conversations_page_newest_first_with_ties_in_id_order(make_client, database):
    a, b, c, d = (f"{n}{n}{n}{n}0000-0000-4000-8000-000000000000" for n in "abcd")
    new, tie, old = (
        "2026-03-01T10:00:00.000002+00:00",
        "2026-03-01T10:00:00.000001+00:00",
        "2026-01-01T00:00:00.000000+00:00",
    )
    plant_conversations(database, "local", [(a, tie), (b, new), (c, old), (d, tie)])
    plant_conversations(database, "someone-else", [(str(uuid.uuid4()), new)])
    client = make_client()
    first = client.get("/conversations", params={"limit": 2})
    assert (first.status_code, first.json()) == (
        200,
        {
            "conversations": [listed(b, new), listed(a, tie)],
            "next": f"2026-03-01T10:00:00.000001Z_{a}",
        },
    )
    last = client.get("/conversations", params={"limit": 2, "before": first.json()["next"]})
    assert (last.status_code, last.json()) == (
        200,
        {
            "conversations": [listed(d, tie), listed(c, old)],
            "next": None,
        },
    )
    whole = client.get("/conversations").json()
    assert whole == {
        "conversations": [listed(b, new), listed(a, tie), listed(d, tie), listed(c, old)],
        "next": None,
    }


def test_bad_paging_parameters_of_conversations_are_400(make_client):
    client = make_client()
    cursor_error = "before must be the next value of a GET /conversations page, not {!r}"
    for query, message in [
        ("limit=0", "limit must be an integer from 1 to 500, not 0"),
        ("limit=501", "limit must be an integer from 1 to 500, not 501"),
        ("limit=two", "limit must be an integer from 1 to 500, not 'two'"),
        ("before=7", cursor_error.format("7")),
        (
            "before=2026-03-01T10:00:00Z_not-a-uuid",
            cursor_error.format("2026-03-01T10:00:00Z_not-a-uuid"),
        ),
        (
            f"before=yesterday_{uuid.UUID(int=1)}",
            cursor_error.format(f"yesterday_{uuid.UUID(int=1)}"),
        ),
    ]:
        response = client.get(f"/conversations?{query}")
        assert (response.status_code, response.json()) == (
            400,
            {"error": {"code": "bad_request", "message": message}},
        ), query
