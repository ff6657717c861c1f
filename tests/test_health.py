"""`/healthz`'s agent object: on or off and why, and the last failed run (secrets masked)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.testclient import TestClient

from kvmem import __version__
from tests.support.apps import AGENT_MODEL, Containing, wait_agents_idle
from tests.support.matchers import ISO_TIME
from tests.support.upstream import Reply

MakeClient = Callable[..., TestClient]
AGENT_KEY = "sk-agent-secret-0123456789"
ON = "model 'agent-model' via provider 'openai'"


def health(client: TestClient) -> dict[str, Any]:
    response = client.get("/healthz")
    assert response.status_code == 200
    return response.json()


def test_health_says_the_agent_is_on_and_has_not_failed(
    make_client: MakeClient, chat_sections: Callable[..., dict[str, Any]]
) -> None:
    client = make_client(**chat_sections())
    assert health(client) == {
        "status": "ok", "version": __version__, "store": "ok",
        "agent": {"enabled": True, "reason": ON, "last_error": None},
    }


def test_health_says_why_the_agent_is_off(
    make_client: MakeClient, chat_sections: Callable[..., dict[str, Any]]
) -> None:
    client = make_client(**chat_sections(agent={"enabled": False}))
    assert health(client)["agent"] == {
        "enabled": False, "reason": "memory.agent.enabled is false", "last_error": None,
    }


def test_health_shows_the_last_agent_failure_without_secrets(
    make_client: MakeClient, chat_sections: Callable[..., dict[str, Any]], upstream: Any
) -> None:
    leak = f"Incorrect API key provided: {AGENT_KEY}. Also Bearer sk-other-looking-token-xyz"
    upstream.script(AGENT_MODEL, Reply(status=401, error={"error": {"message": leak}}))
    client = make_client(**chat_sections(agent={"api_key": AGENT_KEY}))
    reply = client.post("/chat", json={"message": "remember that I like tea"})
    assert reply.status_code == 200
    wait_agents_idle(client)

    body = health(client)
    assert body["agent"] == {
        "enabled": True,
        "reason": ON,
        "last_error": {"at": ISO_TIME, "message": Containing("upstream_error: ")},
    }
    message = body["agent"]["last_error"]["message"]
    assert "Incorrect API key provided: ***" in message
    assert AGENT_KEY not in message and "sk-other-looking-token-xyz" not in message


def test_a_later_success_keeps_the_last_error(
    make_client: MakeClient, chat_sections: Callable[..., dict[str, Any]], upstream: Any
) -> None:
    upstream.script(AGENT_MODEL, Reply(status=500, error={"error": {"message": "boom"}}), Reply())
    client = make_client(**chat_sections())
    client.post("/chat", json={"message": "one"})
    wait_agents_idle(client)
    failed = health(client)["agent"]["last_error"]
    client.post("/chat", json={"message": "two"})
    wait_agents_idle(client)
    assert health(client)["agent"]["last_error"] == failed == {
        "at": ISO_TIME, "message": Containing("boom")
    }
