"""`/memory` and `/preferences`: reading and editing a user's entries by hand.

The history, revert, export/import and erasure routes live in `kvmem.routes.history`; this
module's `routes` lists them in the order that keeps `/memory/{key}` from taking
`/memory/history` and `/memory/export`.
"""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from kvmem.bodies import MemoryValue, Preferences, read_model
from kvmem.errors import PersonalizeDisabled
from kvmem.overview import memory_overview
from kvmem.routes import history, route
from kvmem.services import require_memory, services_of, user_of


async def list_memories(request: Request) -> Response:
    services = services_of(request)
    user = await user_of(request)
    require_memory(services)
    snapshot = await run_in_threadpool(services.store.snapshot, user)
    return JSONResponse(memory_overview(snapshot, services.config))


async def clear_memories(request: Request) -> Response:
    services = services_of(request)
    user = await user_of(request)
    require_memory(services)
    deleted = await run_in_threadpool(services.store.clear, user)
    services.metrics.memory_write("manual", "clear")
    return JSONResponse({"deleted": deleted})


async def get_memory(request: Request) -> Response:
    services = services_of(request)
    user = await user_of(request)
    require_memory(services)
    entry = await run_in_threadpool(services.store.get, user, request.path_params["key"])
    return JSONResponse(entry.as_json())


async def put_memory(request: Request) -> Response:
    services = services_of(request)
    user = await user_of(request)
    require_memory(services)
    key = services.store.rules.check_key(request.path_params["key"])
    body = await read_model(request, MemoryValue, services.config.server.max_body_bytes)
    written = await services.store.set_async(user, key, body.value, "manual")
    services.metrics.memory_write("manual", "set")
    return JSONResponse(
        {
            "memory": written.entry.as_json(),
            "total_tokens": written.total_tokens,
            "token_limit": services.config.memory.token_limit,
        },
        status_code=201 if written.created else 200,
    )


async def delete_memory(request: Request) -> Response:
    services = services_of(request)
    user = await user_of(request)
    require_memory(services)
    await run_in_threadpool(services.store.delete, user, request.path_params["key"])
    services.metrics.memory_write("manual", "delete")
    return Response(status_code=204)


async def get_preferences(request: Request) -> Response:
    services = services_of(request)
    user = await user_of(request)
    require_memory(services)
    enabled = await run_in_threadpool(services.store.memories_enabled, user)
    return JSONResponse({"memories": enabled})


async def patch_preferences(request: Request) -> Response:
    services = services_of(request)
    user = await user_of(request)
    require_memory(services)
    if not services.config.memory.personalize:
        raise PersonalizeDisabled(
            "users cannot turn memory off on this server (memory.personalize is false)"
        )
    body = await read_model(request, Preferences, services.config.server.max_body_bytes)
    enabled = await run_in_threadpool(services.store.set_memories_enabled, user, body.memories)
    return JSONResponse({"memories": enabled})


routes = [
    route("/memory", GET=list_memories, DELETE=clear_memories),
    *history.fixed_routes,
    route("/memory/{key}", GET=get_memory, PUT=put_memory, DELETE=delete_memory),
    *history.key_routes,
    route("/preferences", GET=get_preferences, PATCH=patch_preferences),
    *history.me_routes,
]
