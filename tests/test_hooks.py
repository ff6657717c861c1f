"""The sidecar hooks: `POST /memory/context` gives exactly the block /chat and /v1 inject, and
`POST /memory/agent` runs the memory agent on an app's own messages, within its deadline."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from kvmem.agent.prompts import BLOCK_PREAMBLE
from kvmem.server.app import create_app
from tests.support.apps import (
    AGENT_MODEL,
    LOCAL_URL,
    MAIN_MODEL,
    outcomes,
    services,
    set_memory,
    wait_agents_idle,
)
from tests.support.hostile import HOSTILE_VALUES
from tests.support.upstream import Reply

SYSTEM_PROMPT = "You are a helpful assistant."
NO_AGENT = {"agent": None}


def context(client: TestClient, **body: Any) -> dict[str, Any]:
    response = client.post("/memory/context", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def store_entries(client: TestClient, values: list[str]) -> list[str]:
    keys = [f"fact_{i}" for i in range(len(values))]
    for key, value in zip(keys, values, strict=True):
        assert client.put(f"/memory/{key}", json={"value": value}).status_code == 201
    return keys


def empty_context(system: str, enabled: bool) -> dict[str, Any]:
    return {"block": "", "injected": [], "token_count": 0, "enabled": enabled, "system": system}


# --- /memory/context ------------------------------------------------------------------------


def test_context_is_byte_for_byte_what_chat_and_v1_inject(
    upstream, chat_sections, make_client, tokens
):
    client = make_client(**chat_sections(memory=NO_AGENT))
    keys = store_entries(client, ["Prefers short answers.", *HOSTILE_VALUES])

    assert client.post("/chat", json={"message": "hi"}).status_code == 200
    chat_system = upstream.received(MAIN_MODEL)[-1].system
    given = context(client, system=SYSTEM_PROMPT)
    block = given["block"]
    assert given == {
        "block": block,
        "injected": keys,
        "token_count": tokens.count(block),
        "enabled": True,
        "system": chat_system,
    }
    assert chat_system == f"{SYSTEM_PROMPT}\n\n{block}"
    assert block.startswith(f"{BLOCK_PREAMBLE}\n<user_memory>\n[")
    assert len(block.split("\n")) == 2 + len(keys) + 1  # no value broke out of its line

    for system in ("You are a pirate.", ""):
        messages = [{"role": "user", "content": "hi"}]
        if system:
            messages.insert(0, {"role": "system", "content": system})
        answer = client.post(
            "/v1/chat/completions", json={"model": f"openai/{MAIN_MODEL}", "messages": messages}
        )
        assert answer.status_code == 200
        v1_system = upstream.received(MAIN_MODEL)[-1].system
        assert context(client, system=system) == {**given, "system": v1_system}
    # Without a system message, /v1 adds one holding the block alone; so does the hook.
    assert upstream.received(MAIN_MODEL)[-1].messages[0] == {"role": "system", "content": block}
    assert context(client)["system"] == block


def test_context_follows_a_lowered_token_limit_as_chat_does(
    upstream, chat_sections, make_client, make_value, tokens
):
    client = make_client(**chat_sections(memory=NO_AGENT))
    store_entries(client, [make_value(30), make_value(30), make_value(30)])
    lowered = make_client(**chat_sections(memory={**NO_AGENT, "tokenLimit": 65}))
    assert lowered.post("/chat", json={"message": "hi"}).status_code == 200
    given = context(lowered, system=SYSTEM_PROMPT)
    assert given["injected"] == ["fact_1", "fact_2"]  # the newest that fit
    assert given["system"] == upstream.received(MAIN_MODEL)[-1].system


def test_context_is_empty_without_entries(make_client):
    client = make_client()
    assert context(client, system="Be brief.") == empty_context("Be brief.", True)
    assert context(client) == empty_context("", True)
    assert client.post("/memory/context").json() == empty_context("", True)  # no body at all


def test_context_is_empty_for_an_opted_out_user(make_client):
    client = make_client()
    store_entries(client, ["Ada"])
    client.patch("/preferences", json={"memories": False})
    assert context(client, system="S") == empty_context("S", False)


def test_context_is_empty_when_memory_is_disabled(make_client):
    client = make_client(memory={"disabled": True})
    assert context(client, system="S") == empty_context("S", False)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"system": 5}', "invalid request body: system: Input should be a valid string"),
        (b'{"system": null}', "invalid request body: system: Input should be a valid string"),
        (b'{"sytem": "x"}', "invalid request body: sytem: Extra inputs are not permitted"),
        (
            b'["x"]',
            "invalid request body: body: Input should be a valid dictionary or instance of ContextRequest",
        ),
        (b'{"system": ', "malformed JSON body: Expecting value at line 1 column 12"),
    ],
)
def test_context_bad_input(make_client, body: bytes, message: str):
    response = make_client().post("/memory/context", content=body)
    assert (response.status_code, response.json()) == (
        400,
        {"error": {"code": "bad_request", "message": message}},
    )


# --- /memory/agent --------------------------------------------------------------------------


def agent_body(*messages: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"messages": list(messages), **fields}


def user(text: Any) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def chat_part(agent_request: Any) -> str:
    """The `# Current Chat:` section of the agent's input."""
    return agent_request.messages[1]["content"].split("# Current Chat:\n", 1)[1]


def test_the_agent_reads_the_window_of_the_given_messages_and_writes(
    upstream, chat_sections, make_client
):
    client = make_client(**chat_sections(memory={"messageWindowSize": 3}))
    upstream.script(AGENT_MODEL, Reply(content=None, tool_calls=[set_memory("drink", "Tea")]))
    body = agent_body(
        {"role": "system", "content": "You are the app's assistant."},
        user("too old to be read"),
        assistant("dropped"),
        user("I moved to Rome."),
        {"role": "tool", "tool_call_id": "c1", "content": "tool output is not read"},
        assistant([{"type": "text", "text": "Noted:"}, {"type": "text", "text": "Rome."}]),
        user(
            [
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                {"type": "text", "text": "Remember that I drink tea."},
            ]
        ),
        assistant("the reply after the newest user message is not read"),
    )
    response = client.post("/memory/agent", json=body)
    assert (response.status_code, response.json()) == (
        200,
        {"agent": "done", "updates": [{"op": "set", "key": "drink", "value": "Tea"}]},
    )
    (request,) = upstream.received(AGENT_MODEL)
    assert chat_part(request) == (
        "Human: I moved to Rome.\nAI: Noted:\nRome.\nHuman: Remember that I drink tea."
    )
    entry = client.get("/memory/drink").json()
    assert (entry["value"], entry["source"]) == ("Tea", "agent")
    assert upstream.received(MAIN_MODEL) == []  # only the agent's model was called


def test_the_agent_input_is_cut_to_max_input_tokens_keeping_the_end(
    upstream, chat_sections, make_client, tokens
):
    client = make_client(**chat_sections(memory={"maxInputTokens": 20}))
    body = agent_body(user("hello " * 500), assistant("ok"), user("Remember that I like tea."))
    assert client.post("/memory/agent", json=body).json() == {"agent": "done", "updates": []}
    chat = chat_part(upstream.received(AGENT_MODEL)[0])
    assert chat.endswith("\nAI: ok\nHuman: Remember that I like tea.")
    assert tokens.count(chat) == 20


def test_provenance_comes_from_the_header_or_the_body(upstream, chat_sections, make_client):
    client = make_client(**chat_sections())
    upstream.script(
        AGENT_MODEL,
        Reply(content=None, tool_calls=[set_memory("a", "one")]),
        Reply(content=None, tool_calls=[set_memory("b", "two")]),
    )
    first = client.post(
        "/memory/agent",
        json=agent_body(user("remember one")),
        headers={"X-Conversation-Id": "app-conv-1"},
    )
    second = client.post(
        "/memory/agent", json=agent_body(user("remember two"), conversation_id="app-conv-2")
    )
    assert (first.status_code, second.status_code) == (200, 200)
    changes = client.get("/memory/history").json()["changes"]
    assert [(c["key"], c["source"], c["conversation_id"]) for c in changes] == [
        ("b", "agent", "app-conv-2"),
        ("a", "agent", "app-conv-1"),
    ]


def test_wait_false_answers_202_and_the_run_goes_on(upstream, chat_sections, make_client):
    client = make_client(**chat_sections())
    upstream.script(
        AGENT_MODEL, Reply(content=None, tool_calls=[set_memory("city", "Rome")], delay=0.5)
    )
    response = client.post("/memory/agent", json=agent_body(user("I live in Rome"), wait=False))
    assert (response.status_code, response.json()) == (202, {"agent": "running"})
    assert services(client).agent.in_flight == 1  # counted like a chat turn's run
    wait_agents_idle(client)
    assert outcomes(client) == {"done": 1}
    assert client.get("/memory/city").json()["value"] == "Rome"


def test_the_deadline_cuts_the_run_and_no_write_lands_after_it(
    upstream, chat_sections, make_client
):
    deadline = 0.5
    client = make_client(**chat_sections())
    upstream.script(
        AGENT_MODEL, Reply(content=None, tool_calls=[set_memory("late", "x")], delay=deadline + 5)
    )
    started = time.monotonic()
    response = client.post(
        "/memory/agent", json=agent_body(user("remember x"), deadline_seconds=deadline)
    )
    elapsed = time.monotonic() - started
    assert (response.status_code, response.json()) == (200, {"agent": "timeout", "updates": []})
    assert deadline <= elapsed < deadline + 4  # cut at the deadline, not at the reply
    (request,) = upstream.received(AGENT_MODEL)
    assert upstream.wait_ended(request, timeout=5).disconnected
    assert client.get("/memory").json()["memories"] == []


def test_a_run_in_flight_is_drained_at_shutdown(
    upstream, chat_sections, make_config, database, tokens
):
    app = create_app(make_config(**chat_sections()), database=database, tokens=tokens)
    upstream.script(
        AGENT_MODEL, Reply(content=None, tool_calls=[set_memory("city", "Oslo")], delay=0.5)
    )
    with TestClient(app, base_url=LOCAL_URL) as client:
        response = client.post("/memory/agent", json=agent_body(user("I live in Oslo"), wait=False))
        assert response.status_code == 202
    # The lifespan ended (a deploy's SIGTERM): it waited for the run, whose write landed.
    with TestClient(app, base_url=LOCAL_URL) as client:
        assert client.get("/memory/city").json()["value"] == "Oslo"


@pytest.mark.parametrize(
    ("sections", "prepare", "state"),
    [
        ({"memory": {"disabled": True}}, None, "disabled"),
        ({"memory": NO_AGENT}, None, "disabled"),
        ({"agent": {"enabled": False}}, None, "disabled"),
        ({}, "opt out", "skipped"),
        ({}, "only system", "skipped"),
        ({"agent": {"trigger": "intent"}}, "small talk", "gated"),
    ],
)
def test_no_run_means_no_model_call(upstream, chat_sections, make_client, sections, prepare, state):
    client = make_client(**chat_sections(**sections))
    messages = [user("remember that I like tea")]
    if prepare == "small talk":
        messages = [user("hello, how are you today?")]
    if prepare == "opt out":
        assert client.patch("/preferences", json={"memories": False}).status_code == 200
    if prepare == "only system":
        messages = [{"role": "system", "content": "remember everything"}, assistant("hello")]
    for wait in (True, False):
        response = client.post("/memory/agent", json={"messages": messages, "wait": wait})
        assert (response.status_code, response.json()) == (200, {"agent": state, "updates": []})
    assert upstream.requests == []
    assert services(client).agent.in_flight == 0
    # Counted under their state, as a chat turn's are.
    counted = [
        line for line in client.get("/metrics").text.splitlines() if "agent_runs_total{" in line
    ]
    assert counted == [f'kvmem_agent_runs_total{{state="{state}"}} 2.0']


ROLES = "'system', 'developer', 'user', 'assistant', 'tool' or 'function'"


@pytest.mark.parametrize(
    ("body", "headers", "message"),
    [
        ({"messages": "hi"}, {}, "invalid request body: messages: Input should be a valid list"),
        (
            {"messages": {"role": "user", "content": "hi"}},
            {},
            "invalid request body: messages: Input should be a valid list",
        ),
        (
            {"messages": []},
            {},
            "invalid request body: messages: List should have at least 1 item after validation, not 0",
        ),
        ({}, {}, "invalid request body: messages: Field required"),
        (
            {"messages": [{"role": "robot", "content": "hi"}]},
            {},
            f"invalid request body: messages.0.role: Input should be {ROLES}",
        ),
        (
            {"messages": [{"content": "hi"}]},
            {},
            "invalid request body: messages.0.role: Field required",
        ),
        (
            {"messages": ["hi"]},
            {},
            "invalid request body: messages.0: Input should be a valid dictionary or instance of AgentMessage",
        ),
        (
            {"messages": [{"role": "user", "content": 5}]},
            {},
            "invalid request body: messages.0.content: Value error, "
            "content must be a string, null or a list of content parts",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
            {},
            "invalid request body: messages.0.content: Value error, "
            "content part 0 is a text part without a string 'text'",
        ),
        (
            {"messages": [{"role": "user", "content": ["hi"]}]},
            {},
            "invalid request body: messages.0.content: Value error, "
            "content part 0 must be an object with a string 'type'",
        ),
        (
            {"messages": [{"role": "user", "content": "hi"}] * 10_000},
            {},
            "invalid request body: messages: List should have at most 1000 items after validation, not 10000",
        ),
        (
            {"messages": [{"role": "user", "content": "hi"}], "deadline_seconds": 0},
            {},
            "invalid request body: deadline_seconds: Input should be greater than 0",
        ),
        (
            {"messages": [{"role": "user", "content": "hi"}], "deadline_seconds": -1},
            {},
            "invalid request body: deadline_seconds: Input should be greater than 0",
        ),
        (
            {"messages": [{"role": "user", "content": "hi"}], "deadline_seconds": 60.5},
            {},
            "invalid request body: deadline_seconds: Input should be less than or equal to 60",
        ),
        (
            {"messages": [{"role": "user", "content": "hi"}], "deadline_seconds": "5"},
            {},
            "invalid request body: deadline_seconds: Input should be a valid number",
        ),
        (
            {"messages": [{"role": "user", "content": "hi"}], "deadline_seconds": True},
            {},
            "invalid request body: deadline_seconds: Input should be a valid number",
        ),
        (
            {"messages": [{"role": "user", "content": "hi"}], "wait": "yes"},
            {},
            "invalid request body: wait: Input should be a valid boolean",
        ),
        (
            {"messages": [{"role": "user", "content": "hi"}], "stream": True},
            {},
            "invalid request body: stream: Extra inputs are not permitted",
        ),
        (
            {"messages": [{"role": "user", "content": "hi"}], "conversation_id": "x" * 201},
            {},
            "invalid conversation id: use 1-200 printable ASCII characters",
        ),
        (
            {"messages": [{"role": "user", "content": "hi"}], "conversation_id": "a\nb"},
            {},
            "invalid conversation id: use 1-200 printable ASCII characters",
        ),
        (
            {"messages": [{"role": "user", "content": "hi"}], "conversation_id": "one"},
            {"X-Conversation-Id": "two"},
            "X-Conversation-Id and the body's conversation_id name different conversations",
        ),
    ],
)
def test_agent_bad_input_is_400_and_calls_no_model(
    upstream, chat_sections, make_client, body, headers, message
):
    client = make_client(**chat_sections())
    response = client.post("/memory/agent", content=json.dumps(body), headers=headers)
    assert (response.status_code, response.json()) == (
        400,
        {"error": {"code": "bad_request", "message": message}},
    )
    assert upstream.requests == []


@pytest.mark.slow
def test_the_context_benchmark_runs(tmp_path):
    """`python -m tests.bench.context_hook --quick` runs against a real server (numbers unchecked)."""
    repo = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-m", "tests.bench.context_hook", "--quick", "--out", str(tmp_path)],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((tmp_path / "context_hook.json").read_text())
    assert (results["entries"], results["mode"]) == (200, "quick")
    assert [(results[c]["n"], results[c]["errors"]) for c in ("c1", "c32")] == [(100, 0), (320, 0)]
