"""`memory.agent.placement: inline`: the main model writes memory markers, kvmem cuts them out
of every route's reply (whole or streamed) and applies them; no agent call is made."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from kvmem.agent.markers import Marker
from kvmem.agent.memory_agent import MemoryAgent
from kvmem.agent.prompts import BLOCK_PREAMBLE, render_marker_instructions
from kvmem.agent.run import AgentRun
from kvmem.chat.main_call import MainCall
from kvmem.config import Config
from kvmem.memory.rules import MemoryRules
from kvmem.memory.store import MemoryStore
from kvmem.upstream.base import Target
from tests.support.apps import AGENT_MODEL, MAIN_MODEL, sse_events
from tests.support.matchers import ISO_TIME
from tests.support.upstream import Reply

SYSTEM_PROMPT = "You are a helpful assistant."
INLINE = {"placement": "inline"}
REPLY = "Noted, Paris it is.\n\n[MEMORY: city = Paris]\n[FORGET: name]\n"
SHOWN = "Noted, Paris it is."
CITY_SET = {"op": "set", "key": "city", "value": "Paris"}


def memories(client) -> dict[str, str]:
    return {m["key"]: m["value"] for m in client.get("/memory").json()["memories"]}


def chat_reply(
    conversation_id: str,
    response: str,
    injected: list[str],
    agent: str,
    updates: list[dict[str, Any]],
) -> dict[str, Any]:
    return {
        "conversation_id": conversation_id,
        "response": response,
        "memory": {"injected": injected, "agent": agent, "updates": updates},
    }


def splits(text: str) -> list[list[str]]:
    """The text in two chunks at every boundary, and one character at a time."""
    return [[text[:k], text[k:]] for k in range(1, len(text))] + [list(text)]


def test_streamed_chat_never_shows_a_marker_at_any_chunk_boundary(
    upstream, chat_sections, make_client
):
    client = make_client(**chat_sections(agent=INLINE))
    for chunks in splits(REPLY):
        assert client.put("/memory/name", json={"value": "Ada"}).status_code in (200, 201)
        client.delete("/memory/city")
        upstream.script(MAIN_MODEL, Reply(chunks=chunks))
        response = client.post("/chat", json={"message": "I live in Paris now.", "stream": True})
        assert response.status_code == 200
        events = sse_events(response.text)
        conversation_id = events[-1][1]["conversation_id"]
        updates = [CITY_SET, {"op": "delete", "key": "name"}]
        assert "".join(data["content"] for name, data in events if name == "delta") == SHOWN
        assert [e for e in events if e[0] != "delta"] == [
            *(("memory", update) for update in updates),
            ("done", chat_reply(conversation_id, SHOWN, ["name"], "done", updates)),
        ]
        stored = client.get(f"/conversations/{conversation_id}").json()["messages"]
        assert [(m["role"], m["content"]) for m in stored] == [
            ("user", "I live in Paris now."),
            ("assistant", SHOWN),
        ]
        assert memories(client) == {"city": "Paris"}
    assert upstream.received(AGENT_MODEL) == []
    assert len(upstream.received(MAIN_MODEL)) == len(splits(REPLY))


def test_whole_chat_applies_the_markers_and_stores_the_clean_text(
    upstream, chat_sections, make_client
):
    client = make_client(**chat_sections(agent=INLINE))
    client.put("/memory/name", json={"value": "Ada"})
    upstream.script(MAIN_MODEL, Reply(content=REPLY))
    body = client.post("/chat", json={"message": "I moved to Paris; forget my name."}).json()
    conversation_id = body["conversation_id"]
    assert body == chat_reply(
        conversation_id, SHOWN, ["name"], "done", [CITY_SET, {"op": "delete", "key": "name"}]
    )
    assert memories(client) == {"city": "Paris"}
    changes = client.get("/memory/history").json()["changes"]
    assert [
        (c["key"], c["op"], c["new_value"], c["source"], c["conversation_id"]) for c in changes
    ] == [
        ("name", "delete", None, "agent", conversation_id),
        ("city", "set", "Paris", "agent", conversation_id),
        ("name", "set", "Ada", "manual", None),
    ]
    stored = client.get(f"/conversations/{conversation_id}").json()["messages"]
    assert stored[-1]["content"] == SHOWN
    assert upstream.received(AGENT_MODEL) == []


def test_the_main_request_gets_the_marker_instructions_after_the_block(
    upstream, chat_sections, make_client
):
    client = make_client(**chat_sections(agent=INLINE, memory={"validKeys": ["name", "city"]}))
    client.put("/memory/name", json={"value": "Ada"})
    client.post("/chat", json={"message": "Hi"})
    (main,) = upstream.received(MAIN_MODEL)
    date = client.get("/memory").json()["memories"][0]["updated_at"][:10]
    assert main.system == "\n".join(
        [
            f"{SYSTEM_PROMPT}\n\n{BLOCK_PREAMBLE}",
            "<user_memory>",
            f"[{date}] name: Ada",
            "</user_memory>\n\n" + render_marker_instructions(["name", "city"], 10_000),
        ]
    )
    assert "Use only these keys: name, city." in main.system


def test_configured_instructions_replace_kvmems(upstream, chat_sections, make_client):
    client = make_client(
        **chat_sections(agent={**INLINE, "instructions": "Write [MEMORY: k = v]."})
    )
    client.post("/chat", json={"message": "Hi"})
    assert upstream.received(MAIN_MODEL)[0].system == f"{SYSTEM_PROMPT}\n\nWrite [MEMORY: k = v]."


def test_look_alikes_pass_through_unchanged(upstream, chat_sections, make_client):
    client = make_client(**chat_sections(agent=INLINE))
    text = "See [1, 2], [MEMO], [MEMORY] and [the docs](https://example.com/[x]) [M\n"
    upstream.script(MAIN_MODEL, Reply(chunks=list(text)))
    events = sse_events(client.post("/chat", json={"message": "Hi", "stream": True}).text)
    assert "".join(data["content"] for name, data in events if name == "delta") == text
    assert events[-1] == (
        "done",
        chat_reply(events[-1][1]["conversation_id"], text, [], "done", []),
    )
    assert memories(client) == {}


def test_invalid_markers_are_refused_and_reported(upstream, chat_sections, make_client):
    client = make_client(**chat_sections(agent=INLINE, memory={"validKeys": ["name", "city"]}))
    upstream.script(
        MAIN_MODEL,
        Reply(
            content=(
                "Done.[MEMORY: Bad Key = x][MEMORY: color = red][MEMORY: city][FORGET: name]"
                "[MEMORY: city = Rome]"
            )
        ),
    )
    body = client.post("/chat", json={"message": "Remember I live in Rome."}).json()
    valid = "Must be one of: name, city"
    assert body == chat_reply(
        body["conversation_id"],
        "Done.",
        [],
        "done",
        [
            {
                "op": "set",
                "key": "Bad Key",
                "value": "x",
                "error": f'Invalid key "Bad Key". {valid}',
            },
            {"op": "set", "key": "color", "value": "red", "error": f'Invalid key "color". {valid}'},
            {"op": "set", "key": "city", "error": "a [MEMORY: ...] marker needs 'key = value'"},
            {
                "op": "delete",
                "key": "name",
                "error": 'No memory with key "name". Nothing to delete.',
            },
            {"op": "set", "key": "city", "value": "Rome"},
        ],
    )
    assert memories(client) == {"city": "Rome"}


def test_a_marker_cut_off_by_max_tokens_is_not_applied(upstream, chat_sections, make_client):
    client = make_client(**chat_sections(agent=INLINE))
    upstream.script(
        MAIN_MODEL, Reply(chunks=["Sure.", "\n[MEMORY: name", " = Bo"], finish_reason="length")
    )
    events = sse_events(client.post("/chat", json={"message": "I'm Bob", "stream": True}).text)
    assert [e for e in events if e[0] == "delta"] == [("delta", {"content": "Sure."})]
    assert events[-1] == (
        "done",
        chat_reply(events[-1][1]["conversation_id"], "Sure.", [], "done", []),
    )
    assert memories(client) == {}


def test_v1_streamed_chunks_carry_no_marker(upstream, chat_sections, make_client):
    client = make_client(**chat_sections(agent=INLINE))
    for chunks in splits(REPLY)[::5]:
        upstream.script(MAIN_MODEL, Reply(chunks=chunks))
        response = client.post(
            "/v1/chat/completions",
            json={
                "model": f"openai/{MAIN_MODEL}",
                "stream": True,
                "messages": [{"role": "user", "content": "I live in Paris."}],
            },
        )
        assert response.status_code == 200
        lines = [line[len("data: ") :] for line in response.text.split("\n\n") if line]
        assert lines[-1] == "[DONE]"
        chunks_out = [json.loads(line) for line in lines[:-1]]
        assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks_out) == SHOWN
        assert chunks_out[-1]["choices"][0]["finish_reason"] == "stop"
    assert memories(client) == {"city": "Paris"}
    assert upstream.received(AGENT_MODEL) == []


def test_v1_whole_completion_is_clean(upstream, chat_sections, make_client):
    client = make_client(**chat_sections(agent=INLINE))
    upstream.script(MAIN_MODEL, Reply(content=REPLY))
    response = client.post(
        "/v1/chat/completions",
        json={"model": f"openai/{MAIN_MODEL}", "messages": [{"role": "user", "content": "Paris."}]},
    )
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"] == {"role": "assistant", "content": SHOWN}
    assert response.headers["x-memory-agent"] == "done"
    assert memories(client) == {"city": "Paris"}


def test_ollama_chat_and_generate_are_clean_whole_and_streamed(
    upstream, chat_sections, make_client
):
    client = make_client(**chat_sections(agent=INLINE))
    for path, body, text_of in [
        (
            "/api/chat",
            {"messages": [{"role": "user", "content": "Paris."}]},
            lambda line: line["message"]["content"],
        ),
        ("/api/generate", {"prompt": "Paris."}, lambda line: line["response"]),
    ]:
        for stream in (True, False):
            upstream.script(MAIN_MODEL, Reply(chunks=list(REPLY), content=REPLY))
            response = client.post(
                path, json={"model": f"openai/{MAIN_MODEL}", "stream": stream, **body}
            )
            assert response.status_code == 200
            lines = [json.loads(line) for line in response.text.splitlines() if line]
            assert "".join(text_of(line) for line in lines) == SHOWN
            assert lines[-1]["done"] is True
    assert memories(client) == {"city": "Paris"}
    assert upstream.received(AGENT_MODEL) == []


def test_a_forget_marker_is_in_the_history_with_the_conversation(
    upstream, chat_sections, make_client
):
    client = make_client(**chat_sections(agent=INLINE))
    client.put("/memory/name", json={"value": "Ada"})
    upstream.script(MAIN_MODEL, Reply(content="Forgotten.[FORGET: name]"))
    response = client.post(
        "/v1/chat/completions",
        headers={"X-Conversation-Id": "c-1"},
        json={
            "model": f"openai/{MAIN_MODEL}",
            "messages": [{"role": "user", "content": "Forget it"}],
        },
    )
    assert response.json()["choices"][0]["message"]["content"] == "Forgotten."
    assert memories(client) == {}
    assert client.get("/memory/history").json()["changes"][0] == {
        "id": 2,
        "key": "name",
        "op": "delete",
        "old_value": "Ada",
        "new_value": None,
        "source": "agent",
        "conversation_id": "c-1",
        "at": ISO_TIME,
    }


def test_placement_is_checked_and_inline_needs_no_agent_model() -> None:
    config = Config.model_validate({"memory": {"agent": {"placement": "inline"}}})
    assert (config.agent_status(), config.inline_memory()) == (
        (True, "inline: the main model writes memory markers in its reply"),
        True,
    )
    assert Config().inline_memory() is False
    with pytest.raises(ValidationError) as caught:
        Config.model_validate({"memory": {"agent": {"placement": "both"}}})
    assert [(e["loc"], e["type"]) for e in caught.value.errors()] == [
        (("memory", "agent", "placement"), "literal_error")
    ]


def test_a_temporary_request_gets_no_marker_instructions(upstream, chat_sections, make_client):
    client = make_client(**chat_sections(agent=INLINE))
    upstream.script(MAIN_MODEL, Reply(content="Hi [FORGET: name]"))
    body = client.post("/chat", json={"message": "Hi", "memory": False}).json()
    assert body == chat_reply(body["conversation_id"], "Hi [FORGET: name]", [], "skipped", [])
    assert upstream.received(MAIN_MODEL)[0].system == SYSTEM_PROMPT


def test_a_reply_of_markers_only_is_an_empty_reply(upstream, chat_sections, make_client):
    client = make_client(**chat_sections(agent=INLINE))
    for stream in (False, True):
        upstream.script(
            MAIN_MODEL,
            Reply(chunks=["[MEMORY: na", "me = Ada]\n"], content="[MEMORY: name = Ada]\n"),
        )
        response = client.post("/chat", json={"message": "I'm Ada.", "stream": stream})
        body = sse_events(response.text)[-1][1] if stream else response.json()
        assert body == chat_reply(
            body["conversation_id"],
            "",
            ["name"] if stream else [],
            "done",
            [{"op": "set", "key": "name", "value": "Ada"}],
        )
        stored = client.get(f"/conversations/{body['conversation_id']}").json()["messages"]
        assert [(m["role"], m["content"]) for m in stored] == [
            ("user", "I'm Ada."),
            ("assistant", ""),
        ]
    assert memories(client) == {"name": "Ada"}


def test_a_marker_the_client_left_before_is_not_applied(upstream, chat_sections, make_server):
    server = make_server(**chat_sections(agent=INLINE))
    pieces = ["Sure", " thing.", "\n[MEMORY: name", *(["x"] * 50), " = Ada]"]
    upstream.script(MAIN_MODEL, Reply(chunks=pieces, chunk_delay=0.1))
    body = {
        "model": f"openai/{MAIN_MODEL}",
        "stream": True,
        "messages": [{"role": "user", "content": "I'm Ada."}],
    }
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body) as response:
        seen = ""
        for line in response.iter_lines():
            if line.startswith("data: {"):
                seen += json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
            if seen == "Sure thing.":
                break
    upstream.wait_ended(upstream.received(MAIN_MODEL)[0], timeout=10)
    assert httpx.get(f"{server.url}/memory").json()["memories"] == []
    assert httpx.get(f"{server.url}/memory/history").json()["changes"] == []


def test_markers_past_sixteen_are_reported_and_not_applied(upstream, chat_sections, make_client):
    client = make_client(**chat_sections(agent=INLINE))
    upstream.script(
        MAIN_MODEL, Reply(content="Ok." + "".join(f"[MEMORY: k{i} = v]" for i in range(17)))
    )
    body = client.post("/chat", json={"message": "Remember these."}).json()
    assert body == chat_reply(
        body["conversation_id"],
        "Ok.",
        [],
        "done",
        [
            *({"op": "set", "key": f"k{i}", "value": "v"} for i in range(16)),
            {
                "op": "set",
                "key": "k16",
                "value": "v",
                "error": "not applied: at most 16 markers per reply",
            },
        ],
    )
    assert sorted(memories(client)) == sorted(f"k{i}" for i in range(16))


class Memory:
    """A memory service that notes the markers handed to it (for `MainCall` alone)."""

    config = Config()

    def __init__(self) -> None:
        self.applied: list[list[Marker]] = []

    def apply_markers(self, memory: Any, user_id: str, markers: list[Marker]) -> None:
        self.applied.append(list(markers))

    def main_ended(self, memory: Any) -> None:
        pass


class Chunks:
    """A client that streams `chunks` and stops (no finish_reason)."""

    def __init__(self, chunks: list[dict[str, Any]]) -> None:
        self.chunks = chunks

    async def stream(self, *args: Any, **kwargs: Any) -> AsyncGenerator[dict[str, Any], None]:
        for chunk in self.chunks:
            yield chunk


async def contents(chunks: AsyncIterator[dict[str, Any]]) -> AsyncGenerator[str, None]:
    async for chunk in chunks:
        yield chunk["choices"][0]["delta"]["content"]


def test_a_stream_that_ends_without_a_finish_reason_releases_what_was_held() -> None:
    def chunk(text: str) -> dict[str, Any]:
        return {
            "id": "c",
            "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
        }

    async def run() -> tuple[list[str], list[list[Marker]]]:
        memory = Memory()
        call = MainCall(
            memory,
            Chunks([chunk("Hi [FORGET: a]"), chunk(" [M")]),  # type: ignore[arg-type]
            SimpleNamespace(inline=True),
            Target("m"),
            [],
            "alice",
        )  # type: ignore[arg-type]
        stream = await call.stream(contents, str)  # type: ignore[arg-type]
        pieces = [piece async for piece in stream]
        await stream.aclose()
        return pieces, memory.applied

    assert asyncio.run(run()) == (["Hi", "", "  [M"], [[Marker("delete", "a")]])


def test_an_upstream_answer_of_the_wrong_shape_is_still_the_routes_to_judge(
    upstream, chat_sections, make_client
):
    """The marker filter reads only what has the shape it expects: a malformed answer goes on
    to the route's own checks (a 502 on `/api`, passed unchanged on `/v1`), never a 500."""
    client = make_client(**chat_sections(agent=INLINE))
    answer = {"id": "x", "object": "chat.completion", "model": MAIN_MODEL}
    error = "the model call failed: {} (a malformed response)"
    for choices, problem in [
        ("nope", "choices is not an array"),
        (["nope"], "choices[0] is not an object"),
        ([{"index": 0, "message": "hi"}], "choices[0].message is missing or not an object"),
    ]:
        upstream.script(MAIN_MODEL, Reply(raw=json.dumps({**answer, "choices": choices}).encode()))
        response = client.post(
            "/api/chat",
            json={
                "model": f"openai/{MAIN_MODEL}",
                "stream": False,
                "messages": [{"role": "user", "content": "Paris."}],
            },
        )
        assert (response.status_code, response.json()) == (502, {"error": error.format(problem)})
    upstream.script(MAIN_MODEL, Reply(raw=json.dumps({**answer, "choices": "nope"}).encode()))
    response = client.post(
        "/v1/chat/completions",
        json={"model": f"openai/{MAIN_MODEL}", "messages": [{"role": "user", "content": "Paris."}]},
    )
    assert (response.status_code, response.json()) == (200, {**answer, "choices": "nope"})

    first = {
        "id": "x",
        "object": "chat.completion.chunk",
        "model": MAIN_MODEL,
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": "a"}}],
    }
    for choices, problem in [
        ("nope", "a chunk's choices is not an array"),
        (["nope"], "a chunk's choice is not an object"),
    ]:
        events = [first, {**first, "choices": choices}]
        upstream.script(
            MAIN_MODEL,
            Reply(
                raw=b"".join(b"data: " + json.dumps(event).encode() + b"\n\n" for event in events)
                + b"data: [DONE]\n\n"
            ),
        )
        response = client.post(
            "/api/chat",
            json={
                "model": f"openai/{MAIN_MODEL}",
                "messages": [{"role": "user", "content": "Paris."}],
            },
        )
        lines = [json.loads(line) for line in response.text.splitlines() if line]
        assert (
            response.status_code,
            [line["message"]["content"] for line in lines[:-1]],
            lines[-1],
        ) == (200, ["a"], {"error": error.format(problem)})


class BrokenStore(MemoryStore):
    """A store whose writes fail as a bug would: not a refusal (`KvmemError`)."""

    def set(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the disk caught fire")


def test_a_marker_write_that_fails_is_the_agent_s_last_error(database, tokens):
    config = Config.model_validate({"memory": {"agent": INLINE}})
    store = BrokenStore(database, MemoryRules.from_config(config.memory), tokens)
    agent = MemoryAgent(config, store, None, None)  # type: ignore[arg-type]  # no model call

    async def markers_applied() -> AgentRun:
        run = AgentRun.pending("ada", "c-1")
        agent.apply_markers(run, "ada", [Marker("set", "city", "Paris")])
        run.main_ended(3)
        assert run.task is not None
        await asyncio.wait({run.task})
        return run

    run = asyncio.run(markers_applied())
    assert run.task is not None and agent.last_error is not None
    assert (run.state, run.task.exception(), agent.outcomes) == ("failed", None, {"failed": 1})
    assert (agent.last_error.code, agent.last_error.upstream_status, agent.last_error.message) == (
        "internal_error",
        None,
        "RuntimeError: the disk caught fire",
    )
