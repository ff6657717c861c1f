"""`POST /chat`: the memory block in the main request, the agent states, streaming, and how
upstream failures, timeouts and rate limits are answered."""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

import pytest
from sqlalchemy import text

from kvmem.agent.prompts import BLOCK_PREAMBLE
from tests.support.apps import (
    AGENT_MODEL,
    MAIN_MODEL,
    Containing,
    outcomes,
    services,
    set_memory,
    sse_events,
    wait_agents_idle,
    wait_until,
)
from tests.support.bounds import at_most
from tests.support.hostile import HOSTILE_VALUES, unescape
from tests.support.upstream import Reply

SYSTEM_PROMPT = "You are a helpful assistant."
NO_AGENT = {"agent": None}


def block(*lines: str) -> str:
    """The system message with a memory block of `lines`."""
    return "\n".join(
        [f"{SYSTEM_PROMPT}\n\n{BLOCK_PREAMBLE}", "<user_memory>", *lines, "</user_memory>"]
    )


def dates(client) -> dict[str, str]:
    """Each entry's `updated_at` date (YYYY-MM-DD), by key."""
    return {m["key"]: m["updated_at"][:10] for m in client.get("/memory").json()["memories"]}


def reply(
    conversation_id: str,
    response: str,
    injected: list[str],
    agent: str,
    updates: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        "conversation_id": conversation_id,
        "response": response,
        "memory": {"injected": injected, "agent": agent, "updates": updates or []},
    }


# --- the memory block -------------------------------------------------------------------


def test_entries_are_injected_oldest_first(upstream, chat_sections, make_client):
    client = make_client(**chat_sections(memory=NO_AGENT))
    for key, value in [("name", "Ada"), ("city", "Rome"), ("name", "Ada Lovelace")]:
        assert client.put(f"/memory/{key}", json={"value": value}).status_code in (200, 201)
    day = dates(client)

    response = client.post("/chat", json={"message": "Where do I live?"})
    assert response.status_code == 200
    body = response.json()
    assert body == reply(body["conversation_id"], "ok", ["city", "name"], "disabled")
    (main,) = upstream.received(MAIN_MODEL)
    assert main.messages == [
        {
            "role": "system",
            "content": block(f"[{day['city']}] city: Rome", f"[{day['name']}] name: Ada Lovelace"),
        },
        {"role": "user", "content": "Where do I live?"},
    ]
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", day["city"])


def test_each_change_of_memory_reaches_the_next_block(upstream, chat_sections, make_client):
    """The block is rendered again after every change (it is reused only while the user's
    memory is unchanged)."""
    client = make_client(**chat_sections(memory=NO_AGENT))
    steps = [
        ("PUT", "name", "Ada"),
        ("PUT", "name", "Ada Lovelace"),
        ("PUT", "city", "Rome"),
        ("DELETE", "name", None),
        ("DELETE", "city", None),
    ]
    seen = []
    for method, key, value in steps:
        body = {"value": value} if value is not None else None
        assert client.request(method, f"/memory/{key}", json=body).status_code in (200, 201, 204)
        for _ in range(2):  # the second request reads the same, unchanged memory
            assert client.post("/chat", json={"message": "hi"}).status_code == 200
            seen.append(upstream.received(MAIN_MODEL)[-1].system)
    assert [("Ada Lovelace" in s, "Rome" in s, "Ada" in s) for s in seen[::2]] == [
        (False, False, True),
        (True, False, True),
        (True, True, True),
        (False, True, False),
        (False, False, False),
    ]
    assert seen[1::2] == seen[::2]
    assert "<user_memory>" not in seen[-1]


def test_an_empty_system_prompt_gets_the_block_alone(upstream, chat_sections, make_client):
    client = make_client(**chat_sections(memory=NO_AGENT, chat={"system_prompt": ""}))
    client.put("/memory/name", json={"value": "Ada"})
    chat = client.post("/chat", json={"message": "hi"})
    assert chat.status_code == 200
    day = dates(client)["name"]
    assert upstream.received(MAIN_MODEL)[0].messages[0] == {
        "role": "system",
        "content": f"{BLOCK_PREAMBLE}\n<user_memory>\n[{day}] name: Ada\n</user_memory>",
    }


def test_a_temporary_turn_still_sends_the_history(upstream, chat_sections, make_client):
    client = make_client(**chat_sections())
    client.put("/memory/name", json={"value": "Ada"})
    first = client.post("/chat", json={"message": "one"}).json()
    assert first["memory"]["injected"] == ["name"]
    second = client.post(
        "/chat",
        json={"message": "two", "conversation_id": first["conversation_id"], "memory": False},
    ).json()
    assert second == reply(first["conversation_id"], "ok", [], "skipped")
    assert upstream.received(MAIN_MODEL)[-1].messages == [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "two"},
    ]
    wait_agents_idle(client)
    assert len(upstream.received(AGENT_MODEL)) == 1  # the first turn's only


def test_no_block_without_entries(upstream, chat_sections, make_client):
    client = make_client(**chat_sections(memory=NO_AGENT))
    body = client.post("/chat", json={"message": "hi"}).json()
    assert body == reply(body["conversation_id"], "ok", [], "disabled")
    assert upstream.received(MAIN_MODEL)[0].messages == [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": "hi"},
    ]


def assert_plain_request(upstream) -> None:
    """The last main request carried no memory block and no agent request was made."""
    assert upstream.received(MAIN_MODEL)[-1].messages[0] == {
        "role": "system",
        "content": SYSTEM_PROMPT,
    }
    assert upstream.received(AGENT_MODEL) == []


def test_a_temporary_chat_reads_no_memory_and_runs_no_agent(upstream, chat_sections, make_client):
    client = make_client(**chat_sections())
    client.put("/memory/name", json={"value": "Ada"})
    body = client.post("/chat", json={"message": "hi", "memory": False}).json()
    assert body == reply(body["conversation_id"], "ok", [], "skipped")
    assert services(client).agent.in_flight == 0
    assert outcomes(client) == {}
    assert_plain_request(upstream)


def test_an_opted_out_user_gets_no_memory_and_no_agent(upstream, chat_sections, make_client):
    client = make_client(**chat_sections())
    client.put("/memory/name", json={"value": "Ada"})
    patched = client.patch("/preferences", json={"memories": False})
    assert patched.status_code == 200 and patched.json() == {"memories": False, "review": False}
    body = client.post("/chat", json={"message": "Remember I like tea."}).json()
    assert body == reply(body["conversation_id"], "ok", [], "skipped")
    assert services(client).agent.in_flight == 0
    assert_plain_request(upstream)

    # Opting back in brings both back.
    client.patch("/preferences", json={"memories": True})
    body = client.post("/chat", json={"message": "hi"}).json()
    assert body["memory"]["injected"] == ["name"]
    upstream.wait_for(AGENT_MODEL, 1)


def test_memory_disabled_injects_nothing_and_runs_no_agent(
    upstream, chat_sections, make_client, make_store
):
    make_store().set("local", "name", "Ada")
    client = make_client(**chat_sections(memory={"disabled": True}))
    body = client.post("/chat", json={"message": "hi"}).json()
    assert body == reply(body["conversation_id"], "ok", [], "disabled")
    assert services(client).agent.in_flight == 0
    assert_plain_request(upstream)


def test_no_agent_section_means_disabled(upstream, chat_sections, make_client):
    client = make_client(**chat_sections(memory=NO_AGENT))
    client.put("/memory/name", json={"value": "Ada"})
    body = client.post("/chat", json={"message": "Remember I like tea."}).json()
    assert body == reply(body["conversation_id"], "ok", ["name"], "disabled")
    assert upstream.received(AGENT_MODEL) == []


def test_an_agent_turned_off_means_disabled(upstream, chat_sections, make_client):
    client = make_client(**chat_sections(agent={"enabled": False}))
    body = client.post("/chat", json={"message": "Remember I like tea."}).json()
    assert body["memory"]["agent"] == "disabled"
    assert services(client).agent.in_flight == 0
    assert upstream.received(AGENT_MODEL) == []


@pytest.mark.sqlite_only  # renaming a table is how this test makes SQLite unreadable
def test_an_unreadable_store_still_answers(upstream, chat_sections, make_client, database):
    client = make_client(**chat_sections())
    client.put("/memory/name", json={"value": "Ada"})
    with database.engine.begin() as connection:
        connection.execute(text("ALTER TABLE memory_entries RENAME TO memory_entries_away"))
    try:
        response = client.post("/chat", json={"message": "hi"})
        down = client.get("/memory")
    finally:  # a PostgreSQL run shares one database between tests
        with database.engine.begin() as connection:
            connection.execute(text("ALTER TABLE memory_entries_away RENAME TO memory_entries"))

    assert response.status_code == 200
    body = response.json()
    assert body == reply(body["conversation_id"], "ok", [], "failed")
    assert_plain_request(upstream)
    assert services(client).agent.in_flight == 0
    # The conversation is still kept; /memory says the store is down.
    assert client.get("/conversations").json()["conversations"][0]["id"] == body["conversation_id"]
    assert down.status_code == 503
    assert down.json() == {"error": {"code": "store_unavailable", "message": Containing("")}}
    # Once the store is back, memory is back.
    assert client.get("/memory").json()["memories"][0]["key"] == "name"


def test_hostile_values_cannot_break_out_of_the_block(upstream, chat_sections, make_client):
    client = make_client(**chat_sections(memory=NO_AGENT))
    keys = [f"note_{i}" for i in range(len(HOSTILE_VALUES))]
    for key, value in zip(keys, HOSTILE_VALUES, strict=True):
        put = client.put(f"/memory/{key}", json={"value": value})
        assert put.status_code == 201, put.text
    stored = {m["key"]: m["value"] for m in client.get("/memory").json()["memories"]}

    body = client.post("/chat", json={"message": "hi"}).json()
    assert body["memory"]["injected"] == keys
    system = upstream.received(MAIN_MODEL)[0].system
    prefix = f"{SYSTEM_PROMPT}\n\n{BLOCK_PREAMBLE}\n<user_memory>\n"
    assert system.startswith(prefix) and system.endswith("\n</user_memory>")
    assert system.count("<user_memory>") == 1 and system.count("</user_memory>") == 1
    lines = system[len(prefix) : -len("\n</user_memory>")].splitlines()
    assert len(lines) == len(keys)
    for line, key in zip(lines, keys, strict=True):
        match = re.fullmatch(r"\[\d{4}-\d{2}-\d{2}\] ([a-z0-9_]+): (.*)", line)
        assert match is not None, line
        assert match.group(1) == key
        assert unescape(match.group(2)) == stored[key]


def test_a_lone_angle_bracket_reaches_both_models_escaped(upstream, chat_sections, make_client):
    """A value whose one special character is `<` is escaped too, in the main request's
    block and in the agent's input (values with nothing to escape are passed as they are)."""
    client = make_client(**chat_sections())
    put = client.put("/memory/rule", json={"value": "x < y"})
    assert put.status_code == 201
    token_count = put.json()["memory"]["token_count"]
    day = dates(client)["rule"]
    assert client.post("/chat", json={"message": "hi"}).status_code == 200
    wait_agents_idle(client)
    (main,) = upstream.received(MAIN_MODEL)
    assert main.system == block(f"[{day}] rule: x \\u003c y")
    (agent,) = upstream.received(AGENT_MODEL)
    agent_input = agent.messages[1]["content"].splitlines()
    assert f"- rule ({token_count} tokens): x \\u003c y" in agent_input
    assert [line for line in agent_input if "<" in line] == []


def test_a_lowered_token_limit_injects_the_newest_that_fit(
    upstream, chat_sections, make_client, make_store, make_value
):
    store = make_store()
    for key, size in [("oldest", 4), ("middle", 3), ("newest", 5)]:
        store.set("local", key, make_value(size))
    client = make_client(**chat_sections(memory={"tokenLimit": 9, "agent": None}))
    day = dates(client)

    body = client.post("/chat", json={"message": "hi"}).json()
    assert body["memory"]["injected"] == ["middle", "newest"]
    assert upstream.received(MAIN_MODEL)[0].system == block(
        f"[{day['middle']}] middle: {make_value(3)}",
        f"[{day['newest']}] newest: {make_value(5)}",
    )


# --- streaming --------------------------------------------------------------------------


def test_a_streamed_reply_sends_deltas_memory_and_done(upstream, chat_sections, make_client):
    client = make_client(**chat_sections())
    upstream.script(MAIN_MODEL, Reply(chunks=["Hello", " there", " world"], chunk_delay=0.05))
    upstream.script(AGENT_MODEL, Reply(content=None, tool_calls=[set_memory("name", "Ada")]))

    response = client.post("/chat", json={"message": "Remember my name is Ada.", "stream": True})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    conversation_id = events[-1][1]["conversation_id"]
    # The memory event comes when the write lands: between deltas or after the last one.
    assert [event for event in events if event[0] != "memory"] == [
        ("delta", {"content": "Hello"}),
        ("delta", {"content": " there"}),
        ("delta", {"content": " world"}),
        (
            "done",
            reply(
                conversation_id,
                "Hello there world",
                [],
                "done",
                [{"op": "set", "key": "name", "value": "Ada"}],
            ),
        ),
    ]
    assert [event for event in events if event[0] == "memory"] == [
        ("memory", {"op": "set", "key": "name", "value": "Ada"}),
    ]
    assert events[0][0] == "delta"  # the first delta never waits for the agent
    messages = client.get(f"/conversations/{conversation_id}").json()["messages"]
    assert [(m["role"], m["content"]) for m in messages] == [
        ("user", "Remember my name is Ada."),
        ("assistant", "Hello there world"),
    ]


def test_a_write_that_lands_before_the_first_delta_follows_it(upstream, chat_sections, make_client):
    """The reply starts with text even when the agent was faster than the main model."""
    client = make_client(**chat_sections())
    upstream.script(MAIN_MODEL, Reply(chunks=["Hello", " Ada"], delay=1.0))
    upstream.script(AGENT_MODEL, Reply(content=None, tool_calls=[set_memory("name", "Ada")]))

    response = client.post("/chat", json={"message": "Remember my name is Ada.", "stream": True})
    events = sse_events(response.text)
    # The agent most likely landed during the main model's delay; wherever it landed, the
    # reply starts with the first delta.
    assert events[0] == ("delta", {"content": "Hello"})
    assert [e for e in events if e[0] == "memory"] == [
        ("memory", {"op": "set", "key": "name", "value": "Ada"})
    ]
    assert [e for e in events if e[0] == "delta"] == [
        ("delta", {"content": "Hello"}),
        ("delta", {"content": " Ada"}),
    ]
    assert events[-1][0] == "done"


def test_a_memory_event_is_sent_as_the_write_lands(upstream, chat_sections, make_client):
    client = make_client(**chat_sections())
    pieces = ["one ", "two ", "three ", "four ", "five"]
    upstream.script(MAIN_MODEL, Reply(chunks=pieces, chunk_delay=0.3))
    upstream.script(AGENT_MODEL, Reply(content=None, tool_calls=[set_memory("name", "Ada")]))
    response = client.post("/chat", json={"message": "Remember my name is Ada.", "stream": True})
    events = sse_events(response.text)
    names = [name for name, _ in events]
    # The write lands long before the main model's last piece: its event does not wait for it.
    assert names.index("memory") < len(pieces)
    assert [data["content"] for name, data in events if name == "delta"] == pieces
    assert [data for name, data in events if name == "memory"] == [
        {"op": "set", "key": "name", "value": "Ada"}
    ]
    assert names[-1] == "done" and names.count("done") == 1


def test_deltas_are_forwarded_as_they_arrive(upstream, chat_sections, make_client):
    client = make_client(**chat_sections(memory=NO_AGENT))
    upstream.script(MAIN_MODEL, Reply(chunks=["a", "b", "c", "d"], chunk_delay=0.25))
    with client.stream("POST", "/chat", json={"message": "hi", "stream": True}) as response:
        lines = response.iter_lines()
        assert [next(lines), next(lines)] == ["event: delta", 'data: {"content": "a"}']
        first_delta = time.monotonic()
        rest = list(lines)
    (main,) = upstream.received(MAIN_MODEL)
    assert main.ended is not None and main.ended - first_delta > 0.4
    body = "\n".join(["event: delta", 'data: {"content": "a"}', *rest]).rstrip("\n") + "\n\n"
    assert [name for name, _ in sse_events(body)] == ["delta"] * 4 + ["done"]
    assert sse_events(body)[-1][1]["response"] == "abcd"


def test_a_reader_leaving_mid_stream_stores_nothing_and_closes_upstream(
    upstream, chat_sections, make_client
):
    grace = 0.3
    client = make_client(**chat_sections(agent={"grace_seconds": grace}))
    upstream.script(AGENT_MODEL, Reply(hang=True))
    # Left alone, the upstream would stream for 10 s; the reader leaving must cut that short.
    pieces, delay, chunk_delay = [f"piece {i} " for i in range(100)], 0.3, 0.1
    upstream.script(MAIN_MODEL, Reply(chunks=pieces, delay=delay, chunk_delay=chunk_delay))
    with client.stream("POST", "/chat", json={"message": "hi", "stream": True}) as response:
        lines = response.iter_lines()
        assert [next(lines), next(lines)] == ["event: delta", 'data: {"content": "piece 0 "}']
    (main,) = upstream.received(MAIN_MODEL)
    assert upstream.wait_ended(main).disconnected
    assert main.ended < main.started + delay + (len(pieces) - 1) * chunk_delay
    # Leaving ends the main response, so the agent's grace period runs from then (not until
    # the agent's own 10 s timeout, which would also make its outcome `failed`).
    wait_agents_idle(client)
    assert outcomes(client) == {"timeout": 1}
    (agent,) = upstream.received(AGENT_MODEL)
    assert upstream.wait_ended(agent).disconnected
    assert agent.ended - main.ended < at_most(grace)
    assert client.get("/conversations").json() == {"conversations": [], "next": None}


def test_the_done_event_has_the_non_streamed_shape(upstream, chat_sections, make_client):
    client = make_client(**chat_sections(memory=NO_AGENT))
    client.put("/memory/name", json={"value": "Ada"})
    upstream.script(MAIN_MODEL, Reply(content="same"), Reply(content="same"))
    plain = client.post("/chat", json={"message": "hi"}).json()
    events = sse_events(client.post("/chat", json={"message": "hi", "stream": True}).text)
    assert [name for name, _ in events][-1] == "done"
    done = events[-1][1]
    assert done == {**plain, "conversation_id": done["conversation_id"]}
    assert done["conversation_id"] != plain["conversation_id"]
    assert "".join(data["content"] for name, data in events if name == "delta") == "same"


def test_a_streamed_reply_continues_a_conversation(upstream, chat_sections, make_client):
    client = make_client(**chat_sections(memory=NO_AGENT))
    first = client.post("/chat", json={"message": "one", "stream": True})
    conversation_id = sse_events(first.text)[-1][1]["conversation_id"]
    upstream.script(MAIN_MODEL, Reply(content="two!"))
    second = client.post(
        "/chat", json={"message": "two", "conversation_id": conversation_id, "stream": True}
    )
    assert sse_events(second.text)[-1][1]["conversation_id"] == conversation_id
    assert upstream.received(MAIN_MODEL)[-1].messages[1:] == [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "two"},
    ]


def test_a_streamed_timeout_before_the_first_delta_is_a_json_504(
    upstream, chat_sections, make_client
):
    timeout = 1
    client = make_client(**chat_sections(memory=NO_AGENT, chat={"timeout": timeout}))
    upstream.script(MAIN_MODEL, Reply(hang=True))
    started = time.monotonic()
    response = client.post("/chat", json={"message": "hi", "stream": True})
    elapsed = time.monotonic() - started
    assert response.status_code == 504
    assert response.json() == {
        "error": {
            "code": "upstream_timeout",
            "message": "the model did not answer within 1 seconds",
        }
    }
    assert timeout <= elapsed < at_most(timeout)
    assert client.get("/conversations").json() == {"conversations": [], "next": None}


def test_an_error_after_the_first_delta_ends_the_stream(upstream, chat_sections, make_client):
    client = make_client(**chat_sections())
    upstream.script(MAIN_MODEL, Reply(chunks=["Hel", "lo", "!"], fail_after=3))
    with client.stream("POST", "/chat", json={"message": "hi", "stream": True}) as response:
        assert response.status_code == 200
        body = response.read().decode()
    events = sse_events(body)
    # The pieces before the broken connection (litellm may drop the one just before it).
    deltas = [data for name, data in events if name == "delta"]
    assert deltas in ([{"content": "Hel"}, {"content": "lo"}], [{"content": "Hel"}])
    assert [name for name, _ in events] == ["delta"] * len(deltas) + ["error"]
    error = events[-1][1]
    assert list(error) == ["error"]
    assert error["error"]["code"] == "upstream_error"
    assert error["error"]["message"].startswith("the model call failed: ")
    assert client.get("/conversations").json() == {"conversations": [], "next": None}


def test_the_stream_ends_by_main_end_plus_grace_with_a_hanging_agent(
    upstream, chat_sections, make_client
):
    grace = 0.6
    client = make_client(**chat_sections(agent={"grace_seconds": grace}))
    upstream.script(AGENT_MODEL, Reply(hang=True))
    with client.stream("POST", "/chat", json={"message": "hi", "stream": True}) as response:
        body = response.read().decode()
        closed = time.monotonic()
    (main,) = upstream.received(MAIN_MODEL)
    assert main.ended is not None
    # Not before the grace period is over, and by its end (not the agent's own 10 s timeout).
    assert grace - 0.1 <= closed - main.ended < at_most(grace)
    events = sse_events(body)
    assert events[-1] == ("done", reply(events[-1][1]["conversation_id"], "ok", [], "timeout"))
    (agent,) = upstream.received(AGENT_MODEL)
    assert upstream.wait_ended(agent).disconnected


def test_a_streamed_reply_without_agent_ends_after_the_last_delta(
    upstream, chat_sections, make_client
):
    client = make_client(**chat_sections(memory=NO_AGENT))
    events = sse_events(client.post("/chat", json={"message": "hi", "stream": True}).text)
    assert events[-1] == ("done", reply(events[-1][1]["conversation_id"], "ok", [], "disabled"))
    assert [name for name, _ in events] == ["delta", "delta", "done"]


async def running_tasks() -> list[str]:
    """The app loop's tasks (but this one and litellm's logging workers), by coroutine name."""
    current = asyncio.current_task()
    return sorted(
        task.get_coro().__qualname__
        for task in asyncio.all_tasks()
        if task is not current and "litellm" not in task.get_coro().cr_code.co_filename
    )


def test_a_reader_leaving_while_the_agent_works_leaves_no_task_behind(
    upstream, chat_sections, make_client
):
    client = make_client(**chat_sections(agent={"grace_seconds": 2}))
    chat_id = client.post("/chat", json={"message": "warm up"}).json()["conversation_id"]
    wait_agents_idle(client)
    before = client.portal.call(running_tasks)

    upstream.script(AGENT_MODEL, Reply(delay=0.8))
    with client.stream("POST", "/chat", json={"message": "hi", "stream": True}) as response:
        lines = response.iter_lines()
        assert [next(lines) for _ in range(5)] == [
            "event: delta",
            'data: {"content": "o"}',
            "",
            "event: delta",
            'data: {"content": "k"}',
        ]
        # The turn is stored just before the stream starts waiting for the agent's writes.
        wait_until(lambda: len(client.get("/conversations").json()["conversations"]) == 2)
        time.sleep(0.1)
    wait_agents_idle(client)
    assert outcomes(client) == {"done": 2}
    assert client.portal.call(running_tasks) == before
    assert chat_id in [c["id"] for c in client.get("/conversations").json()["conversations"]]


# --- upstream failures ------------------------------------------------------------------


def test_an_upstream_timeout_answers_504_after_chat_timeout(upstream, chat_sections, make_client):
    timeout = 1
    client = make_client(**chat_sections(memory=NO_AGENT, chat={"timeout": timeout}))
    upstream.script(MAIN_MODEL, Reply(hang=True))
    started = time.monotonic()
    response = client.post("/chat", json={"message": "hi"})
    elapsed = time.monotonic() - started
    assert response.status_code == 504
    assert response.json() == {
        "error": {
            "code": "upstream_timeout",
            "message": "the model did not answer within 1 seconds",
        }
    }
    assert timeout <= elapsed < at_most(timeout)
    (main,) = upstream.received(MAIN_MODEL)  # one attempt, no retry
    assert upstream.wait_ended(main).disconnected


def test_an_upstream_429_passes_retry_after_through(upstream, chat_sections, make_client):
    client = make_client(**chat_sections(memory=NO_AGENT))
    upstream.script(
        MAIN_MODEL,
        Reply(
            status=429,
            headers={"Retry-After": "7"},
            error={"error": {"message": "slow down", "type": "rate_limit"}},
        ),
    )
    response = client.post("/chat", json={"message": "hi"})
    assert response.status_code == 429
    assert response.headers["retry-after"] == "7"
    assert response.json() == {
        "error": {"code": "rate_limited", "message": Containing("slow down")}
    }
    assert len(upstream.received(MAIN_MODEL)) == 1
    assert client.get("/conversations").json() == {"conversations": [], "next": None}


def test_an_upstream_429_without_retry_after(upstream, chat_sections, make_client):
    client = make_client(**chat_sections(memory=NO_AGENT))
    upstream.script(MAIN_MODEL, Reply(status=429))
    response = client.post("/chat", json={"message": "hi"})
    assert response.status_code == 429
    assert "retry-after" not in response.headers
    assert response.json()["error"]["code"] == "rate_limited"


def test_an_upstream_500_is_one_attempt(upstream, chat_sections, make_client):
    client = make_client(**chat_sections())
    upstream.script(MAIN_MODEL, Reply(status=500))
    response = client.post("/chat", json={"message": "hi"})
    assert response.status_code == 502
    assert response.json() == {
        "error": {
            "code": "upstream_error",
            "message": Containing("scripted 500"),
            "upstream_status": 500,
        }
    }
    assert len(upstream.received(MAIN_MODEL)) == 1
    wait_agents_idle(client)
    assert len(upstream.received(AGENT_MODEL)) == 1


def test_an_upstream_answer_of_the_wrong_shape_is_a_502_and_nothing_is_stored(
    upstream, chat_sections, make_client
):
    """kvmem reads the answer to build its own reply: a field of the wrong shape is the
    upstream's failure (as on `/api`), never a 500."""
    client = make_client(**chat_sections(memory={"agent": None}))
    answer = {"id": "x", "object": "chat.completion", "model": MAIN_MODEL}
    error = "the model call failed: {} (a malformed response)"
    for choices, problem in [
        ("nope", "choices is not an array"),
        (["nope"], "choices[0] is not an object"),
        ([{"index": 0}], "choices[0].message is missing or not an object"),
        (
            [{"index": 0, "message": {"role": "assistant", "content": 7}}],
            "the message's content is not a string",
        ),
    ]:
        upstream.script(MAIN_MODEL, Reply(raw=json.dumps({**answer, "choices": choices}).encode()))
        response = client.post("/chat", json={"message": "hi"})
        assert (response.status_code, response.json()) == (
            502,
            {
                "error": {
                    "code": "upstream_error",
                    "message": error.format(problem),
                    "upstream_status": 200,
                }
            },
        )

    first = {
        **answer,
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": "a"}}],
    }
    for choices, problem in [
        ("nope", "a chunk's choices is not an array"),
        ([{"index": 0, "delta": "b"}], "a chunk's delta is not an object"),
        ([{"index": 0, "delta": {"content": 7}}], "a delta's content is not a string"),
    ]:
        events = [first, {**first, "choices": choices}]
        upstream.script(
            MAIN_MODEL,
            Reply(
                raw=b"".join(b"data: " + json.dumps(event).encode() + b"\n\n" for event in events)
                + b"data: [DONE]\n\n"
            ),
        )
        response = client.post("/chat", json={"message": "hi", "stream": True})
        assert (response.status_code, sse_events(response.text)) == (
            200,
            [
                ("delta", {"content": "a"}),
                (
                    "error",
                    {
                        "error": {
                            "code": "upstream_error",
                            "message": error.format(problem),
                            "upstream_status": 200,
                        }
                    },
                ),
            ],
        )
    assert client.get("/conversations").json() == {"conversations": [], "next": None}
