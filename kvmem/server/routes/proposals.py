"""`/memory/proposals`: the memory agent's writes waiting for the person's review.

Registered before `/memory/{key}` (see `kvmem.server.routes.memory`); `proposals` is a reserved key.
An id that is not one of this user's pending proposals, another user's included, is 404. Each route
acts on the proposals of one layer (`?scope=NAME`, else the person's own): an id of another layer
is 404 too.
"""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from kvmem.errors import NotFound
from kvmem.memory.write_outcomes import in_layer, written_json
from kvmem.server.routes import route
from kvmem.server.routes.layers import scope_param
from kvmem.server.services import require_memory, services_of, user_of

MAX_ID_DIGITS = 18  # within a 64-bit integer


def _proposal_id(request: Request) -> int:
    raw = request.path_params["id"]
    if not raw.isascii() or not raw.isdigit() or len(raw) > MAX_ID_DIGITS:
        raise NotFound(f"no pending proposal {raw[:40]!r}")
    return int(raw)


async def list_proposals(request: Request) -> Response:
    services = services_of(request)
    user = await user_of(request)
    require_memory(services)
    scope = scope_param(request, services.store.rules)
    pending = await run_in_threadpool(services.proposals.pending, user, scope)
    return JSONResponse(
        in_layer({"proposals": [proposal.as_json() for proposal in pending]}, scope)
    )


async def reject_all(request: Request) -> Response:
    services = services_of(request)
    user = await user_of(request)
    require_memory(services)
    scope = scope_param(request, services.store.rules)
    rejected = await run_in_threadpool(services.proposals.reject_all, user, scope)
    return JSONResponse(in_layer({"rejected": rejected}, scope))


async def accept(request: Request) -> Response:
    services = services_of(request)
    user = await user_of(request)
    require_memory(services)
    scope = scope_param(request, services.store.rules)
    proposal_id = _proposal_id(request)
    accepted = await run_in_threadpool(services.proposals.accept, user, proposal_id, scope)
    services.metrics.memory_write("agent", "set" if accepted.entry else "delete")
    limit = services.store.rules.layer(scope).token_limit
    return JSONResponse(in_layer(written_json(accepted, limit), scope))


async def reject(request: Request) -> Response:
    services = services_of(request)
    user = await user_of(request)
    require_memory(services)
    scope = scope_param(request, services.store.rules)
    await run_in_threadpool(services.proposals.reject, user, _proposal_id(request), scope)
    return Response(status_code=204)


routes = [
    route("/memory/proposals", GET=list_proposals, DELETE=reject_all),
    route("/memory/proposals/{id}/accept", POST=accept),
    route("/memory/proposals/{id}/reject", POST=reject),
]
