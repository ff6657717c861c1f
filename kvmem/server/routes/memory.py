"""`/memory` and `/preferences`: reading and editing a user's entries by hand.

Each `/memory` route acts on one layer of the user's memory: their own, or with `?scope=NAME`
(a server with `memory.scopes`) that scope's, under that layer's keys and limits; a body
answering for a scope says so with a top-level `"scope"`. `GET /memory/scopes` lists the
user's scopes that hold entries.

The history, revert, export/import and erasure routes live in `kvmem.server.routes.history`, the
proposal routes in `kvmem.server.routes.proposals`; this module's `routes` lists them in the order
that keeps `/memory/{key}` from taking `/memory/history`, `/memory/export`,
`/memory/proposals` and `/memory/scopes`.
"""

from __future__ import annotations

from datetime import datetime

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from kvmem.entries import Entry, Snapshot, utcnow
from kvmem.errors import BadRequest, PersonalizeDisabled, ReviewNotPerUser
from kvmem.memory.expiry import expiry_of
from kvmem.memory.overview import memory_overview
from kvmem.memory.proposals import review_in_effect
from kvmem.memory.write_outcomes import in_layer, written_json
from kvmem.server.bodies import MemoryValue, Preferences, read_model
from kvmem.server.routes import history, proposals, route
from kvmem.server.routes.layers import refuse_any_scope, scope_param
from kvmem.server.services import Services, require_memory, services_of, user_of


async def list_memories(request: Request) -> Response:
    services = services_of(request)
    user = await user_of(request)
    require_memory(services)
    scope = scope_param(request, services.store.rules)
    if _include_expired(request.query_params.get("include_expired")):
        snapshot, everything = await run_in_threadpool(_with_expired, services, user, scope)
        return JSONResponse(memory_overview(snapshot, services.config, everything, scope=scope))
    snapshot = await run_in_threadpool(services.store.layer, user, scope)
    return JSONResponse(memory_overview(snapshot, services.config, scope=scope))


def _include_expired(raw: str | None) -> bool:
    if raw is None or raw in ("false", "0"):
        return False
    if raw in ("true", "1"):
        return True
    raise BadRequest(f"include_expired must be true or false, not {raw[:40]!r}")


def _with_expired(services: Services, user: str, scope: str) -> tuple[Snapshot, tuple[Entry, ...]]:
    entries = services.store.entries_with_expired(user, scope)
    return services.store.layer(user, scope), entries


async def list_scopes(request: Request) -> Response:
    services = services_of(request)
    user = await user_of(request)
    require_memory(services)
    scopes = await run_in_threadpool(services.store.scopes, user)
    return JSONResponse(
        {
            "scopes": [
                {"scope": scope, "entries": entries, "total_tokens": tokens}
                for scope, entries, tokens in scopes
            ]
        }
    )


async def clear_memories(request: Request) -> Response:
    services = services_of(request)
    user = await user_of(request)
    require_memory(services)
    scope = scope_param(request, services.store.rules)
    deleted = await run_in_threadpool(services.store.clear, user, scope)
    services.metrics.memory_write("manual", "clear")
    return JSONResponse(in_layer({"deleted": deleted}, scope))


async def get_memory(request: Request) -> Response:
    services = services_of(request)
    user = await user_of(request)
    require_memory(services)
    scope = scope_param(request, services.store.rules)
    key = request.path_params["key"]
    entry = await run_in_threadpool(lambda: services.store.get(user, key, scope=scope))
    return JSONResponse(in_layer(entry.as_json(), scope))


async def put_memory(request: Request) -> Response:
    began = utcnow()  # a write begun before an erasure answered never lands after it
    services = services_of(request)
    user = await user_of(request)
    require_memory(services)
    scope = scope_param(request, services.store.rules)
    rules = services.store.rules.layer(scope)
    key = rules.check_key(request.path_params["key"])
    body = await read_model(request, MemoryValue, services.config.server.max_body_bytes)
    expires_at = expiry_of(body.expires_at, body.expires_in, services.store.clock())
    written = await services.store.set_async(
        user, key, body.value, "manual", since=began, expires_at=expires_at, scope=scope
    )
    services.metrics.memory_write("manual", "set")
    return JSONResponse(
        in_layer(written_json(written, rules.token_limit), scope),
        status_code=201 if written.created else 200,
    )


async def delete_memory(request: Request) -> Response:
    began = utcnow()
    services = services_of(request)
    user = await user_of(request)
    require_memory(services)
    scope = scope_param(request, services.store.rules)
    key = request.path_params["key"]
    await run_in_threadpool(lambda: services.store.delete(user, key, since=began, scope=scope))
    services.metrics.memory_write("manual", "delete")
    return Response(status_code=204)


async def get_preferences(request: Request) -> Response:
    services = services_of(request)
    user = await user_of(request)
    require_memory(services)
    return JSONResponse(await run_in_threadpool(_preferences, services, user))


async def patch_preferences(request: Request) -> Response:
    began = utcnow()
    services = services_of(request)
    user = await user_of(request)
    require_memory(services)
    # The switches are the person's, for every scope: one named would be a wrong promise.
    refuse_any_scope(request, "PATCH /preferences")
    body = await read_model(request, Preferences, services.config.server.max_body_bytes)
    if body.memories is None and body.review is None:
        raise BadRequest("invalid request body: give memories, review or both")
    # Both refusals come before any change: a body is applied whole or not at all.
    if body.memories is not None and not services.config.memory.personalize:
        raise PersonalizeDisabled(
            "users cannot turn memory off on this server (memory.personalize is false)"
        )
    if body.review is not None and services.config.memory.review != "per_user":
        raise ReviewNotPerUser(
            f"users cannot choose review on this server (memory.review is "
            f"{services.config.memory.review}, not per_user)"
        )
    return JSONResponse(await run_in_threadpool(_set_preferences, services, user, body, began))


def _preferences(services: Services, user: str) -> dict[str, bool]:
    """The body of `/preferences`: the opt-out switch, and whether the agent's writes wait
    for review (the operator's `memory.review`, or under `per_user` the user's own switch)."""
    memory = services.config.memory
    user_review = memory.review == "per_user" and services.proposals.user_review(user)
    return {
        "memories": services.store.memories_enabled(user),
        "review": review_in_effect(memory, user_review),
    }


def _set_preferences(
    services: Services, user: str, body: Preferences, began: datetime
) -> dict[str, bool]:
    if body.memories is not None:
        services.store.set_memories_enabled(user, body.memories, since=began)
    if body.review is not None:
        services.proposals.set_user_review(user, body.review)
    return _preferences(services, user)


routes = [
    route("/memory", GET=list_memories, DELETE=clear_memories),
    route("/memory/scopes", GET=list_scopes),
    *history.fixed_routes,
    *proposals.routes,
    route("/memory/{key}", GET=get_memory, PUT=put_memory, DELETE=delete_memory),
    *history.key_routes,
    route("/preferences", GET=get_preferences, PATCH=patch_preferences),
    *history.me_routes,
]
