"""Inline markers and several choices (`"n": 2`, agent/reply_markers.py): one filter per
choice `index`, whole, streamed and interleaved; markers cut out of every choice, applied
from choice 0 only."""

from __future__ import annotations

import json
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.apps import MAIN_MODEL, wait_until
from tests.support.upstream import COMPLETION_ID, CREATED, Reply

# Every test here runs on the direct client and on litellm.
pytestmark = pytest.mark.both_clients

MODEL_ID = f"openai/{MAIN_MODEL}"
INLINE = {"placement": "inline"}
REQUEST = {"model": MODEL_ID, "messages": [{"role": "user", "content": "I live in Rome"}], "n": 2}


def memories(client: Any) -> dict[str, str]:
    return {m["key"]: m["value"] for m in client.get("/memory").json()["memories"]}


def turns_done(client: Any) -> float:
    """How many turns' markers have been applied (the writes end after the reply)."""
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for name, labels, value, *_ in family.samples:
            if name == "kvmem_agent_runs_total" and labels["state"] == "done":
                return value
    return 0.0


def memories_after(client: Any, turns: int) -> dict[str, str]:
    """The memory once `turns` turns' markers have been applied."""
    wait_until(lambda: turns_done(client) == turns, what=f"{turns} turns done")
    return memories(client)


def whole(*contents: str) -> bytes:
    return json.dumps(
        {
            "id": COMPLETION_ID,
            "object": "chat.completion",
            "created": CREATED,
            "model": MAIN_MODEL,
            "choices": [
                {
                    "index": index,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                }
                for index, content in enumerate(contents)
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        }
    ).encode()


def chunk(index: int, content: str | None, finish: str | None = None) -> dict[str, Any]:
    delta = {} if content is None else {"content": content}
    return {
        "id": COMPLETION_ID,
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": MAIN_MODEL,
        "choices": [{"index": index, "delta": delta, "finish_reason": finish}],
    }


def streamed(client: Any) -> list[dict[str, Any]]:
    response = client.post("/v1/chat/completions", json={**REQUEST, "stream": True})
    assert response.status_code == 200, response.text
    data = [line[6:] for line in response.text.split("\n") if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(item) for item in data[:-1]]


def texts(chunks: list[dict[str, Any]]) -> dict[int, str]:
    """Each choice's text, joined from its deltas."""
    joined: dict[int, str] = {}
    for item in chunks:
        for choice in item["choices"]:
            text = choice["delta"].get("content") or ""
            joined[choice["index"]] = joined.get(choice["index"], "") + text
    return joined


def test_whole_markers_are_cut_from_every_choice_and_applied_from_choice_0(
    make_client, chat_sections, upstream
):
    client = make_client(**chat_sections(agent=INLINE))
    upstream.script(
        MAIN_MODEL,
        Reply(raw=whole("Noted.\n[MEMORY: city = Rome]", "Sure.\n[MEMORY: city = Evil]")),
    )
    response = client.post("/v1/chat/completions", json=REQUEST)
    assert response.status_code == 200, response.text
    assert [c["message"]["content"] for c in response.json()["choices"]] == ["Noted.", "Sure."]
    assert memories_after(client, 1) == {"city": "Rome"}


def test_a_marker_in_choice_1_alone_is_cut_and_never_applied(make_client, chat_sections, upstream):
    client = make_client(**chat_sections(agent=INLINE))
    upstream.script(MAIN_MODEL, Reply(raw=whole("Hello.", "Hi.\n[MEMORY: city = Evil]")))
    assert [
        c["message"]["content"]
        for c in client.post("/v1/chat/completions", json=REQUEST).json()["choices"]
    ] == ["Hello.", "Hi."]
    upstream.script(
        MAIN_MODEL,
        Reply(
            events=[
                chunk(0, "Hello."),
                chunk(1, "Hi.[MEMORY: city = Evil]"),
                chunk(0, None, "stop"),
                chunk(1, None, "stop"),
            ]
        ),
    )
    assert texts(streamed(client)) == {0: "Hello.", 1: "Hi."}
    assert memories_after(client, 2) == {}


def test_interleaved_choices_each_hold_their_own_split_marker(make_client, chat_sections, upstream):
    client = make_client(**chat_sections(agent=INLINE))
    events = [
        chunk(0, "Noted. [MEM"),
        chunk(1, "Sure. [MEMORY: ci"),
        chunk(0, "ORY: city = Rome]"),
        chunk(1, "ty = Evil]"),
        chunk(0, None, "stop"),
        chunk(1, None, "stop"),
    ]
    upstream.script(MAIN_MODEL, Reply(events=events))
    chunks = streamed(client)
    assert texts(chunks) == {0: "Noted.", 1: "Sure."}
    for item in chunks:
        for choice in item["choices"]:
            assert "[" not in (choice["delta"].get("content") or ""), item
    assert memories_after(client, 1) == {"city": "Rome"}


def test_held_text_goes_out_with_its_choices_finishing_chunk(make_client, chat_sections, upstream):
    client = make_client(**chat_sections(agent=INLINE))
    events = [
        chunk(0, "See [MEM"),
        chunk(1, "Look [FORG"),
        chunk(0, None, "stop"),
        chunk(1, "!", "stop"),
    ]
    upstream.script(MAIN_MODEL, Reply(events=events))
    chunks = streamed(client)
    finishing = [
        choice["delta"].get("content")
        for item in chunks
        for choice in item["choices"]
        if choice["index"] == 0 and choice.get("finish_reason") == "stop"
    ]
    # With it, not in a chunk after it (a client stops reading a choice at its finish).
    assert finishing == [" [MEM"]
    # (litellm passes on one finish_reason only, so choice 1's is not checked.)
    assert texts(chunks) == {0: "See [MEM", 1: "Look [FORG!"}
