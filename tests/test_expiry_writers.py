"""Memories that expire, set by every other writer (CONTRACT section 24): the memory agent's
`set_memory` and JSON mode, proposals under review, MCP and the CLI."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from kvmem.entries import iso
from tests.support.apps import AGENT_MODEL, services, set_memory, wait_agents_idle
from tests.support.cli import invoke
from tests.support.matchers import entry
from tests.support.upstream import Reply

JSONRPC_HEADERS = {
    "Accept": "application/json, text/event-stream",
    "Content-Type": "application/json",
}


def tools(*calls: dict[str, Any]) -> Reply:
    return Reply(content=None, tool_calls=list(calls))


def chat(client: Any, message: str = "I'm in Lisbon until Friday.") -> dict[str, Any]:
    response = client.post("/chat", json={"message": message})
    assert response.status_code == 200, response.text
    wait_agents_idle(client)
    return response.json()


def tool_results(upstream: Any) -> list[str]:
    return [
        message["content"]
        for request in upstream.received(AGENT_MODEL)
        for message in request.messages
        if message["role"] == "tool"
    ]


def future_day(days: int = 4) -> str:
    return (datetime.now(UTC) + timedelta(days=days)).date().isoformat()


# -- the memory agent -------------------------------------------------------------------------------


def test_set_memory_with_a_date_stores_an_entry_that_expires_at_its_end(
    upstream: Any, chat_sections: Any, make_client: Any
) -> None:
    client = make_client(**chat_sections())
    day = future_day()
    upstream.script(AGENT_MODEL, tools(set_memory("trip", "in Lisbon", expires_at=day)))
    chat(client)
    until = f"{day}T23:59:59.000000Z"
    assert client.get("/memory").json()["memories"] == [
        entry("trip", "in Lisbon", 2, source="agent", expires_at=until)
    ]
    assert tool_results(upstream) == []  # a success needs no second call
    # The next turn's agent input shows the expiry and today's date.
    upstream.script(AGENT_MODEL, tools())
    chat(client, "Thanks")
    prompt = upstream.received(AGENT_MODEL)[-1].messages[1]["content"]
    assert f"- trip (2 tokens, expires {day}): in Lisbon" in prompt
    assert f"Today's date: {datetime.now(UTC).date().isoformat()} (" in prompt


@pytest.mark.parametrize(
    ("expires_at", "told"),
    [
        (
            "next Friday",
            "Error: expires_at 'next Friday' is not a date (YYYY-MM-DD, meaning the end of "
            "that day, UTC) or an RFC 3339 date-time",
        ),
        ("2020-01-01", "Error: expires_at 2020-01-01T23:59:59+00:00 is not in the future"),
    ],
)
def test_set_memory_with_a_bad_or_past_expiry_is_refused_and_the_model_told(
    upstream: Any, chat_sections: Any, make_client: Any, expires_at: str, told: str
) -> None:
    client = make_client(**chat_sections())
    upstream.script(
        AGENT_MODEL, tools(set_memory("trip", "in Lisbon", expires_at=expires_at)), tools()
    )
    chat(client)
    [result] = tool_results(upstream)
    assert result.startswith(told)
    assert client.get("/memory").json()["memories"] == []


def test_json_mode_takes_expires_at_on_a_set(
    upstream: Any, chat_sections: Any, make_client: Any
) -> None:
    client = make_client(**chat_sections(agent={"mode": "json"}))
    day = future_day(2)
    answer = (
        '{"operations": [{"op": "set", "key": "visit", "value": "sister visiting", '
        f'"expires_at": "{day}"}}, {{"op": "set", "key": "name", "value": "Ada"}}]}}'
    )
    upstream.script(AGENT_MODEL, Reply(content=answer))
    chat(client, "My sister is visiting until the day after tomorrow. I'm Ada.")
    listed = {m["key"]: m["expires_at"] for m in client.get("/memory").json()["memories"]}
    assert listed == {"visit": f"{day}T23:59:59.000000Z", "name": None}
    system = upstream.received(AGENT_MODEL)[0].messages[0]["content"]
    assert '"expires_at": "YYYY-MM-DD"' in system


def test_a_proposal_carries_its_expiry_to_the_entry_it_makes(
    upstream: Any, chat_sections: Any, make_client: Any
) -> None:
    client = make_client(**chat_sections(memory={"review": "on"}))
    day = future_day(3)
    upstream.script(AGENT_MODEL, tools(set_memory("trip", "in Lisbon", expires_at=day)))
    chat(client)
    [proposal] = client.get("/memory/proposals").json()["proposals"]
    assert proposal["expires_at"] == f"{day}T23:59:59.000000Z"
    accepted = client.post(f"/memory/proposals/{proposal['id']}/accept")
    assert accepted.status_code == 200, accepted.text
    assert accepted.json()["memory"]["expires_at"] == f"{day}T23:59:59.000000Z"


def test_a_proposal_whose_expiry_passed_while_pending_is_not_kept(
    upstream: Any, chat_sections: Any, make_client: Any
) -> None:
    client = make_client(**chat_sections(memory={"review": "on"}))
    upstream.script(AGENT_MODEL, tools(set_memory("trip", "in Lisbon", expires_at=future_day(1))))
    chat(client)
    [proposal] = client.get("/memory/proposals").json()["proposals"]
    later = datetime.now(UTC) + timedelta(days=3)
    services(client).store.clock = lambda: later
    refused = client.post(f"/memory/proposals/{proposal['id']}/accept")
    assert refused.status_code == 400
    assert "is not in the future" in refused.json()["error"]["message"]
    assert client.get("/memory/proposals").json()["proposals"] == [proposal]


# -- MCP and the CLI --------------------------------------------------------------------------------


def mcp_call(client: Any, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    call = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": name, "arguments": arguments},
    }
    response = client.post("/mcp", json=call, headers=JSONRPC_HEADERS)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()["result"]
    return result


def test_mcp_memory_set_takes_expires_in_or_expires_at(make_client: Any) -> None:
    client = make_client()
    before = datetime.now(UTC)
    result = mcp_call(client, "memory_set", {"key": "trip", "value": "Lisbon", "expires_in": "3d"})
    assert result.get("isError") is not True, result
    expires = datetime.fromisoformat(
        client.get("/memory/trip").json()["expires_at"].replace("Z", "+00:00")
    )
    assert before + timedelta(days=3) <= expires <= datetime.now(UTC) + timedelta(days=3)
    day = future_day(5)
    mcp_call(client, "memory_set", {"key": "trip", "value": "Porto", "expires_at": day})
    assert client.get("/memory/trip").json()["expires_at"] == f"{day}T23:59:59.000000Z"
    refused = mcp_call(
        client, "memory_set", {"key": "trip", "value": "x", "expires_at": day, "expires_in": "1d"}
    )
    assert refused["isError"] is True
    assert refused["content"][0]["text"] == "Error: give expires_at or expires_in, not both"
    assert client.get("/memory/trip").json()["value"] == "Porto"


def test_the_cli_sets_an_expiry_and_lists_it(tmp_path: Path) -> None:
    (tmp_path / "memory.yaml").write_text("database: {url: 'sqlite:///kv.db'}\n", encoding="utf-8")

    def kvmem(*args: str) -> Any:
        return invoke(["--config", "memory.yaml", *args], cwd=tmp_path)

    day = future_day(6)
    created = kvmem("memory", "set", "trip", "in Lisbon", "--expires-at", day)
    assert (created.code, created.stderr) == (0, "")
    assert created.json()["memory"]["expires_at"] == f"{day}T23:59:59.000000Z"
    listed = kvmem("memory", "list")
    assert [(m["key"], m["expires_at"]) for m in listed.json()["memories"]] == [
        ("trip", f"{day}T23:59:59.000000Z")
    ]
    refused = kvmem("memory", "set", "trip", "x", "--expires-in", "3y")
    assert refused.code == 2
    assert "expires_in '3y' is not seconds" in refused.stderr
    forever = kvmem("memory", "set", "trip", "in Porto")
    assert forever.json()["memory"]["expires_at"] is None
    soon = kvmem("memory", "set", "trip", "in Porto", "--expires-in", "90m")
    at = datetime.fromisoformat(soon.json()["memory"]["expires_at"].replace("Z", "+00:00"))
    assert timedelta(minutes=89) < at - datetime.now(UTC) <= timedelta(minutes=90)
    assert iso(at).endswith("Z")
