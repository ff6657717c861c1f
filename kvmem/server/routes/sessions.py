"""`/sessions`: minting and ending the short-lived tokens a page or front end hands a user."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from kvmem.entries import iso
from kvmem.errors import BadRequest, Forbidden
from kvmem.server.routes import route
from kvmem.server.services import services_of, user_of


async def create_session(request: Request) -> Response:
    """A new session token for the request's user (a user key's, or the one a service key names)."""
    services = services_of(request)
    user = await user_of(request)
    if services.auth.mode == "keys" and services.auth.session_token(request.headers):
        # A session that could mint its successor would never expire.
        raise Forbidden("a session token cannot create sessions; use a user key or a service key")
    assert services.auth.sessions is not None
    key = services.auth.user_key(request.headers)
    made = await run_in_threadpool(services.auth.sessions.create, user, key)
    return JSONResponse({"token": made.token, "expires_at": iso(made.expires_at)}, status_code=201)


async def end_current_session(request: Request) -> Response:
    """End the session token this request is made with."""
    services = services_of(request)
    await user_of(request)
    token = services.auth.session_token(request.headers)
    if token is None:
        raise BadRequest(
            "this request is not made with a session token: send Authorization: Bearer <token>"
        )
    assert services.auth.sessions is not None
    await run_in_threadpool(services.auth.sessions.end, token)
    return Response(status_code=204)


routes = [
    route("/sessions", POST=create_session),
    route("/sessions/current", DELETE=end_current_session),
]
