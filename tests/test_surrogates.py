"""Surrogates in a model's answer (upstream/surrogates.py): a lone one becomes U+FFFD and is
counted, a pair split across streamed chunks is joined, on every chat route, whole and
streamed, on both clients; never a 500 or a cut stream."""

from __future__ import annotations

import json
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvmem.upstream.surrogates import ChunkSurrogates, clean_answer, may_hold_surrogates
from tests.support.apps import MAIN_MODEL, sse_events
from tests.support.upstream import Reply

# Every test using chat_sections runs on the direct client and on litellm.
pytestmark = pytest.mark.both_clients

MODEL_ID = f"openai/{MAIN_MODEL}"
ROUTES = ["/chat", "/v1/chat/completions", "/api/chat", "/api/generate"]
# A lone high surrogate inside a whole answer.
WHOLE = "a\ud800b"
# An emoji split across two chunks (as JavaScript servers cut strings), a lone low surrogate,
# and a high surrogate that ends the stream with no low half after it.
CHUNKS = ["a\ud83d", "\ude00b", "c\udc00", "\ud83d"]


def request_body(route: str, stream: bool) -> dict[str, Any]:
    if route == "/chat":
        return {"message": "hi", "stream": stream}
    if route == "/api/generate":
        return {"model": MODEL_ID, "prompt": "hi", "stream": stream}
    return {"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}], "stream": stream}


def whole_text(route: str, body: dict[str, Any]) -> str:
    if route == "/chat":
        return body["response"]
    if route == "/v1/chat/completions":
        return body["choices"][0]["message"]["content"]
    if route == "/api/chat":
        return body["message"]["content"]
    return body["response"]


def streamed_text(route: str, text: str) -> str:
    """The text a stream delivered; fails unless the stream ended as its route ends one."""
    if route == "/chat":
        events = sse_events(text)
        assert events[-1][0] == "done"
        return "".join(data["content"] for name, data in events if name == "delta")
    if route == "/v1/chat/completions":
        data = [line[6:] for line in text.split("\n") if line.startswith("data: ")]
        assert data[-1] == "[DONE]"
        chunks = [json.loads(item) for item in data[:-1]]
        return "".join(
            c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]
        )
    lines = [json.loads(line) for line in text.splitlines()]
    assert lines[-1]["done"] is True
    field = "response" if route == "/api/generate" else "message"
    pieces = [line[field] for line in lines]
    return "".join(p if isinstance(p, str) else p["content"] for p in pieces)


def surrogates_counted(client: Any) -> dict[str, float]:
    found = {}
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for name, labels, value, *_ in family.samples:
            if name == "kvmem_upstream_lone_surrogates_total":
                found[labels["kind"]] = value
    return found


@pytest.mark.parametrize("route", ROUTES)
def test_a_lone_surrogate_in_a_whole_answer_becomes_a_replacement_character(
    make_client, chat_sections, upstream, route
):
    client = make_client(**chat_sections())
    upstream.script(MAIN_MODEL, Reply(content=WHOLE))
    response = client.post(route, json=request_body(route, stream=False))
    assert response.status_code == 200, response.text
    assert whole_text(route, response.json()) == "a\ufffdb"
    assert surrogates_counted(client) == {"main": 1.0}


@pytest.mark.parametrize("route", ROUTES)
def test_a_split_pair_is_joined_and_lone_halves_replaced_in_a_stream(
    make_client, chat_sections, upstream, route
):
    client = make_client(**chat_sections())
    upstream.script(MAIN_MODEL, Reply(chunks=CHUNKS))
    response = client.post(route, json=request_body(route, stream=True))
    assert response.status_code == 200, response.text
    assert streamed_text(route, response.text) == "a\U0001f600bc\ufffd\ufffd"
    assert surrogates_counted(client) == {"main": 2.0}


def test_inline_markers_beside_surrogates_are_applied(make_client, chat_sections, upstream):
    client = make_client(**chat_sections(agent={"placement": "inline"}))
    upstream.script(
        MAIN_MODEL, Reply(chunks=["Noted \ud83d", "\ude00.\n[MEMORY: city = Ro\udc00", "me]"])
    )
    response = client.post("/chat", json={"message": "I live in Rome", "stream": True})
    assert response.status_code == 200, response.text
    events = sse_events(response.text)
    done = events[-1][1]
    assert done["response"] == "Noted \U0001f600."
    assert done["memory"]["agent"] == "done"
    assert done["memory"]["updates"] == [{"op": "set", "key": "city", "value": "Ro\ufffdme"}]
    assert client.get("/memory/city").json()["value"] == "Ro\ufffdme"


def chunk(index: int, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"id": "c", "choices": [{"index": index, "delta": delta, "finish_reason": finish}]}


def test_pairs_are_held_per_choice_and_field_until_the_next_chunk_of_that_choice():
    surrogates = ChunkSurrogates()
    seen = [
        chunk(0, {"content": "x\ud83d"}),
        chunk(1, {"content": "y\ud83d", "reasoning_content": "r\ud83d"}),
        chunk(0, {"content": "\ude00!"}),
        chunk(1, {"reasoning_content": "\ude00"}),  # content's half is now lone
        chunk(0, {"content": "z\ud83d"}),  # never continued: the stream ends
    ]
    counts = [surrogates.clean(c) for c in seen]
    assert [c["choices"][0]["delta"] for c in seen] == [
        {"content": "x"},
        {"content": "y", "reasoning_content": "r"},
        {"content": "\U0001f600!"},
        {"reasoning_content": "\U0001f600", "content": "\ufffd"},
        {"content": "z"},
    ]
    assert counts == [0, 0, 0, 1, 0]
    tail, count = surrogates.finish()
    assert (tail, count) == (
        {
            "id": "c",
            "choices": [{"index": 0, "delta": {"content": "\ufffd"}, "finish_reason": None}],
        },
        1,
    )
    assert surrogates.finish() == (None, 0)


def test_a_finishing_chunk_carries_a_held_half():
    surrogates = ChunkSurrogates()
    first, last = chunk(0, {"content": "a\ud83d"}), chunk(0, {}, finish="stop")
    assert [surrogates.clean(first), surrogates.clean(last)] == [0, 1]
    assert last["choices"][0] == {
        "index": 0,
        "delta": {"content": "\ufffd"},
        "finish_reason": "stop",
    }
    assert surrogates.finish() == (None, 0)


def test_every_string_of_an_answer_is_cleaned_keys_included():
    answer = {
        "id": "\udfff",
        "choices": [{"message": {"content": "ok", "x\ud800": ["\ud800\udc00"]}}],
    }
    cleaned, count = clean_answer(answer)
    assert cleaned == {
        "id": "\ufffd",
        "choices": [{"message": {"content": "ok", "x\ufffd": ["\U00010000"]}}],
    }
    assert count == 2


def test_raw_bytes_that_may_decode_to_surrogates_are_suspect():
    assert may_hold_surrogates(b'{"a": "\\ud800"}')
    assert may_hold_surrogates(b'{"a": "\\uDC00"}')
    assert may_hold_surrogates(b'{"a": "x"}' + b"\xed\xa0\x80")
    assert not may_hold_surrogates('{"a": "\\u00e9 \\ud7ff \U0001f600 \ud7ff"}'.encode())
