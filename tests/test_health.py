"""`/healthz`'s agent object: on or off and why, and the last failed run (secrets masked)."""

from __future__ import annotations

import logging
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
        "agent": {"enabled": True, "ready": True, "reason": ON, "last_error": None},
    }


def test_health_says_why_the_agent_is_off(
    make_client: MakeClient, chat_sections: Callable[..., dict[str, Any]]
) -> None:
    client = make_client(**chat_sections(agent={"enabled": False}))
    assert health(client)["agent"] == {
        "enabled": False,
        "ready": False,
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
        "ready": True,
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


def test_a_missing_api_key_is_found_at_start_up(
    make_client: MakeClient, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The shipped defaults: the agent calls OpenAI's API, with no key anywhere.
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_API_BASE"):
        monkeypatch.delenv(name, raising=False)
    caplog.set_level(logging.WARNING, logger="kvmem")
    client = make_client(
        chat={"model": "ollama/llama3.1"},
        memory={"agent": {"provider": "openai", "model": "gpt-4.1-mini"}},
    )
    missing = (
        "no API key for openai/gpt-4.1-mini: set OPENAI_API_KEY in kvmem's environment, "
        "or memory.agent.api_key in memory.yaml"
    )
    assert health(client)["agent"] == {
        "enabled": True,
        "ready": False,
        "reason": missing,
        "last_error": None,
    }
    # Once, at start-up (the Ollama main model needs no key).
    assert [r.getMessage() for r in caplog.records if r.name == "kvmem"] == [
        f"the memory agent will fail: {missing}"
    ]
    health(client)
    assert len([r for r in caplog.records if r.name == "kvmem"]) == 1


def test_a_key_from_the_environment_makes_the_agent_ready(
    make_client: MakeClient, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-the-environment")
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    caplog.set_level(logging.WARNING, logger="kvmem")
    client = make_client(
        chat={"model": "anthropic/claude-x"},
        memory={"agent": {"provider": "openai", "model": "gpt-4.1-mini"}},
    )
    assert health(client)["agent"]["ready"] is True
    assert [r.getMessage() for r in caplog.records if r.name == "kvmem"] == [
        "the chat model will fail: no API key for anthropic/claude-x: set ANTHROPIC_API_KEY "
        "in kvmem's environment, or chat.api_key in memory.yaml"
    ]
