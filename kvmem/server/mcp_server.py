"""kvmem as a Model Context Protocol server, so MCP clients (desktop assistants, IDE agents)
read and write the same memory: tools `memory_list`, `memory_get`, `memory_set`,
`memory_delete`, `memory_history`, `memory_proposals`, `memory_proposal_accept`,
`memory_proposal_reject`, and the resource `memory://block`. On a server that keeps scopes
(`memory.scopes`) every tool takes a `scope`, `memory_scopes` lists the user's, and a session may name its default scope
(`X-Memory-Scope` on `/mcp`, `kvmem mcp --scope`): an argument naming another scope than the
session's is an error result, not a guess at which one was meant.

With mcp_tools.py (the tools' argument models and schemas, which only this module imports),
the one place that imports the `mcp` SDK, itself imported only when first needed (`kvmem
mcp`, or the first request to `/mcp`). It serves the SDK's low-level `Server` over two
transports: stdio (`kvmem mcp`, acting for one user) and streamable HTTP at `/mcp` (each
request acting for the user kvmem's auth finds in its headers, as on every other route;
`mcp_http.py` mounts the endpoint and runs the transport `http_sessions` makes).
Writes go through `MemoryStore` with source `mcp`, so every rule holds without new code;
a refused write is an error result whose text is what the memory agent is told.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any

import anyio.to_thread
import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from kvmem.agent.tools import refusal_message
from kvmem.entries import utcnow
from kvmem.errors import BadRequest, KeyNotAllowed, KvmemError, NotFound, describe_problems
from kvmem.memory.expiry import expiry_of
from kvmem.memory.overview import memory_overview
from kvmem.memory.rules import OWN, MemoryRules
from kvmem.memory.write_outcomes import in_layer, written_json
from kvmem.server.mcp_tools import TOOLS, ProposalArguments, tool_definitions
from kvmem.server.services import Services

log = logging.getLogger("kvmem.mcp")

BLOCK_URI = "memory://block"
# Where `/mcp` leaves the authenticated user for the tool handlers (which see the request).
USER_SCOPE_KEY = "kvmem.user"
# Where `/mcp` leaves the scope its request's X-Memory-Scope named (checked already).
MEMORY_SCOPE_KEY = "kvmem.memory_scope"
INSTRUCTIONS = (
    "kvmem holds a small key/value memory about the user that is shown to their assistants "
    "in every conversation. Read it with memory_list or memory_get; change it with "
    "memory_set and memory_delete only when the user asks you to remember, update or forget "
    "something. The resource memory://block is the text injected into chats."
)
SCOPED_INSTRUCTIONS = (
    " Some keys are kept per scope (an assistant, a model or a project), apart from the "
    "user's own memory: memory_scopes lists the scopes, and each tool's scope argument "
    "names the one to act on."
)


class MemoryMcp:
    """The MCP server's handlers over one app's services, for the user each request acts for."""

    def __init__(
        self,
        services: Services,
        *,
        stdio_user: str | None = None,
        stdio_scope: str | None = None,
    ) -> None:
        self.services = services
        self.stdio_user = stdio_user
        self.stdio_scope = stdio_scope
        self.rules: MemoryRules = services.store.rules
        self._tools = tool_definitions(self.rules)

    def server(self) -> Server[Any]:
        """A low-level SDK `Server` with kvmem's tools and resource."""
        return Server(
            "kvmem",
            version=_version(),
            instructions=INSTRUCTIONS + (SCOPED_INSTRUCTIONS if self.rules.scoped else ""),
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_list_resources=self._list_resources,
            on_read_resource=self._read_resource,
        )

    def user(self, ctx: ServerRequestContext[Any]) -> str:
        """The user this message acts for: `/mcp`'s authenticated user, or stdio's user."""
        request = ctx.request
        if request is None:
            if self.stdio_user is None:  # HTTP messages always carry their request
                raise MCPError(code=types.INVALID_REQUEST, message="no authenticated user")
            return self.stdio_user
        user = request.scope.get(USER_SCOPE_KEY)
        if not isinstance(user, str):
            raise MCPError(code=types.INVALID_REQUEST, message="no authenticated user")
        return user

    def session_scope(self, ctx: ServerRequestContext[Any]) -> str | None:
        """The scope this message's session named (None: none): `/mcp`'s X-Memory-Scope, or
        `kvmem mcp --scope`; each checked before a tool runs."""
        request = ctx.request
        if request is None:
            return self.stdio_scope
        named = request.scope.get(MEMORY_SCOPE_KEY)
        return named if isinstance(named, str) else None

    def layer_of(self, ctx: ServerRequestContext[Any], named: str | None) -> str:
        """The layer a tool call acts on: the scope its argument names, else the session's,
        else the person's own; `BadRequest` for a malformed scope, a scope on a server that
        keeps none, or an argument naming another scope than the session's."""
        session = self.session_scope(ctx)
        if named is not None and session is not None and named != session:
            raise BadRequest(
                f"the scope argument names {named!r} but this session's scope is {session!r} "
                "(X-Memory-Scope, or kvmem mcp --scope): leave the argument out, or name the same"
            )
        return self.rules.scope(named if named is not None else session)

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=self._tools)

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        began = utcnow()  # a write begun before an erasure answered never lands after it
        arguments_model = TOOLS.get(params.name)
        if arguments_model is None:
            raise MCPError(
                code=types.INVALID_PARAMS,
                message=f"Unknown tool: {params.name}. Tools: {', '.join(TOOLS)}",
            )
        user = self.user(ctx)
        raw = params.arguments or {}
        try:
            arguments = arguments_model.model_validate(raw)
        except ValidationError as exc:
            problems = describe_problems(exc, "arguments")
            return _error(f"Error: invalid arguments for {params.name}: {problems}.")
        if self.services.config.memory.disabled:
            return _error("Error: memory is disabled on this server (memory.disabled is true).")
        named = getattr(arguments, "scope", None)
        try:
            layer = self.layer_of(ctx, named)
        except BadRequest as exc:
            return _error(f"Error: {exc.message}")
        key = getattr(arguments, "key", None)
        if named is None and layer != OWN and isinstance(key, str):
            # A key belongs to one layer: in a scoped session the person's own keys are
            # theirs, routed as a scoped chat's agent writes are (refused when isolated).
            try:
                layer = self.rules.scope_of_write(key, layer)
            except KeyNotAllowed as exc:
                return self._refused(params.name, layer, arguments, exc)
        try:
            return await anyio.to_thread.run_sync(
                self._run_tool, params.name, user, layer, arguments, began
            )
        except KvmemError as exc:
            return self._refused(params.name, layer, arguments, exc)

    def _refused(
        self, name: str, layer: str, arguments: Any, exc: KvmemError
    ) -> types.CallToolResult:
        """A refused call's error result: what the memory agent is told, or plainer words."""
        key = getattr(arguments, "key", None)
        if isinstance(exc, NotFound) and name == "memory_get":
            return _error(f'No memory with key "{key}".')
        if isinstance(arguments, ProposalArguments):  # memory_proposal_accept and _reject
            if isinstance(exc, NotFound):
                return _error(f"No pending proposal with id {arguments.id}.")
            return _error(f"Error: {exc.message}; the proposal stays pending.")
        if layer == OWN and isinstance(key, str) and self.rules.is_scoped_key(key):
            return _error(f"Error: {exc.message}")  # "kept per scope: name the scope ..."
        return _error(refusal_message(exc, key, self.rules.layer(layer).valid_keys))

    def _run_tool(
        self, name: str, user: str, layer: str, arguments: Any, began: datetime
    ) -> types.CallToolResult:
        """One tool call on one layer of the user's memory, in a worker thread (the store
        blocks). A scoped call's answer names its `scope`."""
        store = self.services.store
        limit = self.rules.layer(layer).token_limit
        if name == "memory_list":
            return _data(self._overview(user, layer))
        if name == "memory_scopes":  # every scope of the user's, whatever the session's
            scopes = [
                {"scope": scope, "entries": entries, "total_tokens": tokens}
                for scope, entries, tokens in store.scopes(user)
            ]
            return _data({"scopes": scopes})
        if name == "memory_get":
            return _data(in_layer(store.get(user, arguments.key, scope=layer).as_json(), layer))
        if name == "memory_set":
            expires_at = expiry_of(arguments.expires_at, arguments.expires_in, store.clock())
            written = store.set(
                user,
                arguments.key,
                arguments.value,
                "mcp",
                since=began,
                expires_at=expires_at,
                scope=layer,
            )
            self.services.metrics.memory_write("mcp", "set")
            entry = written.entry
            return _result(
                f'Memory set for key "{entry.key}" ({entry.token_count} tokens){_in(layer)}',
                in_layer(written_json(written, limit), layer),
            )
        if name == "memory_delete":
            entry = store.delete(user, arguments.key, "mcp", since=began, scope=layer)
            self.services.metrics.memory_write("mcp", "delete")
            return _result(
                f'Memory deleted for key "{entry.key}"{_in(layer)}',
                in_layer({"deleted": entry.as_json()}, layer),
            )
        if name == "memory_history":
            page = store.history(
                user, arguments.key, arguments.limit, arguments.before, scope=layer
            )
            return _data(in_layer(page.as_json(), layer))
        proposals = self.services.proposals
        if name == "memory_proposals":
            pending = proposals.pending(user, scope=layer)
            return _data(in_layer({"proposals": [p.as_json() for p in pending]}, layer))
        if name == "memory_proposal_accept":
            accepted = proposals.accept(user, arguments.id, scope=layer)
            self.services.metrics.memory_write("agent", "set" if accepted.entry else "delete")
            return _result(
                f"Proposal {arguments.id} kept", in_layer(written_json(accepted, limit), layer)
            )
        if name == "memory_proposal_reject":
            proposals.reject(user, arguments.id, scope=layer)
            return _result(f"Proposal {arguments.id} dismissed", in_layer({"rejected": 1}, layer))
        raise AssertionError(f"tool {name} has no implementation")  # TOOLS and this agree

    def _overview(self, user: str, layer: str) -> dict[str, Any]:
        """`memory_list`'s answer: as `GET /memory` (with `?scope=`), one layer's."""
        snapshot = self.services.store.layer(user, layer)
        return memory_overview(snapshot, self.services.config, scope=layer)

    async def _list_resources(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        block = types.Resource(
            uri=BLOCK_URI,
            name="memory_block",
            title="Memory block",
            description="The memory block kvmem appends to this user's system message in "
            "every chat (in the session's scope, when it names one; empty when memory is off "
            "or holds nothing).",
            mime_type="text/plain",
        )
        return types.ListResourcesResult(resources=[block])

    async def _read_resource(
        self, ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        if str(params.uri) != BLOCK_URI:
            raise MCPError(code=types.INVALID_PARAMS, message=f"Unknown resource: {params.uri}")
        user = self.user(ctx)
        try:
            context = await self.services.memory.context(user, self.layer_of(ctx, None))
        except KvmemError as exc:
            raise MCPError(code=types.INTERNAL_ERROR, message=exc.message) from exc
        contents = types.TextResourceContents(
            uri=BLOCK_URI, text=context.block, mime_type="text/plain"
        )
        return types.ReadResourceResult(contents=[contents])


def _in(layer: str) -> str:
    return "" if layer == OWN else f" in scope {layer!r}"


def _result(text: str, structured: dict[str, Any]) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(text=text)], structured_content=structured
    )


def _data(value: dict[str, Any]) -> types.CallToolResult:
    """A read's result: the same JSON as the REST route, as text and as structured content."""
    return _result(json.dumps(value, ensure_ascii=False), value)


def _error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)


def _version() -> str:
    from importlib.metadata import version

    return version("kvmem")


async def serve_stdio(services: Services, user_id: str, scope: str | None = None) -> None:
    """Serve MCP on stdin/stdout for `user_id` until the client closes the pipe; `scope`
    (checked by the caller): the tools' default scope."""
    server = MemoryMcp(services, stdio_user=user_id, stdio_scope=scope).server()
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


def http_sessions(services: Services) -> StreamableHTTPSessionManager:
    """The SDK's streamable HTTP transport over kvmem's MCP server, for `/mcp` (`McpHttp` in
    mcp_http.py runs it and hands it each request, with its user under `USER_SCOPE_KEY`).

    Stateless JSON mode: each POST carries its own credentials and is served on its own, so
    there is no session that another credential could ride on, and replicas need nothing
    shared.
    """
    return StreamableHTTPSessionManager(
        app=MemoryMcp(services).server(),
        json_response=True,
        stateless=True,
        max_request_body_size=services.config.server.max_body_bytes,
    )
