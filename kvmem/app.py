"""The Starlette app: `create_app(config)` wires the services, routes and error handling."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from kvmem.auth import Authenticator
from kvmem.config import Config
from kvmem.credentials import KeyStore
from kvmem.db import Database
from kvmem.errors import KvmemError, MethodNotAllowed, NotFound
from kvmem.routes import health, memory
from kvmem.rules import MemoryRules
from kvmem.services import Services
from kvmem.store import MemoryStore
from kvmem.tokens import TokenCounter

log = logging.getLogger("kvmem")


def build_services(
    config: Config, *, database: Database | None = None, tokens: TokenCounter | None = None
) -> Services:
    """The services for `config`; pass `database` or `tokens` to share existing ones."""
    database = database or Database.from_config(config.database)
    tokens = tokens or TokenCounter()
    keys = KeyStore(database)
    return Services(
        config=config,
        database=database,
        tokens=tokens,
        store=MemoryStore(database, MemoryRules.from_config(config.memory), tokens),
        keys=keys,
        auth=Authenticator(config.auth, keys),
    )


def create_app(
    config: Config, *, database: Database | None = None, tokens: TokenCounter | None = None
) -> Starlette:
    """The kvmem ASGI app. Resources are created when the lifespan starts, not here."""
    owns_database = database is None

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Any]]:
        services = build_services(config, database=database, tokens=tokens)
        try:
            yield {"services": services}
        finally:
            if owns_database:
                services.database.dispose()

    return Starlette(
        routes=[*health.routes, *memory.routes],
        lifespan=lifespan,
        exception_handlers={
            KvmemError: render_error,
            HTTPException: render_http_exception,
            Exception: render_unexpected,
        },
    )


async def render_error(request: Request, exc: Exception) -> Response:
    """The one error body, with the status of the error's class."""
    assert isinstance(exc, KvmemError)
    return JSONResponse(exc.body(), status_code=exc.status)


async def render_http_exception(request: Request, exc: Exception) -> Response:
    """Starlette's own 404/405 in kvmem's error shape."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 405:
        error: KvmemError = MethodNotAllowed(f"{request.method} is not allowed on {request.url.path}")
        headers = exc.headers
    else:
        error = NotFound(f"no route {request.method} {request.url.path}")
        headers = None
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


async def render_unexpected(request: Request, exc: Exception) -> Response:
    """A bug: logged with its traceback, answered 500 without internals."""
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    error = KvmemError("internal error; the server log has the details")
    return JSONResponse(error.body(), status_code=500)
