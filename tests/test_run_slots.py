"""The bounds on memory agent runs in flight (`memory.agent.max_runs_per_user` and
`max_concurrent_runs`): past either, a chat turn's agent is `busy` and calls no model,
`POST /memory/agent` answers 429 `too_many_runs`, and so the daily token budget is overshot by
at most the runs one user may have in flight."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from tests.support.apps import AGENT_MODEL, LiveServer, live_services, wait_agents_idle, wait_until
from tests.support.upstream import Reply

# Fifty concurrent agent runs.
pytestmark = pytest.mark.slow

MakeClient = Callable[..., TestClient]
SERVICE = {"Authorization": "Bearer service-secret"}
KEYS_AUTH = {"mode": "keys", "service_keys": ["service-secret"]}


def as_user(user_id: str) -> dict[str, str]:
    return {**SERVICE, "X-User-Id": user_id}


def agent_body(text: str, **fields: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}], **fields}


def too_many_runs(per_user: int, total: int) -> dict[str, Any]:
    return {
        "error": {
            "code": "too_many_runs",
            "message": (
                f"too many memory agent runs in flight (at most {per_user} per user and {total} in all): "
                "retry when one has ended"
            ),
        }
    }


def test_a_third_run_of_one_user_is_429_and_calls_no_model(
    make_client: MakeClient, chat_sections: Any, upstream: Any
) -> None:
    client = make_client(**chat_sections(agent={"grace_seconds": 2}))
    upstream.default(AGENT_MODEL, Reply(content="nothing to remember", delay=1.0))
    body = agent_body("I live in Rome", wait=False)
    first, second = (client.post("/memory/agent", json=body) for _ in range(2))
    assert [(r.status_code, r.json()) for r in (first, second)] == [(202, {"agent": "running"})] * 2
    third = client.post("/memory/agent", json=body)
    assert (third.status_code, third.json(), third.headers["retry-after"]) == (
        429,
        too_many_runs(2, 64),
        "2",
    )
    # No model call for the refused one, and it is counted under its state.
    assert len(upstream.wait_for(AGENT_MODEL, 2)) == 2
    wait_agents_idle(client)
    assert len(upstream.received(AGENT_MODEL)) == 2
    assert 'kvmem_agent_runs_total{state="busy"} 1.0' in client.get("/metrics").text
    # Once they ended, the user may run again.
    assert client.post("/memory/agent", json=agent_body("I live in Rome")).json() == {
        "agent": "done",
        "updates": [],
    }


def test_a_chat_turn_past_a_bound_is_busy_per_user_and_per_process(
    make_client: MakeClient, chat_sections: Any, upstream: Any
) -> None:
    client = make_client(
        **chat_sections(auth=KEYS_AUTH, agent={"max_runs_per_user": 1, "max_concurrent_runs": 2})
    )
    # Each run lasts 2.5 s (under the 3 s grace): alice's and bob's must still hold their slots
    # when carol comes, three turns later (with 1 s, on a loaded CI worker, alice's had ended).
    upstream.default(AGENT_MODEL, Reply(content="nothing", delay=2.5))

    def turn(user_id: str) -> Any:
        response = client.post("/chat", json={"message": "hi"}, headers=as_user(user_id))
        assert response.status_code == 200, response.text
        return response.json()["memory"]

    assert turn("alice")["agent"] == "running"
    assert turn("alice") == {"injected": [], "agent": "busy", "updates": []}  # alice's one
    assert turn("bob")["agent"] == "running"
    assert turn("carol") == {"injected": [], "agent": "busy", "updates": []}  # the process's two
    wait_agents_idle(client)
    assert len(upstream.received(AGENT_MODEL)) == 2
    assert turn("carol")["agent"] == "running"


def test_fifty_concurrent_runs_of_one_user_overshoot_the_budget_by_at_most_two_runs(
    make_server: Callable[..., LiveServer], chat_sections: Any, upstream: Any
) -> None:
    """Issue 22's probe: 50 runs at once for one user with a small budget used 10x the budget.
    Each scripted run uses 15 tokens; with a budget of 40 and 2 runs in flight per user, at
    most 40 + 2 x 15 = 70 tokens (4 runs) may be used, however the requests race."""
    server = make_server(**chat_sections(agent={"daily_token_budget": 40, "grace_seconds": 5}))
    upstream.default(AGENT_MODEL, Reply(content="nothing", delay=0.3))

    # One client for the 200 requests, shared by the threads (httpx's is thread-safe):
    # `httpx.post` builds a client, and its TLS context, per call (~33 ms of CPU each). It
    # drops a connection idle 2 s, before the server's 5 s keep-alive closes it: a request
    # sent just as the server closes its connection fails ("Server disconnected without
    # sending a response", seen once when a wave took ~5 s on a loaded machine).
    limits = httpx.Limits(max_connections=50, max_keepalive_connections=50, keepalive_expiry=2.0)
    with httpx.Client(timeout=30, limits=limits) as http, ThreadPoolExecutor(50) as pool:

        def run_agent(_: int) -> int:
            return http.post(f"{server.url}/memory/agent", json=agent_body("hi")).status_code

        for _ in range(4):  # waves: the later ones come after earlier runs were recorded
            statuses = list(pool.map(run_agent, range(50)))
            assert set(statuses) <= {200, 429}
    agent = live_services(server).agent
    wait_until(lambda: agent.in_flight == 0 and agent.recording == 0, what="runs recorded")
    totals = httpx.get(f"{server.url}/usage?days=1").json()["totals"]
    used = totals["input_tokens"] + totals["output_tokens"]
    assert 40 <= used <= 40 + 2 * 15
    assert len(upstream.received(AGENT_MODEL)) == used // 15
