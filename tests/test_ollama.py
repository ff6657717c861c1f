"""Ollama's API (/api/chat, /api/generate, /api/tags, /api/show, /api/version, /api/ps),
driven by the official `ollama` Python client against a real `kvmem serve` whose main model and
memory agent are the scripted upstream."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest

from kvmem.config import Config
from kvmem.db.engine import Database
from kvmem.server.credentials import KeyStore
from tests.support.apps import AGENT_MODEL, MAIN_MODEL, set_memory, wait_until
from tests.support.matchers import ISO_TIME, entry
from tests.support.processes import ServeProcess
from tests.support.upstream import Reply, ScriptedUpstream

# One server for the module: its tests stay on one worker.
pytestmark = pytest.mark.xdist_group("ollama")

MODEL_ID = f"openai/{MAIN_MODEL}"
# The module's server is shared, so conftest's per-test `chat_client` cannot reach it: the
# run's forced client (KVMEM_TEST_CHAT_CLIENT, see conftest) is read here, `auto` otherwise.
CHAT_CLIENT = os.environ.get("KVMEM_TEST_CHAT_CLIENT") or "auto"
OTHER_ID = "ollama/llama3.1"
SERVICE_KEY = "svc-ollama-test-key"
# How long a test waits for one of its own requests to a server it started.
WAIT = 30.0
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city"}},
            "required": ["city"],
        },
    },
}
# A 1x1 PNG.
PNG = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
    )
).decode()


class Positive:
    """Equal to any positive int (durations in nanoseconds)."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, int) and not isinstance(other, bool) and other > 0

    def __repr__(self) -> str:
        return "<positive int>"


POSITIVE: Any = Positive()


def sections(upstream: ScriptedUpstream, folder: Path, **extra: Any) -> dict[str, Any]:
    return {
        "database": {"url": f"sqlite:///{folder / 'kvmem.db'}"},
        "chat": {
            "model": MODEL_ID,
            "models": [OTHER_ID],
            "api_base": upstream.url,
            "api_key": "main-key",
            "timeout": 10,
            "client": CHAT_CLIENT,
        },
        "memory": {
            "agent": {
                "provider": "openai",
                "model": AGENT_MODEL,
                "api_base": upstream.url,
                "api_key": "agent-key",
                "grace_seconds": 3,
            }
        },
        **extra,
    }


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedUpstream]:
    """One scripted upstream for the module's server (emptied before each test)."""
    server = ScriptedUpstream().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def served(
    upstream: ScriptedUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServeProcess]:
    """`kvmem serve` in local mode, started once for the module."""
    folder = tmp_path_factory.mktemp("ollama")
    process = ServeProcess(folder, sections(upstream, folder)).start()
    yield process
    process.stop()


@pytest.fixture
def server(served: ServeProcess, upstream: ScriptedUpstream) -> Iterator[ServeProcess]:
    """The module's server with an empty memory and a fresh upstream log."""
    httpx.delete(f"{served.url}/memory")
    with upstream._lock:
        upstream.requests.clear()
        upstream._replies.clear()
        upstream._defaults.clear()
    yield served
    # The agent of this test must be done before the next test reads the upstream: its runs
    # ended (one may not have sent its request yet, e.g. while litellm still imports), then
    # every request it sent.
    wait_until(lambda: agent_runs_in_flight(served) == 0, what="the server's agent runs ending")
    wait_until(lambda: all(r.ended for r in upstream.requests), what="upstream requests ending")


def agent_runs_in_flight(server: ServeProcess) -> float:
    """The server's `kvmem_agent_runs_in_flight`, read from its /metrics."""
    for line in httpx.get(f"{server.url}/metrics").text.splitlines():
        if line.startswith("kvmem_agent_runs_in_flight "):
            return float(line.split()[1])
    raise AssertionError("/metrics has no kvmem_agent_runs_in_flight")


@pytest.fixture
def make_ollama() -> Iterator[Callable[..., ollama.Client]]:
    """Official clients for a kvmem URL (`headers=` as the client takes them), closed after."""
    made: list[ollama.Client] = []

    def make(url: str, **headers: str) -> ollama.Client:
        made.append(ollama.Client(host=url, timeout=20, headers=headers))
        return made[-1]

    yield make
    for one in made:
        one.close()


@pytest.fixture
def client(server: ServeProcess, make_ollama: Callable[..., ollama.Client]) -> ollama.Client:
    return make_ollama(server.url)


def hello(text: str = "Hello") -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def raw_lines(url: str, path: str, body: dict[str, Any], **headers: str) -> list[dict[str, Any]]:
    """An NDJSON reply, parsed line by line (also checks the media type)."""
    with httpx.stream("POST", url + path, json=body, headers=headers, timeout=20) as response:
        assert response.headers["content-type"] == "application/x-ndjson"
        return [json.loads(line) for line in response.iter_lines() if line]


# --- models and server -------------------------------------------------------------------


def test_list_names_the_served_models(client: ollama.Client, server: ServeProcess) -> None:
    listed = client.list()
    assert [m.model for m in listed.models] == [MODEL_ID, OTHER_ID]
    body = httpx.get(f"{server.url}/api/tags").json()
    assert body == {
        "models": [
            {
                "name": model,
                "model": model,
                "modified_at": ISO_TIME,
                "size": 0,
                "digest": hashlib.sha256(model.encode()).hexdigest(),
                "details": {
                    "parent_model": "",
                    "format": "",
                    "family": family,
                    "families": [family],
                    "parameter_size": "",
                    "quantization_level": "",
                },
            }
            for model, family in ((MODEL_ID, "openai"), (OTHER_ID, "ollama"))
        ]
    }


def test_show_answers_details_and_capabilities(client: ollama.Client, server: ServeProcess) -> None:
    shown = client.show(MODEL_ID)
    assert (shown.capabilities, shown.details.family) == (["completion", "tools"], "openai")
    body = httpx.post(f"{server.url}/api/show", json={"model": f"{OTHER_ID}:latest"}).json()
    assert body == {
        "modelfile": "",
        "parameters": "",
        "template": "",
        "details": {
            "parent_model": "",
            "format": "",
            "family": "ollama",
            "families": ["ollama"],
            "parameter_size": "",
            "quantization_level": "",
        },
        "model_info": {},
        "capabilities": ["completion", "tools"],
        "modified_at": ISO_TIME,
    }
    with pytest.raises(ollama.ResponseError) as caught:
        client.show("nope")
    assert (caught.value.status_code, caught.value.error) == (
        404,
        f"model 'nope' not found; available: {MODEL_ID}, {OTHER_ID}",
    )


def test_version_and_running_models(server: ServeProcess) -> None:
    assert httpx.get(f"{server.url}/api/version").json() == {"version": "0.9.0"}
    assert httpx.get(f"{server.url}/api/ps").json() == {"models": []}


# --- chat ----------------------------------------------------------------------------------


def test_chat_not_streamed(client: ollama.Client, upstream: ScriptedUpstream) -> None:
    upstream.script(MAIN_MODEL, Reply(content="Hi there!"))
    reply = client.chat(model=MODEL_ID, messages=hello())
    assert reply.model_dump(exclude_none=True) == {
        "model": MODEL_ID,
        "created_at": ISO_TIME,
        "done": True,
        "done_reason": "stop",
        "total_duration": POSITIVE,
        "prompt_eval_count": 10,
        "eval_count": 5,
        "message": {"role": "assistant", "content": "Hi there!"},
    }
    (main,) = upstream.received(MAIN_MODEL)
    assert (main.body["messages"], main.body.get("stream")) == (hello(), None)


def test_chat_streams_ndjson_lines_ending_with_counts(
    client: ollama.Client, server: ServeProcess, upstream: ScriptedUpstream
) -> None:
    upstream.script(MAIN_MODEL, Reply(chunks=["Hel", "lo ", "you"]))
    parts = list(client.chat(model=MODEL_ID, messages=hello(), stream=True))
    assert [p.message.content for p in parts] == ["Hel", "lo ", "you", ""]
    assert [p.done for p in parts] == [False, False, False, True]
    assert parts[-1].model_dump(exclude_none=True) == {
        "model": MODEL_ID,
        "created_at": ISO_TIME,
        "done": True,
        "done_reason": "stop",
        "total_duration": POSITIVE,
        "prompt_eval_count": 10,
        "eval_count": 5,
        "message": {"role": "assistant", "content": ""},
    }
    (main,) = upstream.received(MAIN_MODEL)
    assert main.body["stream_options"] == {"include_usage": True}

    # The stream is the default, as on Ollama, and each line is one whole object.
    upstream.script(MAIN_MODEL, Reply(chunks=["a", "b"], finish_reason="length"))
    lines = raw_lines(server.url, "/api/chat", {"model": MODEL_ID, "messages": hello()})
    assert lines == [
        {
            "model": MODEL_ID,
            "created_at": ISO_TIME,
            "message": {"role": "assistant", "content": "a"},
            "done": False,
        },
        {
            "model": MODEL_ID,
            "created_at": ISO_TIME,
            "message": {"role": "assistant", "content": "b"},
            "done": False,
        },
        {
            "model": MODEL_ID,
            "created_at": ISO_TIME,
            "message": {"role": "assistant", "content": ""},
            "done": True,
            "done_reason": "length",
            "total_duration": POSITIVE,
            "prompt_eval_count": 10,
            "eval_count": 5,
        },
    ]


def test_counts_are_left_out_when_the_upstream_reports_none(
    client: ollama.Client, upstream: ScriptedUpstream
) -> None:
    nothing = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    upstream.script(
        MAIN_MODEL, Reply(content="Hi", usage=nothing), Reply(content="Hi", usage=nothing)
    )
    whole = client.chat(model=MODEL_ID, messages=hello())
    last = list(client.chat(model=MODEL_ID, messages=hello(), stream=True))[-1]
    for reply in (whole, last):
        assert (reply.done, reply.prompt_eval_count, reply.eval_count) == (True, None, None)


def test_options_format_and_images_are_translated(
    client: ollama.Client, upstream: ScriptedUpstream
) -> None:
    schema = {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}
    client.chat(
        model=MODEL_ID,
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is this?", "images": [PNG]},
        ],
        options={
            "temperature": 0.2,
            "top_p": 0.9,
            "seed": 7,
            "stop": ["END"],
            "num_predict": 64,
            "num_ctx": 4096,
            "top_k": 5,
        },
        format=schema,
        think=False,
        keep_alive="5m",
    )
    client.chat(model=MODEL_ID, messages=hello(), format="json", options={"num_predict": -1})
    first, second = upstream.received(MAIN_MODEL)
    assert first.body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
            ],
        },
    ]
    assert {k: v for k, v in first.body.items() if k not in ("messages", "model", "user")} == {
        "temperature": 0.2,
        "top_p": 0.9,
        "seed": 7,
        "stop": ["END"],
        "max_tokens": 64,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "response", "schema": schema},
        },
    }
    assert {k: v for k, v in second.body.items() if k not in ("messages", "model", "user")} == {
        "response_format": {"type": "json_object"},
    }


def test_a_tool_call_comes_back_in_ollama_shape_streamed_or_not(
    client: ollama.Client, upstream: ScriptedUpstream
) -> None:
    call = {"name": "get_weather", "arguments": {"city": "Paris"}}
    upstream.script(
        MAIN_MODEL, Reply(content=None, tool_calls=[call]), Reply(content=None, tool_calls=[call])
    )
    whole = client.chat(model=MODEL_ID, messages=hello("Weather in Paris?"), tools=[WEATHER_TOOL])
    parts = list(
        client.chat(
            model=MODEL_ID, messages=hello("Weather in Paris?"), tools=[WEATHER_TOOL], stream=True
        )
    )
    expected = [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]
    assert whole.message.model_dump(exclude_none=True) == {
        "role": "assistant",
        "content": "",
        "tool_calls": expected,
    }
    assert (whole.done, whole.done_reason) == (True, "stop")
    calls = [
        p.message.model_dump(exclude_none=True)["tool_calls"] for p in parts if p.message.tool_calls
    ]
    assert calls == [expected]
    assert (parts[-1].done, parts[-1].done_reason) == (True, "stop")
    for sent in upstream.received(MAIN_MODEL):
        assert sent.body["tools"] == [WEATHER_TOOL]

    # The answer goes back as Ollama sends it (no ids); upstream it is OpenAI's, ids paired.
    upstream.script(MAIN_MODEL, Reply(content="It is sunny."))
    answered = client.chat(
        model=MODEL_ID,
        tools=[WEATHER_TOOL],
        messages=[
            *hello("Weather in Paris?"),
            {"role": "assistant", "content": "", "tool_calls": expected},
            {"role": "tool", "content": "sunny, 21 C", "tool_name": "get_weather"},
        ],
    )
    assert answered.message.content == "It is sunny."
    assert upstream.received(MAIN_MODEL)[-1].body["messages"] == [
        *hello("Weather in Paris?"),
        # litellm drops the null content of a tool-calling turn; the direct client sends it.
        {
            "role": "assistant",
            **({} if CHAT_CLIENT == "litellm" else {"content": None}),
            "tool_calls": [
                {
                    "id": "call_1_0",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1_0", "content": "sunny, 21 C"},
    ]


def test_an_empty_chat_loads_the_model_without_a_call(
    client: ollama.Client, server: ServeProcess, upstream: ScriptedUpstream
) -> None:
    """`ollama run` sends a chat with no messages first, to load the model."""
    loaded = {
        "model": MODEL_ID,
        "created_at": ISO_TIME,
        "message": {"role": "assistant", "content": ""},
        "done": True,
        "done_reason": "load",
    }
    assert raw_lines(server.url, "/api/chat", {"model": MODEL_ID, "messages": []}) == [loaded]
    assert client.chat(model=MODEL_ID, messages=[]).model_dump(exclude_none=True) == loaded
    assert upstream.requests == []


def test_model_names_ollama_clients_send(
    client: ollama.Client, server: ServeProcess, upstream: ScriptedUpstream
) -> None:
    """A listed id, with Ollama's default tag `:latest`, and an `ollama/` id also by the
    upstream Ollama's own name."""
    for name in (MODEL_ID, f"{MODEL_ID}:latest"):
        assert client.chat(model=name, messages=hello()).model == MODEL_ID
    assert len(upstream.received(MAIN_MODEL)) == 2
    for name in (OTHER_ID, f"{OTHER_ID}:latest", "llama3.1", "llama3.1:latest"):
        assert client.show(name).details.family == "ollama", name
    for name in ("llama3.2", "main-model", "llama3.1:8b", f"{MODEL_ID}:7b"):
        with pytest.raises(ollama.ResponseError) as caught:
            client.chat(model=name, messages=hello())
        assert (caught.value.status_code, caught.value.error) == (
            404,
            f"model {name!r} not found; available: {MODEL_ID}, {OTHER_ID}",
        )
    assert len(upstream.received(MAIN_MODEL)) == 2


# --- generate ------------------------------------------------------------------------------


def test_generate_streamed_and_not_with_memory_in_system(
    client: ollama.Client, server: ServeProcess, upstream: ScriptedUpstream
) -> None:
    httpx.put(f"{server.url}/memory/learned_facts", json={"value": "Has two cats."})
    upstream.script(MAIN_MODEL, Reply(content="Why not?"), Reply(chunks=["Why ", "not?"]))
    whole = client.generate(model=MODEL_ID, prompt="Tell a joke", system="Be funny.")
    parts = list(client.generate(model=MODEL_ID, prompt="Tell a joke", stream=True))
    assert whole.model_dump(exclude_none=True) == {
        "model": MODEL_ID,
        "created_at": ISO_TIME,
        "done": True,
        "done_reason": "stop",
        "total_duration": POSITIVE,
        "prompt_eval_count": 10,
        "eval_count": 5,
        "response": "Why not?",
    }
    assert [(p.response, p.done) for p in parts] == [("Why ", False), ("not?", False), ("", True)]
    with_system, without = upstream.received(MAIN_MODEL)
    assert with_system.system.startswith("Be funny.\n\n")
    assert with_system.system.endswith("] learned_facts: Has two cats.\n</user_memory>")
    assert without.system == with_system.system.removeprefix("Be funny.\n\n")
    assert [m["role"] for m in with_system.messages] == ["system", "user"]
    assert with_system.messages[1] == {"role": "user", "content": "Tell a joke"}


# --- memory ----------------------------------------------------------------------------------


def test_the_memory_block_reaches_the_upstream_and_the_agent_reads_the_chat(
    client: ollama.Client, server: ServeProcess, upstream: ScriptedUpstream
) -> None:
    httpx.put(f"{server.url}/memory/user_preferences", json={"value": "Prefers short answers."})
    messages = [
        {"role": "system", "content": "Be nice."},
        {"role": "user", "content": "First question"},
        {"role": "assistant", "content": "First answer"},
        {"role": "user", "content": "Remember I like tea"},
    ]
    list(client.chat(model=MODEL_ID, messages=messages, stream=True))
    (main,) = upstream.received(MAIN_MODEL)
    assert main.system.startswith("Be nice.\n\n")
    assert main.system.endswith("] user_preferences: Prefers short answers.\n</user_memory>")
    assert main.messages[1:] == messages[1:]
    (agent,) = upstream.wait_for(AGENT_MODEL)
    chat = agent.messages[1]["content"].split("# Current Chat:\n", 1)[1]
    assert chat == "Human: First question\nAI: First answer\nHuman: Remember I like tea"


def test_an_agent_write_from_an_ollama_chat(
    client: ollama.Client, server: ServeProcess, upstream: ScriptedUpstream
) -> None:
    upstream.script(
        AGENT_MODEL,
        Reply(content=None, tool_calls=[set_memory("drink", "Likes tea")]),
        Reply(content="done"),
    )
    client.chat(model=MODEL_ID, messages=hello("Remember that I like tea"))
    wait_until(
        lambda: httpx.get(f"{server.url}/memory").json()["memories"] != [], what="the agent's write"
    )
    assert httpx.get(f"{server.url}/memory").json()["memories"] == [
        entry("drink", "Likes tea", 2, source="agent")
    ]


def test_x_memory_off_makes_the_chat_temporary(
    server: ServeProcess, upstream: ScriptedUpstream, make_ollama: Callable[..., ollama.Client]
) -> None:
    httpx.put(f"{server.url}/memory/learned_facts", json={"value": "Has two cats."})
    off = make_ollama(server.url, **{"X-Memory": "off"})
    off.chat(model=MODEL_ID, messages=hello())
    off.generate(model=MODEL_ID, prompt="Hello")
    assert [r.messages for r in upstream.requests] == [hello(), hello()]


# --- failures ------------------------------------------------------------------------------


def test_an_upstream_failure_before_the_first_line_is_an_ollama_error(
    client: ollama.Client, server: ServeProcess, upstream: ScriptedUpstream
) -> None:
    upstream.script(MAIN_MODEL, *[Reply(status=500, error={"error": {"message": "down"}})] * 3)
    for stream in (False, True):
        with pytest.raises(ollama.ResponseError) as caught:
            list(
                client.chat(model=MODEL_ID, messages=hello(), stream=True)
            ) if stream else client.chat(model=MODEL_ID, messages=hello())
        assert caught.value.status_code == 502
        assert "down" in caught.value.error
    response = httpx.post(f"{server.url}/api/generate", json={"model": MODEL_ID, "prompt": "hi"})
    assert response.status_code == 502
    assert list(response.json()) == ["error"]
    assert response.json()["error"].startswith("the model call failed: ")


def test_an_upstream_failure_after_the_first_line_is_a_last_error_line(
    client: ollama.Client, server: ServeProcess, upstream: ScriptedUpstream
) -> None:
    upstream.script(
        MAIN_MODEL,
        Reply(chunks=["a", "b", "c", "d"], fail_after=3),
        Reply(chunks=["a", "b", "c", "d"], fail_after=3),
    )
    received = []
    with pytest.raises(ollama.ResponseError) as caught:
        for part in client.chat(model=MODEL_ID, messages=hello(), stream=True):
            received.append(part.message.content)
    assert received == ["a", "b"]
    assert caught.value.error.startswith("the model call failed: ")
    lines = raw_lines(server.url, "/api/generate", {"model": MODEL_ID, "prompt": "hi"})
    assert [line.get("response") for line in lines[:-1]] == ["a", "b"]
    assert list(lines[-1]) == ["error"]
    assert lines[-1]["error"].startswith("the model call failed: ")


def completion_with(**fields: Any) -> bytes:
    """A non-streamed upstream answer: a valid completion with `fields` replaced."""
    answer = {
        "id": "x",
        "object": "chat.completion",
        "model": MAIN_MODEL,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
    return json.dumps({**answer, **fields}).encode()


MALFORMED_ANSWERS = {
    "choices a string": (completion_with(choices="nope"), "choices is not an array"),
    "choices of strings": (completion_with(choices=["nope"]), "choices[0] is not an object"),
    "usage a string": (completion_with(usage="many"), "usage is not an object"),
    "no message": (
        completion_with(choices=[{"index": 0, "finish_reason": "stop"}]),
        "choices[0].message is missing or not an object",
    ),
    "content a number": (
        completion_with(choices=[{"index": 0, "message": {"role": "assistant", "content": 7}}]),
        "the message's content is not a string",
    ),
    "tool_calls an object": (
        completion_with(
            choices=[
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "", "tool_calls": {"a": 1}},
                }
            ]
        ),
        "the message's tool_calls is not an array",
    ),
    "the answer an array": (b"[1, 2]", "the answer has no choices"),
}


@pytest.mark.parametrize("path", ["/api/chat", "/api/generate"])
@pytest.mark.parametrize("name", list(MALFORMED_ANSWERS))
def test_an_upstream_answer_of_the_wrong_shape_is_a_502_in_ollama_shape(
    server: ServeProcess, upstream: ScriptedUpstream, name: str, path: str
) -> None:
    raw, problem = MALFORMED_ANSWERS[name]
    upstream.script(MAIN_MODEL, Reply(raw=raw))
    body = {
        "model": MODEL_ID,
        "stream": False,
        **({"messages": hello()} if path == "/api/chat" else {"prompt": "hi"}),
    }
    response = httpx.post(f"{server.url}{path}", json=body, timeout=20)
    assert (response.status_code, response.json()) == (
        502,
        {"error": f"the model call failed: {problem} (a malformed response)"},
    )


def sse(*events: Any) -> bytes:
    return b"".join(b"data: " + json.dumps(event).encode() + b"\n\n" for event in events)


def chunk(**fields: Any) -> dict[str, Any]:
    return {"id": "x", "object": "chat.completion.chunk", "model": MAIN_MODEL, **fields}


FIRST = chunk(choices=[{"index": 0, "delta": {"role": "assistant", "content": "a"}}])
MALFORMED_CHUNKS = {
    "choices a string": (chunk(choices="nope"), "a chunk's choices is not an array"),
    "usage a string": (chunk(choices=[], usage="many"), "usage is not an object"),
    "delta a string": (
        chunk(choices=[{"index": 0, "delta": "b"}]),
        "a chunk's delta is not an object",
    ),
    "tool_calls a string": (
        chunk(choices=[{"index": 0, "delta": {"tool_calls": "f"}}]),
        "a delta's tool_calls is not an array",
    ),
    "the chunk an array": ([1], "a stream event is not an object"),
}


@pytest.mark.parametrize("name", list(MALFORMED_CHUNKS))
def test_a_streamed_chunk_of_the_wrong_shape_ends_the_stream_with_an_error_line(
    server: ServeProcess, upstream: ScriptedUpstream, name: str
) -> None:
    bad, problem = MALFORMED_CHUNKS[name]
    upstream.script(MAIN_MODEL, Reply(raw=sse(FIRST, bad) + b"data: [DONE]\n\n"))
    lines = raw_lines(server.url, "/api/chat", {"model": MODEL_ID, "messages": hello()})
    assert [line["message"]["content"] for line in lines[:-1]] == ["a"]
    assert lines[-1] == {"error": f"the model call failed: {problem} (a malformed response)"}


def test_a_client_leaving_cancels_the_upstream(
    server: ServeProcess, upstream: ScriptedUpstream
) -> None:
    upstream.script(MAIN_MODEL, Reply(chunks=[f"w{i} " for i in range(100)], chunk_delay=0.1))
    body = {"model": MODEL_ID, "messages": hello()}
    with httpx.stream("POST", f"{server.url}/api/chat", json=body, timeout=20) as response:
        lines = response.iter_lines()
        while "w1" not in next(lines):
            pass
    (main,) = upstream.received(MAIN_MODEL)
    assert upstream.wait_ended(main, timeout=5).disconnected


def test_bad_requests_and_unknown_routes_answer_in_ollama_shape(server: ServeProcess) -> None:
    for method, path, body, status, message in [
        (
            "POST",
            "/api/chat",
            {"messages": hello()},
            400,
            "invalid request body: model: Field required",
        ),
        (
            "POST",
            "/api/chat",
            {"model": MODEL_ID, "messages": [{"role": "robot"}]},
            400,
            "invalid request body: messages.0.role: Input should be 'system', 'user', 'assistant' "
            "or 'tool'",
        ),
        (
            "POST",
            "/api/chat",
            {"model": MODEL_ID, "messages": hello(), "stream": "no"},
            400,
            "invalid request body: stream: Input should be a valid boolean",
        ),
        (
            "POST",
            "/api/generate",
            {"model": MODEL_ID, "prompt": 5},
            400,
            "invalid request body: prompt: Input should be a valid string",
        ),
        (
            "POST",
            "/api/generate",
            {"model": MODEL_ID, "prompt": "hi", "images": ["not an image!"]},
            400,
            "invalid request body: images: Value error, images[0] is not base64-encoded image data",
        ),
        (
            "POST",
            "/api/generate",
            {"model": MODEL_ID, "prompt": "hi", "images": ["aGVsbG8="]},
            400,
            "invalid request body: images: Value error, images[0] is not a PNG, JPEG, GIF or WebP image",
        ),
        (
            "POST",
            "/api/chat",
            {"model": MODEL_ID, "messages": hello(), "format": "xml"},
            400,
            'invalid request body: format: Value error, format must be "json" or a JSON schema object',
        ),
        (
            "POST",
            "/api/chat",
            {"model": "nope", "messages": hello()},
            404,
            f"model 'nope' not found; available: {MODEL_ID}, {OTHER_ID}",
        ),
        ("POST", "/api/pull", {"model": MODEL_ID}, 404, "no route POST /api/pull"),
        ("GET", "/api/chat", None, 405, "GET is not allowed on /api/chat"),
    ]:
        response = httpx.request(method, server.url + path, json=body)
        assert (response.status_code, response.json()) == (status, {"error": message}), path


# --- keys mode -------------------------------------------------------------------------------


def test_keys_mode_keeps_users_apart(
    upstream: ScriptedUpstream, tmp_path: Path, make_ollama: Callable[..., ollama.Client]
) -> None:
    with upstream._lock:
        upstream.requests.clear()
    config = sections(upstream, tmp_path, auth={"mode": "keys", "service_keys": [SERVICE_KEY]})
    process = ServeProcess(tmp_path, config)
    process.start()
    try:
        database = Database.from_config(Config.model_validate(config).database)
        keys = KeyStore(database)
        alice_key, bob_key = keys.create("alice")[1], keys.create("bob")[1]
        database.dispose()

        def as_user(key: str, **headers: str) -> ollama.Client:
            return make_ollama(process.url, Authorization=f"Bearer {key}", **headers)

        alice, bob = as_user(alice_key), as_user(bob_key)
        # The first write after start waits for the token encoding, which loads beside
        # litellm's import: over httpx's default 5 s on a loaded CI worker once.
        assert (
            httpx.put(
                f"{process.url}/memory/diary",
                json={"value": "alice-secret-diary"},
                headers={"Authorization": f"Bearer {alice_key}"},
                timeout=WAIT,
            ).status_code
            == 201
        )
        assert (
            httpx.put(
                f"{process.url}/memory/diary",
                json={"value": "bob-own-diary"},
                headers={"Authorization": f"Bearer {bob_key}"},
                timeout=WAIT,
            ).status_code
            == 201
        )
        bob.chat(model=MODEL_ID, messages=hello())
        list(bob.generate(model=MODEL_ID, prompt="Hello", stream=True))
        as_user(SERVICE_KEY, **{"X-User-Id": "bob"}).chat(model=MODEL_ID, messages=hello())
        alice.chat(model=MODEL_ID, messages=hello())
        mains = upstream.received(MAIN_MODEL)
        assert len(mains) == 4
        for main in mains[:3]:
            assert "bob-own-diary" in main.system
            assert "alice-secret-diary" not in json.dumps(main.body)
        assert "alice-secret-diary" in mains[3].system

        for refused, status, message in [
            (
                make_ollama(process.url),
                401,
                "missing credentials: send Authorization: Bearer <key>",
            ),
            (as_user("kvm_wrong"), 401, "the API key is not valid (unknown or revoked)"),
            (
                as_user(bob_key, **{"X-User-Id": "alice"}),
                403,
                "a user key acts only for its own user; drop X-User-Id or use a service key",
            ),
        ]:
            for call in (
                lambda c: c.chat(model=MODEL_ID, messages=hello()),
                lambda c: c.generate(model=MODEL_ID, prompt="hi"),
                lambda c: c.list(),
            ):
                with pytest.raises(ollama.ResponseError) as caught:
                    call(refused)
                assert (caught.value.status_code, caught.value.error) == (status, message)
        assert len(upstream.received(MAIN_MODEL)) == 4
        wait_until(lambda: all(r.ended for r in upstream.requests), what="agents ending")
    finally:
        process.stop()
