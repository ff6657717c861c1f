"""JSON mode (`memory.agent.mode: json`): no tools in the request, one JSON object of
operations applied like tool calls, the corrective second call, and garbage refused whole."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kvmem.agent.json_mode import (
    JSON_MODE_INSTRUCTIONS,
    DeleteOperation,
    InvalidAnswer,
    SetOperation,
    parse_answer,
)
from kvmem.agent.prompts import DEFAULT_AGENT_INSTRUCTIONS
from kvmem.config_loader import load_config
from kvmem.errors import ConfigError
from tests.support.apps import AGENT_MODEL, outcomes, services, wait_agents_idle
from tests.support.matchers import entry
from tests.support.upstream import Reply

JSON_MODE = {"mode": "json"}


def answer(*operations: dict[str, Any], fence: str | None = None) -> Reply:
    """An agent reply holding `{"operations": [...]}`, optionally in a fenced block."""
    text = json.dumps({"operations": list(operations)})
    if fence is not None:
        text = f"{fence}\n{text}\n```"
    return Reply(content=text)


def op_set(key: str, value: Any) -> dict[str, Any]:
    return {"op": "set", "key": key, "value": value}


def op_delete(key: str) -> dict[str, Any]:
    return {"op": "delete", "key": key}


def chat(client, message: str = "Remember that my name is Ada; forget my city.") -> dict[str, Any]:
    response = client.post("/chat", json={"message": message})
    assert response.status_code == 200, response.text
    return response.json()


def memories(client) -> list[dict[str, Any]]:
    return client.get("/memory").json()["memories"]


def agent_requests(upstream, client) -> list[Any]:
    wait_agents_idle(client)
    return upstream.received(AGENT_MODEL)


# --- success -----------------------------------------------------------------------------


def test_set_and_delete_land_and_the_request_has_no_tools(upstream, chat_sections, make_client):
    client = make_client(**chat_sections(agent=JSON_MODE))
    client.put("/memory/city", json={"value": "Paris"})
    upstream.script(AGENT_MODEL, answer(op_set("name", "Ada"), op_delete("city")))
    body = chat(client)
    assert body["response"] == "ok"
    (request,) = agent_requests(upstream, client)
    assert "tools" not in request.body
    assert "tool_choice" not in request.body
    system, user = request.messages
    assert system == {
        "role": "system",
        "content": f"{DEFAULT_AGENT_INSTRUCTIONS}\n\n{JSON_MODE_INSTRUCTIONS}",
    }
    assert user["content"].endswith(
        "# Existing memory:\n- city (1 tokens): Paris\n\n# Current Chat:\n"
        "Human: Remember that my name is Ada; forget my city."
    )
    assert outcomes(client) == {"done": 1}
    assert memories(client) == [entry("name", "Ada", 1, source="agent")]


def test_configured_instructions_keep_the_answer_format(upstream, chat_sections, make_client):
    client = make_client(**chat_sections(agent={**JSON_MODE, "instructions": "Only diets."}))
    upstream.script(AGENT_MODEL, answer())
    chat(client)
    (request,) = agent_requests(upstream, client)
    assert request.messages[0]["content"] == f"Only diets.\n\n{JSON_MODE_INSTRUCTIONS}"
    assert outcomes(client) == {"done": 1}


def test_writes_show_in_the_stream(upstream, chat_sections, make_client):
    client = make_client(**chat_sections(agent=JSON_MODE))
    upstream.script(AGENT_MODEL, answer(op_set("name", "Ada")))
    response = client.post("/chat", json={"message": "I'm Ada.", "stream": True})
    assert response.status_code == 200
    assert 'event: memory\ndata: {"op": "set", "key": "name", "value": "Ada"}\n\n' in response.text
    wait_agents_idle(client)
    assert memories(client) == [entry("name", "Ada", 1, source="agent")]


@pytest.mark.parametrize("fence", ["```json", "```", "```JSON", "Here you go:\n```json"])
def test_a_fenced_block_is_accepted(upstream, chat_sections, make_client, fence):
    client = make_client(**chat_sections(agent=JSON_MODE))
    upstream.script(AGENT_MODEL, answer(op_set("name", "Ada"), fence=fence))
    chat(client)
    assert len(agent_requests(upstream, client)) == 1
    assert outcomes(client) == {"done": 1}
    assert memories(client) == [entry("name", "Ada", 1, source="agent")]


def test_no_operations_is_done_without_writes(upstream, chat_sections, make_client):
    client = make_client(**chat_sections(agent=JSON_MODE))
    upstream.script(AGENT_MODEL, Reply(content='  {"operations": []}\n'))
    chat(client, "What's the capital of Peru?")
    assert len(agent_requests(upstream, client)) == 1
    assert outcomes(client) == {"done": 1}
    assert memories(client) == []


# --- correction --------------------------------------------------------------------------


def test_a_failed_operation_gets_one_corrective_call(upstream, chat_sections, make_client, tokens):
    client = make_client(**chat_sections(agent=JSON_MODE, memory={"validKeys": ["a", "b"]}))
    client.put("/memory/b", json={"value": "old"})
    first_answer = answer(op_set("a", "first"), op_set("k", "nope"), op_delete("b"))
    upstream.script(AGENT_MODEL, first_answer, answer(op_set("b", "corrected")))
    chat(client)
    first, second = agent_requests(upstream, client)
    assert "tools" not in second.body
    assert second.messages[:2] == first.messages
    assert second.messages[2:] == [
        {"role": "assistant", "content": first_answer.content},
        {
            "role": "user",
            "content": (
                "Results of your operations:\n"
                '1. set "a": Memory set for key "a" (1 tokens)\n'
                '2. set "k": Invalid key "k". Must be one of: a, b\n'
                '3. delete "b": Memory deleted for key "b"\n'
                "\n"
                "Operations that succeeded are done; do not repeat them. Answer with only one JSON "
                'object holding the corrected operations for those that failed, or {"operations": []}.'
            ),
        },
    ]
    assert outcomes(client) == {"done": 1}
    assert sorted(memories(client), key=lambda m: m["key"]) == [
        entry("a", "first", 1, source="agent"),
        entry("b", "corrected", tokens.count("corrected"), source="agent"),
    ]


def test_there_is_no_third_call(upstream, chat_sections, make_client):
    client = make_client(**chat_sections(agent=JSON_MODE, memory={"charLimit": 3}))
    upstream.script(
        AGENT_MODEL,
        answer(op_set("a", "long")),
        answer(op_set("a", "longer")),
        answer(op_set("a", "ok")),
    )
    chat(client)
    first, second = agent_requests(upstream, client)
    assert second.messages[-1]["content"].splitlines()[1] == (
        '1. set "a": Value for key "a" is too long (4 characters; the limit is 3). Shorten it.'
    )
    assert outcomes(client) == {"done": 1}
    assert memories(client) == []


def test_sixteen_operations_at_most(upstream, chat_sections, make_client, tokens):
    client = make_client(**chat_sections(agent=JSON_MODE))
    flood = [op_set(f"k{i:02d}", f"value {i}") for i in range(20)]
    upstream.script(AGENT_MODEL, answer(*flood), answer())
    chat(client)
    first, second = agent_requests(upstream, client)
    lines = second.messages[-1]["content"].splitlines()
    assert lines[1:21] == [
        f'{i + 1}. set "k{i:02d}": Memory set for key "k{i:02d}" '
        f"({tokens.count(f'value {i}')} tokens)"
        for i in range(16)
    ] + [
        f'{i + 1}. set "k{i:02d}": Error: not applied; at most 16 tool calls per turn.'
        for i in range(16, 20)
    ]
    assert sorted(m["key"] for m in memories(client)) == [f"k{i:02d}" for i in range(16)]
    assert services(client).agent.outcomes["tool_calls_capped"] == 1


# --- deadline --------------------------------------------------------------------------


def test_an_answer_after_the_deadline_writes_nothing(upstream, chat_sections, make_client):
    client = make_client(**chat_sections(agent={**JSON_MODE, "grace_seconds": 0.3}))
    upstream.script(
        AGENT_MODEL, Reply(delay=30, content=json.dumps({"operations": [op_set("name", "Ada")]}))
    )
    body = chat(client)
    assert body["memory"] == {"injected": [], "agent": "running", "updates": []}
    (agent,) = upstream.wait_for(AGENT_MODEL, 1)
    wait_agents_idle(client, timeout=5)
    assert upstream.wait_ended(agent, timeout=5).disconnected
    assert outcomes(client) == {"timeout": 1}
    assert memories(client) == []


# --- garbage -----------------------------------------------------------------------------


GARBAGE = {
    "prose": "I'll remember that your name is Ada!",
    "empty": "",
    "broken JSON": '{"operations": [{"op": "set", "key": "name", "value": "Ada"}',
    "not an object": '[{"op": "set", "key": "name", "value": "Ada"}]',
    "no operations": '{"set": {"name": "Ada"}}',
    "unknown op": '{"operations": [{"op": "set", "key": "name", "value": "Ada"}, '
    '{"op": "remember", "key": "city", "value": "Rome"}]}',
    "wrong type": '{"operations": [{"op": "set", "key": "name", "value": 7}]}',
    "missing value": '{"operations": [{"op": "set", "key": "name"}]}',
    "extra field": '{"operations": [{"op": "delete", "key": "city", "user_id": "bob"}]}',
    "two fenced blocks": '```json\n{"operations": []}\n```\n```json\n{"operations": []}\n```',
}


@pytest.mark.parametrize("content", GARBAGE.values(), ids=GARBAGE.keys())
def test_garbage_fails_the_run_and_writes_nothing(
    upstream, chat_sections, make_client, content, caplog
):
    client = make_client(**chat_sections(agent=JSON_MODE))
    client.put("/memory/city", json={"value": "Paris"})
    upstream.script(AGENT_MODEL, Reply(content=content))
    body = chat(client)
    assert body["response"] == "ok"
    assert len(agent_requests(upstream, client)) == 1  # no corrective call for garbage
    assert outcomes(client) == {"failed": 1}
    assert memories(client) == [entry("city", "Paris", 1)]
    assert "memory agent failed: user=local conversation=" in caplog.text


def test_garbage_after_a_correction_keeps_what_landed(upstream, chat_sections, make_client, tokens):
    client = make_client(**chat_sections(agent=JSON_MODE, memory={"validKeys": ["a"]}))
    upstream.script(
        AGENT_MODEL,
        answer(op_set("a", "kept"), op_set("k", "refused")),
        Reply(content="Sorry, I cannot do that."),
    )
    chat(client)
    assert len(agent_requests(upstream, client)) == 2
    assert outcomes(client) == {"failed": 1}
    assert memories(client) == [entry("a", "kept", tokens.count("kept"), source="agent")]


# --- parsing (pure) ----------------------------------------------------------------------


def test_parse_answer_returns_validated_operations():
    assert parse_answer(
        '```json\n{"operations": [{"op": "set", "key": "a", "value": "x"}, '
        '{"op": "delete", "key": "b"}], "note": "ignored"}\n```'
    ) == [SetOperation(op="set", key="a", value="x"), DeleteOperation(op="delete", key="b")]


def test_a_leading_think_block_is_not_part_of_the_answer():
    thinking = '<think>\nThe user wants {"operations": ...}; set name.\n</think>\n\n'
    assert parse_answer(thinking + '{"operations": [{"op": "delete", "key": "b"}]}') == [
        DeleteOperation(op="delete", key="b")
    ]
    with pytest.raises(InvalidAnswer) as raised:
        parse_answer(thinking + "Nothing to do.")
    assert str(raised.value) == "the answer is not valid JSON (Expecting value)"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "the answer is empty; expected a JSON object"),
        ("Done!", "the answer is not valid JSON (Expecting value)"),
        ("[]", 'the answer is not a JSON object with an "operations" list'),
        ('{"operations": {}}', "invalid operations: operations: Input should be a valid list"),
        (
            '{"operations": [{"op": "remember", "key": "a"}]}',
            "invalid operations: 0: Input tag 'remember' found using 'op' does not match any "
            "of the expected tags: 'set', 'delete'",
        ),
        (
            '{"operations": [{"op": "set", "key": "a", "value": 1}]}',
            "invalid operations: 0.set.value: Input should be a valid string",
        ),
    ],
)
def test_parse_answer_explains_what_is_wrong(text, message):
    with pytest.raises(InvalidAnswer) as raised:
        parse_answer(text)
    assert str(raised.value) == message


# --- config ------------------------------------------------------------------------------


def test_mode_defaults_to_tools_and_is_checked(write_config):
    agent = load_config(write_config("memory: {agent: {}}\n"), environ={}).config.memory.agent
    assert agent.mode == "tools"
    path = write_config("memory: {agent: {mode: text}}\n")
    with pytest.raises(ConfigError) as raised:
        load_config(path, environ={})
    assert str(raised.value) == (
        f"{path}: invalid config:\n  memory.agent.mode: Input should be 'tools' or 'json' "
        "(got 'text')"
    )
