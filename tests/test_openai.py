"""/v1/chat/completions and /v1/models, driven by the official openai SDK against a live kvmem."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from tests.support.apps import AGENT_MODEL, MAIN_MODEL, live_services, wait_until
from tests.support.bounds import at_most
from tests.support.upstream import Reply

# Every test here runs on the direct client and on litellm (see conftest `chat_client`).
pytestmark = pytest.mark.both_clients

MODEL_ID = f"openai/{MAIN_MODEL}"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


@pytest.fixture
def server(make_server, chat_sections):
    return make_server(**chat_sections(chat={"models": ["openai/other-model"]}))


@pytest.fixture
def sdk(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def user_messages(text="Hello"):
    return [{"role": "user", "content": text}]


def test_non_streamed_completion_keeps_openai_shape(sdk, upstream):
    upstream.script(MAIN_MODEL, Reply(content="Hi there!"))
    completion = sdk.chat.completions.create(model=MODEL_ID, messages=user_messages())
    assert completion.model_dump(exclude_none=True) == {
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "created": 1_764_000_000,
        "model": MAIN_MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hi there!"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


def test_memory_is_injected_and_agent_reads_the_request(sdk, server, upstream):
    httpx.put(f"{server.url}/memory/user_preferences", json={"value": "Prefers short answers."})
    messages = [
        {"role": "system", "content": "Be nice."},
        {"role": "user", "content": "First question"},
        {"role": "assistant", "content": "First answer"},
        {"role": "user", "content": "Remember I like tea"},
    ]
    sdk.chat.completions.create(model=MODEL_ID, messages=messages)
    main = upstream.received(MAIN_MODEL)[0]
    system = main.messages[0]
    assert system["role"] == "system"
    assert system["content"].startswith("Be nice.\n\n")
    assert "] user_preferences: Prefers short answers.\n</user_memory>" in system["content"]
    assert main.messages[1:] == messages[1:]
    agent = upstream.wait_for(AGENT_MODEL)[0]
    chat = agent.messages[1]["content"].split("# Current Chat:\n", 1)[1]
    assert chat == "Human: First question\nAI: First answer\nHuman: Remember I like tea"


def test_system_message_is_added_when_missing(sdk, server, upstream):
    httpx.put(f"{server.url}/memory/learned_facts", json={"value": "Has two cats."})
    sdk.chat.completions.create(model=MODEL_ID, messages=user_messages())
    sent = upstream.received(MAIN_MODEL)[0].messages
    assert [m["role"] for m in sent] == ["system", "user"]
    assert "learned_facts: Has two cats." in sent[0]["content"]


def test_x_memory_off_turns_injection_and_agent_off(server, upstream):
    httpx.put(f"{server.url}/memory/learned_facts", json={"value": "Has two cats."})
    sdk = openai.OpenAI(
        base_url=f"{server.url}/v1",
        api_key="unused",
        max_retries=0,
        default_headers={"X-Memory": "off"},
    )
    agent = live_services(server).agent
    sdk.chat.completions.create(model=MODEL_ID, messages=user_messages())
    assert upstream.received(MAIN_MODEL)[0].messages == user_messages()
    # A run is tracked from before the main call until it ends (in flight, then counted in
    # its outcome), so once the reply is here, a run started for it would show now.
    assert (agent.in_flight, dict(agent.outcomes)) == (0, {})
    # The same request without the header does start one, seen the same way.
    plain = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    plain.chat.completions.create(model=MODEL_ID, messages=user_messages("Again"))
    wait_until(lambda: agent.in_flight == 0, what="the agent finishing")
    assert dict(agent.outcomes) == {"done": 1}
    (request,) = upstream.received(AGENT_MODEL)
    assert request.messages[1]["content"].endswith("# Current Chat:\nHuman: Again")


def test_request_fields_pass_through(sdk, upstream):
    sdk.chat.completions.create(
        model=MODEL_ID,
        messages=user_messages(),
        temperature=0.2,
        max_tokens=50,
        stop=["\n\n"],
        seed=7,
        n=1,
        response_format={"type": "json_object"},
        tools=TOOLS,
        tool_choice="auto",
    )
    body = upstream.received(MAIN_MODEL)[0].body
    for field, value in {
        "temperature": 0.2,
        "max_tokens": 50,
        "stop": ["\n\n"],
        "seed": 7,
        "n": 1,
        "response_format": {"type": "json_object"},
        "tools": TOOLS,
        "tool_choice": "auto",
    }.items():
        assert body[field] == value, field


def test_tool_calls_are_returned_unchanged(sdk, upstream):
    call = {"id": "call_w1", "name": "get_weather", "arguments": '{"city": "Oslo"}'}
    upstream.script(MAIN_MODEL, Reply(content=None, tool_calls=[call]))
    completion = sdk.chat.completions.create(model=MODEL_ID, messages=user_messages(), tools=TOOLS)
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert [c.model_dump() for c in choice.message.tool_calls] == [
        {
            "id": "call_w1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
        }
    ]


def test_streamed_tool_calls_reassemble(sdk, upstream):
    call = {"id": "call_w2", "name": "get_weather", "arguments": '{"city": "Lima"}'}
    upstream.script(MAIN_MODEL, Reply(content=None, tool_calls=[call]))
    stream = sdk.chat.completions.create(
        model=MODEL_ID, messages=user_messages(), tools=TOOLS, stream=True
    )
    name, arguments, ids, finish = "", "", [], None
    for chunk in stream:
        for choice in chunk.choices:
            for fragment in choice.delta.tool_calls or []:
                ids += [fragment.id] if fragment.id else []
                name += fragment.function.name or ""
                arguments += fragment.function.arguments or ""
            finish = choice.finish_reason or finish
    assert (ids, name, arguments, finish) == (
        ["call_w2"],
        "get_weather",
        '{"city": "Lima"}',
        "tool_calls",
    )


def check_chunk_schema(chunk: dict) -> None:
    assert chunk["object"] == "chat.completion.chunk"
    assert isinstance(chunk["id"], str) and chunk["id"]
    assert isinstance(chunk["created"], int)
    assert chunk["model"] == MAIN_MODEL
    assert isinstance(chunk["choices"], list)
    for choice in chunk["choices"]:
        assert isinstance(choice["index"], int)
        assert isinstance(choice["delta"], dict)
        assert set(choice["delta"]) <= {"role", "content", "tool_calls", "refusal"}
        assert choice.get("finish_reason") in (
            None,
            "stop",
            "length",
            "tool_calls",
            "content_filter",
        )


def raw_stream(server, body: dict, headers: dict | None = None) -> list[str]:
    with httpx.stream(
        "POST", f"{server.url}/v1/chat/completions", json=body, headers=headers, timeout=10
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        return [line for line in response.iter_lines() if line]


def test_stream_chunks_match_openai_schema_and_end_with_done(server, upstream):
    upstream.script(MAIN_MODEL, Reply(chunks=["Hel", "lo", "!"]))
    lines = raw_stream(server, {"model": MODEL_ID, "messages": user_messages(), "stream": True})
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    for chunk in chunks:
        check_chunk_schema(chunk)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "Hello!"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_include_usage_sends_a_final_usage_chunk(sdk, upstream):
    upstream.script(MAIN_MODEL, Reply(content="Fine."))
    chunks = list(
        sdk.chat.completions.create(
            model=MODEL_ID,
            messages=user_messages(),
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].choices == []
    usage = chunks[-1].usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (10, 5, 15)
    assert all(chunk.usage is None for chunk in chunks[:-1])


def test_models_list(sdk):
    assert [model.id for model in sdk.models.list()] == [MODEL_ID, "openai/other-model"]


def test_extra_model_is_served_through_the_same_upstream(sdk, upstream):
    sdk.chat.completions.create(model="openai/other-model", messages=user_messages())
    assert len(upstream.received("other-model")) == 1


def test_unknown_model_is_not_found(sdk, upstream):
    with pytest.raises(openai.NotFoundError) as caught:
        sdk.chat.completions.create(model="gpt-unknown", messages=user_messages())
    assert caught.value.body["code"] == "model_not_found"
    assert caught.value.body["type"] == "invalid_request_error"
    assert upstream.received("gpt-unknown") == []


def test_upstream_500_is_a_502(sdk, upstream):
    upstream.script(MAIN_MODEL, Reply(status=500, error={"error": {"message": "boom"}}))
    with pytest.raises(openai.APIStatusError) as caught:
        sdk.chat.completions.create(model=MODEL_ID, messages=user_messages())
    assert caught.value.status_code == 502
    assert caught.value.body["code"] == "upstream_error"
    assert "boom" in caught.value.body["message"]


def test_upstream_429_is_a_rate_limit_with_retry_after(server, sdk, upstream):
    upstream.script(
        MAIN_MODEL,
        Reply(status=429, error={"error": {"message": "slow down"}}, headers={"Retry-After": "7"}),
    )
    with pytest.raises(openai.RateLimitError) as caught:
        sdk.chat.completions.create(model=MODEL_ID, messages=user_messages())
    assert caught.value.response.headers["retry-after"] == "7"
    assert caught.value.body["type"] == "rate_limit_error"


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_an_upstream_hang_is_a_504_after_chat_timeout(make_server, chat_sections, upstream, stream):
    timeout = 1
    server = make_server(**chat_sections(memory={"agent": None}, chat={"timeout": timeout}))
    upstream.script(MAIN_MODEL, Reply(hang=True))
    body = {"model": MODEL_ID, "messages": user_messages(), "stream": stream}
    # On litellm, time the call, not litellm's first import beside start-up, which a request
    # that comes sooner waits for (5.6 s against a 3 s bound once, in a loaded CI run).
    preloading = live_services(server).client.preloading
    if preloading is not None:
        preloading.join(120)
    started = time.monotonic()
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=30)
    elapsed = time.monotonic() - started
    # Before the first chunk, a streamed request fails like a plain one: a JSON error.
    assert (response.status_code, response.headers["content-type"]) == (504, "application/json")
    assert response.json() == {
        "error": {
            "code": "upstream_timeout",
            "message": "the model did not answer within 1 seconds",
            "type": "api_error",
            "param": None,
        }
    }
    assert timeout <= elapsed < at_most(timeout)
    (main,) = upstream.received(MAIN_MODEL)  # one attempt, no retry
    assert upstream.wait_ended(main).disconnected


def test_error_before_the_stream_starts_is_a_json_error(sdk, upstream):
    upstream.script(MAIN_MODEL, Reply(status=500, error={"error": {"message": "down"}}))
    with pytest.raises(openai.APIStatusError) as caught:
        list(sdk.chat.completions.create(model=MODEL_ID, messages=user_messages(), stream=True))
    assert caught.value.status_code == 502


def test_mid_stream_failure_makes_the_sdk_raise(server, sdk, upstream):
    upstream.script(MAIN_MODEL, Reply(chunks=["a", "b", "c", "d"], fail_after=3))
    received = []
    with pytest.raises(openai.APIError):
        for chunk in sdk.chat.completions.create(
            model=MODEL_ID, messages=user_messages(), stream=True
        ):
            received.append(chunk)
    assert received, "the chunks before the failure were forwarded"
    upstream.script(MAIN_MODEL, Reply(chunks=["a", "b", "c", "d"], fail_after=3))
    lines = raw_stream(server, {"model": MODEL_ID, "messages": user_messages(), "stream": True})
    last = json.loads(lines[-1].removeprefix("data: "))
    assert last["error"]["code"] == "upstream_error"
    assert "data: [DONE]" not in lines


def test_disconnect_mid_stream_cancels_the_upstream_call(server, upstream):
    upstream.script(MAIN_MODEL, Reply(chunks=[f"w{i} " for i in range(100)], chunk_delay=0.1))
    body = {"model": MODEL_ID, "messages": user_messages(), "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body) as response:
        lines = response.iter_lines()
        while "w1" not in next(lines):
            pass
    main = upstream.received(MAIN_MODEL)[0]
    upstream.wait_ended(main, timeout=5)
    assert main.disconnected
    assert main.ended - main.started < 5


def test_bad_request_bodies(server):
    for body, message in [
        ({"messages": user_messages()}, "'model' is required"),
        ({"model": MODEL_ID}, "'messages' must be a non-empty array"),
        ({"model": MODEL_ID, "messages": ["hi"]}, "messages[0] must be an object"),
        ({"model": MODEL_ID, "messages": user_messages(), "stream": "yes"}, "'stream'"),
    ]:
        response = httpx.post(f"{server.url}/v1/chat/completions", json=body)
        assert response.status_code == 400, body
        assert response.json()["error"]["code"] == "bad_request"
        assert message in response.json()["error"]["message"]


def test_service_key_uses_the_body_user_and_user_key_ignores_it(
    make_server, chat_sections, upstream, database
):
    from kvmem.server.credentials import KeyStore

    _, alice_key = KeyStore(database).create("alice")
    server = make_server(**chat_sections(auth={"mode": "keys", "service_keys": ["svc-secret"]}))
    as_service = openai.OpenAI(base_url=f"{server.url}/v1", api_key="svc-secret", max_retries=0)
    as_alice = openai.OpenAI(base_url=f"{server.url}/v1", api_key=alice_key, max_retries=0)
    headers = {"Authorization": "Bearer svc-secret", "X-User-Id": "bob"}
    httpx.put(f"{server.url}/memory/learned_facts", json={"value": "Bob fact"}, headers=headers)
    as_service.chat.completions.create(model=MODEL_ID, messages=user_messages(), user="bob")
    assert "Bob fact" in upstream.received(MAIN_MODEL)[0].system
    as_alice.chat.completions.create(model=MODEL_ID, messages=user_messages(), user="bob")
    assert "Bob fact" not in upstream.received(MAIN_MODEL)[1].system
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0).models.list()


def test_open_webui_forwarded_user_header_names_the_user(make_server, chat_sections, upstream):
    server = make_server(**chat_sections(auth={"mode": "keys", "service_keys": ["svc-secret"]}))
    carol = {"Authorization": "Bearer svc-secret", "X-OpenWebUI-User-Id": "carol-uuid-1"}
    put = httpx.put(
        f"{server.url}/memory/learned_facts", json={"value": "Carol fact"}, headers=carol
    )
    assert put.status_code == 201
    body = {"model": MODEL_ID, "messages": user_messages()}
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=carol)
    assert response.status_code == 200
    assert "Carol fact" in upstream.received(MAIN_MODEL)[0].system
    anonymous = httpx.post(
        f"{server.url}/v1/chat/completions",
        json=body,
        headers={"Authorization": "Bearer svc-secret"},
    )
    assert anonymous.status_code == 400
    assert anonymous.json()["error"]["code"] == "bad_request"
