"""`/healthz`: is the process up, and can it reach its store."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from kvmem import __version__
from kvmem.services import services_of


async def healthz(request: Request) -> Response:
    """Always 200 while the process serves (chat works without the store); says if the store is up."""
    reachable = await run_in_threadpool(services_of(request).database.ping)
    store = "ok" if reachable else "unavailable"
    return JSONResponse({"status": "ok", "version": __version__, "store": store})


routes = [Route("/healthz", healthz, methods=["GET"])]
