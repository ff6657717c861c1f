"""`/healthz`: is the process up, can it reach its store, and is the memory agent working."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from kvmem import __version__
from kvmem.server.services import services_of


async def healthz(request: Request) -> Response:
    """Always 200 while the process serves (chat works without the store); says if the store
    is up, and whether the agent is on, whether it is ready (on, and no API key it needs is
    missing), why, and its last failure: its code and upstream status, and its message
    (secrets masked) only to a caller holding a service key."""
    services = services_of(request)
    reachable = await run_in_threadpool(services.database.ping)
    store = "ok" if reachable else "unavailable"
    enabled, reason = services.config.agent_status()
    missing = services.agent_key_missing()
    last_error = services.agent.last_error
    agent = {
        "enabled": enabled,
        "ready": enabled and missing is None,
        "reason": missing or reason,
        "last_error": last_error.as_json(
            with_message=services.auth.holds_service_key(request.headers)
        )
        if last_error
        else None,
    }
    body = {"status": "ok", "version": __version__, "store": store, "agent": agent}
    if services.database.wal_pending:
        # Erased text is still in SQLite's WAL while a reader holds an older snapshot.
        body["wal"] = "erased text pending checkpoint"
    return JSONResponse(body)


routes = [Route("/healthz", healthz, methods=["GET"])]
