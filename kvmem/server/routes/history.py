"""`/memory/history`, `/memory/{key}/history`, `/memory/{key}/revert`, `/memory/export`,
`/memory/import` and `DELETE /me`: what was remembered and when, undo, moving memory, and
erasing a user.

Each acts on one layer (`?scope=NAME`, else the person's own; `kvmem.server.routes.layers`),
but for export and import without `?scope` on a server that keeps scopes: the export holds every
layer, each entry saying its `"scope"`, and the import puts each entry back in the layer it names,
all or nothing across layers. `DELETE /me` erases every layer.

The fixed paths (`/memory/history`, `/memory/export`, `/memory/import`) are registered before
`/memory/{key}` (see `kvmem.server.routes.memory`); `history` and `export` are reserved keys.
"""

from __future__ import annotations

from typing import Literal

from pydantic import StrictInt
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from kvmem.entries import utcnow
from kvmem.errors import BadRequest
from kvmem.memory.exports import export_document, read_layers
from kvmem.memory.rules import OWN
from kvmem.memory.write_outcomes import imported_layers_json, in_layer, written_json
from kvmem.server.bodies import RequestBody, parse_json, read_body, read_model
from kvmem.server.routes import route
from kvmem.server.routes.layers import refuse_any_scope, scope_param
from kvmem.server.routes.paging import MAX_ID, int_param, limit_param
from kvmem.server.services import require_memory, services_of, user_of


class RevertBody(RequestBody):
    """`POST /memory/{key}/revert`."""

    to: StrictInt


async def list_history(request: Request) -> Response:
    services = services_of(request)
    user = await user_of(request)
    require_memory(services)
    scope = scope_param(request, services.store.rules)
    key = request.query_params.get("key")
    limit = limit_param(request)
    before = int_param(request, "before", None, 1, MAX_ID)
    page = await run_in_threadpool(
        lambda: services.store.history(user, key, limit, before, scope=scope)
    )
    return JSONResponse(in_layer(page.as_json(), scope))


async def clear_history(request: Request) -> Response:
    services = services_of(request)
    user = await user_of(request)
    require_memory(services)
    scope = scope_param(request, services.store.rules)
    deleted = await run_in_threadpool(lambda: services.store.clear_history(user, scope))
    return JSONResponse(in_layer({"deleted": deleted}, scope))


async def key_history(request: Request) -> Response:
    services = services_of(request)
    user = await user_of(request)
    require_memory(services)
    scope = scope_param(request, services.store.rules)
    limit = limit_param(request)
    before = int_param(request, "before", None, 1, MAX_ID)
    key = request.path_params["key"]
    page = await run_in_threadpool(
        lambda: services.store.key_history_page(user, key, limit, before, scope=scope)
    )
    return JSONResponse(in_layer(page.as_json(), scope))


async def revert(request: Request) -> Response:
    services = services_of(request)
    user = await user_of(request)
    require_memory(services)
    scope = scope_param(request, services.store.rules)
    key = services.store.rules.check_key_format(request.path_params["key"])
    body = await read_model(request, RevertBody, services.config.server.max_body_bytes)
    reverted = await run_in_threadpool(
        lambda: services.store.revert(user, key, body.to, scope=scope)
    )
    services.metrics.memory_write("revert", "set" if reverted.entry else "delete")
    limit = services.store.rules.layer(scope).token_limit
    return JSONResponse(in_layer(written_json(reverted, limit), scope))


async def export_memory(request: Request) -> Response:
    services = services_of(request)
    user = await user_of(request)
    require_memory(services)
    scope = scope_param(request, services.store.rules)
    store = services.store
    if store.rules.scoped is None:  # no scopes: the person's own layer is all there is
        snapshot = await run_in_threadpool(store.snapshot, user)
        return JSONResponse(export_document(user, snapshot))
    if scope == OWN:
        snapshot = await run_in_threadpool(store.every_layer, user)
    else:
        snapshot = await run_in_threadpool(store.layer, user, scope)
    return JSONResponse(export_document(user, snapshot, scoped=True))


async def import_memory(request: Request) -> Response:
    began = utcnow()  # an import begun before an erasure answered never lands after it
    services = services_of(request)
    user = await user_of(request)
    require_memory(services)
    rules = services.store.rules
    named = request.query_params.get("scope")
    scope = scope_param(request, rules)
    mode = _mode(request.query_params.get("mode", "merge"))
    raw = await read_body(request, services.config.server.max_body_bytes)
    layers = read_layers(parse_json(raw), rules, named)
    results = await run_in_threadpool(
        lambda: services.store.import_layers(user, layers, mode=mode, since=began)
    )
    for imported in results.values():
        services.metrics.memory_write("import", "set", imported.imported)
        if imported.deleted:
            services.metrics.memory_write("import", "delete", imported.deleted)
    return JSONResponse(imported_layers_json(results, rules, scope))


def _mode(raw: str) -> Literal["merge", "replace"]:
    if raw == "merge":
        return "merge"
    if raw == "replace":
        return "replace"
    raise BadRequest(f"mode must be 'merge' or 'replace', not {raw[:40]!r}")


async def erase_me(request: Request) -> Response:
    services = services_of(request)
    user = await user_of(request)
    refuse_any_scope(request, "DELETE /me")
    # The user's runs in this process stop calling the model and committing; those of other
    # replicas (and any write of a run that began before now) are refused by the fence the
    # erasure leaves in the database.
    services.agent.stop_runs(user)
    erased = await run_in_threadpool(services.store.erase_user, user)
    return JSONResponse(erased.as_json())


# Registered before `/memory/{key}`, whose GET would otherwise take these paths.
fixed_routes = [
    route("/memory/history", GET=list_history, DELETE=clear_history),
    route("/memory/export", GET=export_memory),
    route("/memory/import", POST=import_memory),
]
key_routes = [
    route("/memory/{key}/history", GET=key_history),
    route("/memory/{key}/revert", POST=revert),
]
me_routes = [route("/me", DELETE=erase_me)]
