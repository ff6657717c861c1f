"""Looking into a running test app: its services, its agent runs and its SSE streams."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from starlette.testclient import TestClient

from kvmem.services import Services


def services(client: TestClient) -> Services:
    """The services the app's lifespan built (the TestClient keeps the lifespan state)."""
    return client.app_state["services"]


def wait_until(
    condition: Callable[[], bool], timeout: float = 10.0, what: str = "condition"
) -> None:
    """Poll `condition` until it holds; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout} s")
        time.sleep(0.01)


def wait_agents_idle(client: TestClient, timeout: float = 10.0) -> None:
    """Wait until no memory agent run of this app is in flight."""
    agent = services(client).agent
    wait_until(lambda: agent.in_flight == 0, timeout, "the memory agent finishing")


def outcomes(client: TestClient) -> dict[str, int]:
    """How the app's agent runs ended so far (`done`, `failed`, `timeout`, ...)."""
    return dict(services(client).agent.outcomes)


def sse_events(text: str) -> list[tuple[str, Any]]:
    """A Server-Sent Events body as (event, parsed JSON data) pairs, in order."""
    events = []
    assert text.endswith("\n\n"), f"the stream did not end with a complete event: {text[-80:]!r}"
    for block in text.split("\n\n")[:-1]:
        fields = dict(line.split(": ", 1) for line in block.split("\n"))
        assert set(fields) == {"event", "data"}, block
        events.append((fields["event"], json.loads(fields["data"])))
    return events


class Containing:
    """Equal to any string containing `part` (for messages that quote the upstream's text)."""

    def __init__(self, part: str) -> None:
        self.part = part

    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and self.part in other

    def __repr__(self) -> str:
        return f"<string containing {self.part!r}>"


def agent_tool_call(name: str, arguments: Any, call_id: str | None = None) -> dict[str, Any]:
    """A scripted tool call for `Reply(tool_calls=[...])`."""
    call: dict[str, Any] = {"name": name, "arguments": arguments}
    if call_id is not None:
        call["id"] = call_id
    return call


def set_memory(key: str, value: str, **extra: Any) -> dict[str, Any]:
    """A scripted `set_memory` call."""
    return agent_tool_call("set_memory", {"key": key, "value": value, **extra})


def delete_memory(key: str, **extra: Any) -> dict[str, Any]:
    """A scripted `delete_memory` call."""
    return agent_tool_call("delete_memory", {"key": key, **extra})
