"""`/mcp` over HTTP: the endpoint kvmem mounts, and the MCP transport it starts on first use.

The `mcp` SDK is a large import (some 25 MiB of a server's memory and most of a second of its
start), and most servers are never asked to speak MCP: so this module does not import it.
The first `/mcp` request that passes the endpoint's checks makes the `McpHttp` transport,
which imports `mcp_server.py` (with `mcp_tools.py`, the one place that imports the SDK), and
starts it inside the app's lifespan; later requests use the running one. A request's
`X-Memory-Scope` (checked here: a malformed one, or one on a server without `memory.scopes`,
is 400) is the default scope of its tool calls.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import ModuleType

import anyio
from anyio.abc import TaskGroup, TaskStatus
from starlette.requests import Request
from starlette.types import Message, Receive, Scope, Send

from kvmem.errors import BadRequest, MethodNotAllowed
from kvmem.late_imports import import_late
from kvmem.server.bodies import check_numbers, read_body
from kvmem.server.services import Services, scope_header, user_of


def import_mcp_server() -> ModuleType:
    """`mcp_server.py`, and with it the SDK: imported on first use, one late import at a
    time (its packages, and `mcp_tools.py`, which holds the SDK's types, are forgotten and
    imported again if a failed import half-loaded them)."""
    return import_late(
        "kvmem.server.mcp_server", packages=("kvmem.server.mcp_tools", "mcp", "mcp_types")
    )


class McpHttp:
    """The SDK's streamable HTTP transport over kvmem's MCP server (`McpEndpoint` hands it each
    `/mcp` request after refusing other sites' pages and authenticating as every route does).

    Stateless JSON mode (see `mcp_server.http_sessions`): each POST is served on its own.
    Making one imports `mcp_server.py`, and with it the SDK.
    """

    def __init__(self, services: Services) -> None:
        mcp_server = import_mcp_server()
        self.user_scope_key = mcp_server.USER_SCOPE_KEY
        self.memory_scope_key = mcp_server.MEMORY_SCOPE_KEY
        self.sessions = mcp_server.http_sessions(services)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Run the transport's task group."""
        async with self.sessions.run():
            yield

    async def handle(
        self, scope: Scope, receive: Receive, send: Send, *, user: str, memory_scope: str | None
    ) -> None:
        """Serve one `/mcp` request, acting for `user` (whom kvmem's auth found), its tool
        calls in `memory_scope` unless they name theirs (None: the user's own memory)."""
        scope[self.user_scope_key] = user
        scope[self.memory_scope_key] = memory_scope
        await self.sessions.handle_request(scope, receive, send)


class McpTransport:
    """The streamable HTTP transport of `/mcp`: started by the first request that needs it,
    stopped when the app's lifespan ends, before the services it uses shut down."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self.max_body_bytes = services.config.server.max_body_bytes
        self._http: McpHttp | None = None
        self._starting = anyio.Lock()
        self._tasks: TaskGroup | None = None
        self._stop = anyio.Event()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Hold the task that runs the transport once started (the app's lifespan holds this);
        on exit, end that task, and with it every MCP call still in flight."""
        async with anyio.create_task_group() as tasks:
            self._tasks = tasks
            try:
                yield
            finally:
                self._tasks = None
                self._stop.set()

    async def http(self) -> McpHttp:
        """The running transport, started now if no request has started it yet."""
        if self._http is not None:
            return self._http
        async with self._starting:
            if self._http is None:
                if self._tasks is None:
                    raise RuntimeError("the MCP transport runs only while the app's lifespan does")
                # The SDK's import (~1 s of CPU, several on a loaded machine) runs in a worker
                # thread: on the event loop it would stall every other request meanwhile.
                await anyio.to_thread.run_sync(import_mcp_server)
                http = McpHttp(self.services)
                await self._tasks.start(self._run, http)
                self._http = http
        return self._http

    async def _run(self, http: McpHttp, *, task_status: TaskStatus[None]) -> None:
        async with http.running():
            task_status.started()
            await self._stop.wait()


class McpEndpoint:
    """The ASGI app mounted at `/mcp`; finds the `McpTransport` in the lifespan state."""

    # Host and Origin (a page elsewhere must not drive a local MCP server) are checked for
    # every request in front of all routes, by `site_guard.py`.

    def __init__(self, state_key: str) -> None:
        self.state_key = state_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        if request.method != "POST":
            # Stateless: no session to end (DELETE) and no server-sent stream to open (GET),
            # which the transport answers with 405 too.
            raise MethodNotAllowed(
                f"{request.method} is not allowed on /mcp: send JSON-RPC by POST"
            )
        content_type = request.headers.get("content-type", "")
        if not content_type.lower().startswith("application/json"):
            raise BadRequest(
                "POST /mcp takes a JSON-RPC message: send Content-Type: application/json"
            )
        user = await user_of(request)
        transport: McpTransport = scope["state"][self.state_key]
        # An empty header names no scope, as on the chat routes.
        named = scope_header(request)
        memory_scope = None if named is None else transport.services.store.rules.scope(named)
        # Read here, within server.max_body_bytes, so that an oversized body gets kvmem's
        # 413; the transport then reads the same bytes.
        body = await read_body(request, transport.max_body_bytes)
        check_numbers(body)  # the transport's parser takes NaN and integers of any size
        http = await transport.http()
        await http.handle(scope, _replay(body, receive), send, user=user, memory_scope=memory_scope)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives `body` (already read) first, then what the client sends next
    (its disconnect)."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
