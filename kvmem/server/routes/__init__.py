"""The HTTP routes, one module per group of paths, and `route`, which builds one `Route` per
path with all of its methods."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

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
