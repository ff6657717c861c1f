"""The bounds on memory agent runs in flight (`memory.agent.max_runs_per_user` and
`max_concurrent_runs`): past either, a chat turn's agent is `busy` and calls no model,
`POST /memory/agent` answers 429 `too_many_runs`, and so the daily token budget is overshot by
at most the runs one user may have in flight."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from kvmem.errors import StoreUnavailable
from tests.support.apps import (
    AGENT_MODEL,
    LiveServer,
    live_services,
    services,
    wait_agents_idle,
    wait_until,
)
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


def test_turns_that_end_up_not_running_the_agent_give_their_slot_back(
    make_client: MakeClient, chat_sections: Any, upstream: Any
) -> None:
    """A turn takes its slot before it reads the store; when the read says the agent does not
    run (the user switched memory off, is over budget, or the store failed) the slot must
    come back at once. With one slot in the process, a slot kept would make the next turn
    of anyone `busy` until a restart."""
    client = make_client(
        **chat_sections(auth=KEYS_AUTH, agent={"max_concurrent_runs": 1, "daily_token_budget": 15})
    )
    memory = services(client).memory
    upstream.default(AGENT_MODEL, Reply(content="nothing"))

    def turn(user_id: str) -> str:
        response = client.post("/chat", json={"message": "hi"}, headers=as_user(user_id))
        assert response.status_code == 200, response.text
        wait_agents_idle(client)
        state = response.json()["memory"]["agent"]
        return "ran" if state in ("running", "done") else state  # (the reply does not wait)

    # Off: alice's memory switched off in her preferences.
    off = client.patch("/preferences", json={"memories": False}, headers=as_user("alice"))
    assert off.status_code == 200, off.text
    assert [turn("alice"), turn("alice"), turn("bob")] == ["skipped", "skipped", "ran"]
    # Over budget: carol's first run spends her 15 tokens.
    assert [turn("carol"), turn("carol"), turn("carol"), turn("dave")] == [
        "ran",
        "over_budget",
        "over_budget",
        "ran",
    ]
    # The store failed for erin's read.
    read_turn = memory._read_turn

    def failing(user_id: str, scope: str = "") -> Any:
        if user_id == "erin":
            raise StoreUnavailable("the memory store is unavailable: disk full")
        return read_turn(user_id, scope)

    memory._read_turn = failing  # type: ignore[method-assign]
    assert [turn("erin"), turn("erin"), turn("frank")] == ["failed", "failed", "ran"]
    assert len(upstream.received(AGENT_MODEL)) == 4


def test_a_run_reads_the_budget_only_while_holding_its_slot(
    make_server: Callable[..., LiveServer], chat_sections: Any, upstream: Any
) -> None:
    """B reads the budget while A runs (A's tokens not counted yet), and its read is held
    until A has ended and been recorded. B must have asked for its slot before reading: it
    is then `busy` (429). A slot taken after the read finds A's free, and B runs on a
    budget A has since spent."""
    server = make_server(**chat_sections(agent={"max_runs_per_user": 1, "daily_token_budget": 15}))
    upstream.default(AGENT_MODEL, Reply(content="nothing", delay=0.5))
    services = live_services(server)
    read_turn = services.memory._read_turn
    reads = 0
    release = threading.Event()

    def held_second_read(user_id: str, scope: str = "") -> Any:
        nonlocal reads
        reads += 1
        read = read_turn(user_id, scope)
        if reads == 2:  # B's: read while A runs, handed back once A has ended
            assert release.wait(10)
        return read

    services.memory._read_turn = held_second_read  # type: ignore[method-assign]
    with httpx.Client(base_url=server.url, timeout=30) as http, ThreadPoolExecutor(1) as pool:
        first = http.post("/memory/agent", json=agent_body("I live in Rome", wait=False))
        assert (first.status_code, first.json()) == (202, {"agent": "running"})
        upstream.wait_for(AGENT_MODEL)
        second = pool.submit(http.post, "/memory/agent", json=agent_body("I live in Oslo"))
        wait_until(lambda: reads == 2, what="B's budget read")
        agent = services.agent
        wait_until(lambda: agent.in_flight == 0 and agent.recording == 0, what="A recorded")
        release.set()
        answer = second.result()
    assert (answer.status_code, answer.json()) == (429, too_many_runs(1, 64))
    assert len(upstream.received(AGENT_MODEL)) == 1
