"""`/healthz`'s agent object: on or off and why, and the last failed run (secrets masked)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from starlette.testclient import TestClient

from kvmem import __version__
from tests.support.apps import AGENT_MODEL, Containing, wait_agents_idle
from tests.support.matchers import ISO_TIME
from tests.support.upstream import Reply

MakeClient = Callable[..., TestClient]
AGENT_KEY = "sk-agent-secret-0123456789"
ON = "model 'agent-model' via provider 'openai'"
SERVICE_KEY = "svc-health-5e4d3c2b1a"
KEYS_MODE = {"mode": "keys", "service_keys": [SERVICE_KEY]}
SERVICE = {"Authorization": f"Bearer {SERVICE_KEY}", "X-User-Id": "alice"}


def health(client: TestClient, headers: dict[str, str] | None = None) -> dict[str, Any]:
    response = client.get("/healthz", headers=headers)
    assert response.status_code == 200
    return response.json()


def test_health_says_the_agent_is_on_and_has_not_failed(
    make_client: MakeClient, chat_sections: Callable[..., dict[str, Any]]
) -> None:
    client = make_client(**chat_sections())
    assert health(client) == {
        "status": "ok",
        "version": __version__,
        "store": "ok",
        "agent": {"enabled": True, "reason": ON, "last_error": None},
    }


def test_health_says_why_the_agent_is_off(
    make_client: MakeClient, chat_sections: Callable[..., dict[str, Any]]
) -> None:
    client = make_client(**chat_sections(agent={"enabled": False}))
    assert health(client)["agent"] == {
        "enabled": False,
        "reason": "memory.agent.enabled is false",
        "last_error": None,
    }


def test_health_shows_the_last_agent_failure_without_secrets(
    make_client: MakeClient, chat_sections: Callable[..., dict[str, Any]], upstream: Any
) -> None:
    leak = f"Incorrect API key provided: {AGENT_KEY}. Also Bearer sk-other-looking-token-xyz"
    upstream.script(AGENT_MODEL, Reply(status=401, error={"error": {"message": leak}}))
    client = make_client(**chat_sections(agent={"api_key": AGENT_KEY}, auth=KEYS_MODE))
    reply = client.post("/chat", json={"message": "remember that I like tea"}, headers=SERVICE)
    assert reply.status_code == 200
    wait_agents_idle(client)

    body = health(client, SERVICE)
    assert body["agent"] == {
        "enabled": True,
        "reason": ON,
        "last_error": {
            "at": ISO_TIME,
            "code": "upstream_error",
            "upstream_status": 401,
            "message": Containing("upstream_error: "),
        },
    }
    message = body["agent"]["last_error"]["message"]
    assert "Incorrect API key provided: ***" in message
    assert AGENT_KEY not in message and "sk-other-looking-token-xyz" not in message


@pytest.mark.parametrize("mode", ["local", "keys"])
def test_without_a_service_key_the_last_error_is_its_code_and_status_only(
    make_client: MakeClient,
    chat_sections: Callable[..., dict[str, Any]],
    upstream: Any,
    mode: str,
) -> None:
    # An upstream that quotes the request it refused: someone's own words.
    words = "remember that my door code is 4921"
    upstream.script(AGENT_MODEL, Reply(status=400, error={"error": {"message": f"bad: {words}"}}))
    client = make_client(**chat_sections(auth=KEYS_MODE if mode == "keys" else {"mode": "local"}))
    reply = client.post("/chat", json={"message": words}, headers=SERVICE if mode == "keys" else {})
    assert reply.status_code == 200
    wait_agents_idle(client)

    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json()["agent"]["last_error"] == {
        "at": ISO_TIME,
        "code": "upstream_rejected",
        "upstream_status": 400,
    }
    assert "4921" not in response.text and "bad:" not in response.text


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
    assert (
        health(client)["agent"]["last_error"]
        == failed
        == {
            "at": ISO_TIME,
            "code": "upstream_error",
            "upstream_status": 500,
        }
    )
