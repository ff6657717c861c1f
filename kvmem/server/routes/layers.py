"""The layer of a user's memory a `/memory` route acts on: their own, or with `?scope=NAME`
(a server with `memory.scopes`) that scope's: one reading of `?scope` for every route, and the
refusals of a scope named where a route takes none. A body answering for a scope says so with
`kvmem.memory.write_outcomes.in_layer`."""

from __future__ import annotations

from starlette.requests import Request

from kvmem.errors import BadRequest
from kvmem.memory.rules import MemoryRules
from kvmem.server.services import scope_header


def scope_param(request: Request, rules: MemoryRules) -> str:
    """`?scope`: the layer the route acts on (`OWN` when absent); 400 `bad_request` when it
    is malformed or empty, or the server keeps no scopes (`MemoryRules.scope`), or when the
    query names two different scopes (`?scope=a&scope=b`: which one is meant is a guess, and
    a proxy that reads the first would see another scope than kvmem). `X-Memory-Scope`, the
    chat routes' way, is refused here rather than ignored (`refuse_scope_header`)."""
    refuse_scope_header(request)
    named = set(request.query_params.getlist("scope"))
    if len(named) > 1:
        raise BadRequest("scope is given more than once, naming different scopes: name one")
    return rules.scope(named.pop() if named else None)


def refuse_scope_header(request: Request) -> None:
    """400 `bad_request` when a REST route is sent `X-Memory-Scope`: the chat routes read it,
    the REST routes take `?scope`, and ignoring it would act on the person's own layer (a
    `DELETE /memory` meant for one scope would clear their own memory)."""
    if scope_header(request) is not None:
        raise BadRequest(
            "the /memory routes name a scope with ?scope=NAME, not X-Memory-Scope "
            "(which the chat routes read): send ?scope, or no header"
        )


def refuse_any_scope(request: Request, route: str) -> None:
    """400 `bad_request` when `route`, which acts on every layer, is given a scope by `?scope`
    or `X-Memory-Scope`: it would act on more than the caller named."""
    if request.query_params.getlist("scope") or scope_header(request) is not None:
        raise BadRequest(f"{route} acts on every scope of the person's memory: send no scope")
