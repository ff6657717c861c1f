"""`/memory/history`, `/memory/{key}/history`, `/memory/{key}/revert`, `/memory/export`,
`/memory/import` and `DELETE /me`: what was remembered and when, undo, moving memory, and
erasing a user.

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
from kvmem.memory.exports import export_document, read_document, read_expiries
from kvmem.memory.write_outcomes import imported_json, written_json
from kvmem.server.bodies import RequestBody, parse_json, read_body, read_model
from kvmem.server.routes import route
from kvmem.server.routes.paging import MAX_ID, int_param, limit_param
from kvmem.server.services import require_memory, services_of, user_of


class RevertBody(RequestBody):
    """`POST /memory/{key}/revert`."""

    to: StrictInt


async def list_history(request: Request) -> Response:
    services = services_of(request)
    user = await user_of(request)
    require_memory(services)
    key = request.query_params.get("key")
    limit = limit_param(request)
    before = int_param(request, "before", None, 1, MAX_ID)
    page = await run_in_threadpool(services.store.history, user, key, limit, before)
    return JSONResponse(page.as_json())


async def clear_history(request: Request) -> Response:
    services = services_of(request)
    user = await user_of(request)
    require_memory(services)
    deleted = await run_in_threadpool(services.store.clear_history, user)
    return JSONResponse({"deleted": deleted})


async def key_history(request: Request) -> Response:
    services = services_of(request)
    user = await user_of(request)
    require_memory(services)
    limit = limit_param(request)
    before = int_param(request, "before", None, 1, MAX_ID)
    page = await run_in_threadpool(
        services.store.key_history_page, user, request.path_params["key"], limit, before
    )
    return JSONResponse(page.as_json())


async def revert(request: Request) -> Response:
    services = services_of(request)
    user = await user_of(request)
    require_memory(services)
    key = services.store.rules.check_key_format(request.path_params["key"])
    body = await read_model(request, RevertBody, services.config.server.max_body_bytes)
    reverted = await run_in_threadpool(services.store.revert, user, key, body.to)
    services.metrics.memory_write("revert", "set" if reverted.entry else "delete")
    return JSONResponse(written_json(reverted, services.config.memory.token_limit))


async def export_memory(request: Request) -> Response:
    services = services_of(request)
    user = await user_of(request)
    require_memory(services)
    snapshot = await run_in_threadpool(services.store.snapshot, user)
    return JSONResponse(export_document(user, snapshot))


async def import_memory(request: Request) -> Response:
    began = utcnow()  # an import begun before an erasure answered never lands after it
    services = services_of(request)
    user = await user_of(request)
    require_memory(services)
    mode = _mode(request.query_params.get("mode", "merge"))
    raw = await read_body(request, services.config.server.max_body_bytes)
    document = parse_json(raw)
    items, expires = read_document(document), read_expiries(document)
    imported = await run_in_threadpool(
        lambda: services.store.import_document(user, items, mode=mode, expires=expires, since=began)
    )
    services.metrics.memory_write("import", "set", imported.imported)
    if imported.deleted:
        services.metrics.memory_write("import", "delete", imported.deleted)
    return JSONResponse(imported_json(imported, services.config.memory.token_limit))


def _mode(raw: str) -> Literal["merge", "replace"]:
    if raw == "merge":
        return "merge"
    if raw == "replace":
        return "replace"
    raise BadRequest(f"mode must be 'merge' or 'replace', not {raw[:40]!r}")


async def erase_me(request: Request) -> Response:
    services = services_of(request)
    user = await user_of(request)
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
