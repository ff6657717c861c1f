"""`X-Memory-Injected` and `X-Memory-Agent` on `/v1/chat/completions` replies, streamed or not."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.support.apps import MAIN_MODEL, wait_agents_idle

MakeClient = Callable[..., TestClient]
BODY = {"model": f"openai/{MAIN_MODEL}", "messages": [{"role": "user", "content": "hi"}]}


def memory_headers(response: Any) -> tuple[str | None, str | None]:
    return response.headers.get("x-memory-injected"), response.headers.get("x-memory-agent")


@pytest.mark.parametrize("stream", [False, True])
def test_headers_count_injected_entries_and_name_the_agent_state(
    make_client: MakeClient, chat_sections: Callable[..., dict[str, Any]], stream: bool
) -> None:
    client = make_client(**chat_sections())
    for key in ("city", "food"):
        assert client.put(f"/memory/{key}", json={"value": "x"}).status_code == 201
    response = client.post("/v1/chat/completions", json={**BODY, "stream": stream})
    assert response.status_code == 200
    # The agent works beside the main call: it is running when the headers leave, unless it
    # was already done (the scripted upstream answers at once).
    injected, state = memory_headers(response)
    assert (injected, state in ("running", "done")) == ("2", True)
    wait_agents_idle(client)


@pytest.mark.parametrize("stream", [False, True])
def test_headers_of_a_temporary_request(
    make_client: MakeClient, chat_sections: Callable[..., dict[str, Any]], stream: bool
) -> None:
    client = make_client(**chat_sections())
    client.put("/memory/city", json={"value": "Berlin"})
    response = client.post(
        "/v1/chat/completions", json={**BODY, "stream": stream}, headers={"X-Memory": "off"}
    )
    assert (response.status_code, memory_headers(response)) == (200, ("0", "skipped"))


def test_headers_with_the_agent_disabled(
    make_client: MakeClient, chat_sections: Callable[..., dict[str, Any]]
) -> None:
    client = make_client(**chat_sections(agent={"enabled": False}))
    response = client.post("/v1/chat/completions", json=BODY)
    assert (response.status_code, memory_headers(response)) == (200, ("0", "disabled"))


def test_headers_when_over_budget(
    make_client: MakeClient, chat_sections: Callable[..., dict[str, Any]]
) -> None:
    client = make_client(**chat_sections(agent={"daily_token_budget": 0}))
    response = client.post("/v1/chat/completions", json={**BODY, "stream": True})
    assert (response.status_code, memory_headers(response)) == (200, ("0", "over_budget"))
