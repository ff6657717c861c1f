"""Test apps and servers, and looking into them: services, agent runs, tasks and SSE streams."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import uvicorn
from starlette.testclient import TestClient

from kvmem.server.services import Services
from tests.support.ports import bound_socket

# The base URL of test clients: a loopback Host, as a local program sends it. TestClient's
# own default (`testserver`) is not a name `local` mode answers to (server.allowed_hosts).
LOCAL_URL = "http://127.0.0.1"
MAIN_MODEL = "main-model"
AGENT_MODEL = "agent-model"


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
    """Wait until no memory agent run of this app is in flight or still being recorded."""
    agent = services(client).agent
    wait_until(
        lambda: agent.in_flight == 0 and agent.recording == 0,
        timeout,
        "the memory agent finishing (and its usage recorded)",
    )


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


class LiveServer:
    """kvmem served by uvicorn on a free 127.0.0.1 port, in a background thread."""

    def __init__(self, app: Any, **options: Any) -> None:
        """`options` are more uvicorn settings (`kvmem.server.http_protocol.uvicorn_options`)."""
        # Served on a socket bound here (not a port picked and let go: another process could
        # take it first, see tests/support/ports.py).
        self.socket = bound_socket()
        self.port: int = self.socket.getsockname()[1]
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", **options)
        )
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("kvmem did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.socket.close()  # uvicorn closed it when it served; not when it failed to start


def live_services(server: LiveServer) -> Services:
    """The services of a live server's app (uvicorn keeps the lifespan state)."""
    return server.server.lifespan.state["services"]


def loop_tasks(server: LiveServer) -> list[str]:
    """The tasks on a live server's event loop (litellm's own workers aside), by name."""
    loop = server.server.servers[0].get_loop()

    async def names() -> list[str]:
        current = asyncio.current_task()
        found = []
        for task in asyncio.all_tasks():
            coro = task.get_coro()
            code = getattr(coro, "cr_code", None)
            if task is current or (code is not None and "litellm" in code.co_filename):
                continue
            found.append(getattr(coro, "__qualname__", repr(coro)))
        return sorted(found)

    return asyncio.run_coroutine_threadsafe(names(), loop).result(timeout=5)


def stop_recording_warnings(server: LiveServer) -> list[str]:
    """Stop a live server; the ResourceWarnings its loop gave on closing (see the test below)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        server.stop()
    assert not server.thread.is_alive()
    return [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
