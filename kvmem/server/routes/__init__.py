"""The HTTP routes, one module per group of paths, and `route`, which builds one `Route` per
path with all of its methods."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from kvmem.agent.turn_memory import TurnMemory, check_conversation_id
from kvmem.errors import BadRequest
from kvmem.memory.rules import OWN
from kvmem.server.services import scope_header, services_of

Handler = Callable[[Request], Awaitable[Response]]


def route(path: str, **handlers: Handler) -> Route:
    """One `Route` for `path` with a handler per method (`GET=...`, `PUT=...`); GET answers HEAD.

    With one `Route` per method, Starlette's 405 would name only the first route's methods.
    """
    if "GET" in handlers:
        handlers.setdefault("HEAD", handlers["GET"])

    async def dispatch(request: Request) -> Response:
        return await handlers[request.method](request)

    return Route(path, dispatch, methods=list(handlers))


def memory_off(request: Request) -> bool:
    """Whether the request asks to chat without memory (`X-Memory: off`): nothing is read,
    nothing is written."""
    return request.headers.get("x-memory", "").strip().lower() == "off"


def conversation_id(request: Request) -> str | None:
    """The conversation a request belongs to, for history and the agent's records:
    `X-Conversation-Id`, else the first header of `auth.conversation_id_headers` present
    (Open WebUI's `X-OpenWebUI-Chat-Id`); 400 when the one found is not a conversation id."""
    headers = request.headers
    value = headers.get("x-conversation-id")
    if value is None:
        names = services_of(request).config.auth.conversation_id_headers
        value = next((headers[name] for name in names if name in headers), None)
    return check_conversation_id(value)


def turn_scope(
    request: Request,
    in_body: str | None = None,
    *,
    model: str | None = None,
    reads_memory: bool = True,
) -> str:
    """The scope a turn names (CONTRACT section 23): `X-Memory-Scope` or the body's `scope`
    (400 when both are given and differ, or two headers do; an empty header names none, as
    an empty `X-Conversation-Id` does), else, on `/v1` and `/api` (`model`) with
    `memory.scopes.by_model`, `model:<model id>`; `OWN` for none. 400 when the scope is
    malformed or the server keeps no scopes (`MemoryRules.scope`). A turn that `reads_memory`
    not (a front end's task call, `X-Memory: off`) needs no scope of its model's: a model id
    that cannot be one does not refuse it."""
    services = services_of(request)
    in_header = scope_header(request)
    if in_header is not None and in_body is not None and in_header != in_body:
        raise BadRequest("X-Memory-Scope and the body's scope name different scopes")
    named = in_body if in_body is not None else in_header
    rules = services.store.rules
    if named is not None:
        return rules.scope(named)
    scopes = services.config.memory.scopes
    if model is None or scopes is None or not scopes.by_model or not reads_memory:
        return OWN
    try:
        return rules.scope(f"model:{model}")
    except BadRequest as exc:
        raise BadRequest(
            f"the model id {model!r} cannot form a scope (memory.scopes.by_model makes it "
            f"'model:<model id>', 1-128 characters of A-Z, a-z, 0-9 and . _ : @ / -): "
            "send X-Memory-Scope to name the scope"
        ) from exc


def memory_headers(memory: TurnMemory) -> dict[str, str]:
    """`X-Memory-Injected` (entries in the block) and `X-Memory-Agent` (the agent's state
    as the headers leave: a streamed reply's agent is usually still `running`; `task` for a
    front end's own call)."""
    return {"X-Memory-Injected": str(len(memory.injected)), "X-Memory-Agent": memory.run.state}
