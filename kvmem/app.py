"""The Starlette app: `create_app(config)` wires the services, routes and error handling."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from kvmem.agent import MemoryAgent
from kvmem.auth import Authenticator
from kvmem.config import Config
from kvmem.conversations import ConversationStore
from kvmem.credentials import KeyStore
from kvmem.db import Database
from kvmem.errors import KvmemError, MethodNotAllowed, NotFound, openai_error_body
from kvmem.provider import LiteLLMClient, agent_target, chat_target
from kvmem.retention import sweep_history
from kvmem.routes import chat, health, memory, openai
from kvmem.rules import MemoryRules
from kvmem.services import Services
from kvmem.store import MemoryStore
from kvmem.tokens import TokenCounter
from kvmem.turn_memory import MemoryService

log = logging.getLogger("kvmem")


def build_services(
    config: Config,
    *,
    database: Database | None = None,
    tokens: TokenCounter | None = None,
    client: LiteLLMClient | None = None,
) -> Services:
    """The services for `config`; pass `database`, `tokens` or `client` to share existing ones."""
    database = database or Database.from_config(config.database)
    tokens = tokens or TokenCounter()
    client = client or LiteLLMClient()
    keys = KeyStore(database)
    store = MemoryStore(
        database,
        MemoryRules.from_config(config.memory),
        tokens,
        keep_days=config.memory.history.keep_days,
    )
    agent = MemoryAgent(config, store, client, agent_target(config))
    return Services(
        config=config,
        database=database,
        tokens=tokens,
        store=store,
        keys=keys,
        auth=Authenticator(config.auth, keys),
        conversations=ConversationStore(database),
        client=client,
        chat_target=chat_target(config.chat),
        agent=agent,
        memory=MemoryService(config, store, agent),
    )


def create_app(
    config: Config,
    *,
    database: Database | None = None,
    tokens: TokenCounter | None = None,
    client: LiteLLMClient | None = None,
) -> Starlette:
    """The kvmem ASGI app. Resources are created when the lifespan starts, not here."""
    owns_database = database is None

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Any]]:
        services = build_services(config, database=database, tokens=tokens, client=client)
        sweep = asyncio.create_task(sweep_history(services.store), name="kvmem-history-sweep")
        try:
            yield {"services": services}
        finally:
            sweep.cancel()
            await asyncio.gather(sweep, return_exceptions=True)
            # Agent runs may finish until their own deadlines (a memory the user just asked
            # for still lands during a deploy), never longer than drain_seconds; then the
            # rest are cancelled, and a write not committed by then is not made.
            await services.agent.shutdown(config.server.drain_seconds)
            await services.client.aclose()
            if owns_database:
                services.database.dispose()

    return Starlette(
        routes=[*health.routes, *memory.routes, *chat.routes, *openai.routes],
        lifespan=lifespan,
        exception_handlers={
            KvmemError: render_error,
            HTTPException: render_http_exception,
            Exception: render_unexpected,
        },
    )


def error_response(
    request: Request, error: KvmemError, headers: Mapping[str, str] | None = None
) -> Response:
    """The one place that chooses an error body's shape: OpenAI's fields under `/v1/`."""
    openai = request.url.path.startswith("/v1/")
    body = openai_error_body(error) if openai else error.body()
    return JSONResponse(body, status_code=error.status, headers=headers)


async def render_error(request: Request, exc: Exception) -> Response:
    """A `KvmemError`, with the status and headers of its class."""
    assert isinstance(exc, KvmemError)
    return error_response(request, exc, exc.headers)


async def render_http_exception(request: Request, exc: Exception) -> Response:
    """Starlette's own 404/405 in kvmem's error shape."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 405:
        error: KvmemError = MethodNotAllowed(f"{request.method} is not allowed on {request.url.path}")
        return error_response(request, error, exc.headers)
    return error_response(request, NotFound(f"no route {request.method} {request.url.path}"))


async def render_unexpected(request: Request, exc: Exception) -> Response:
    """A bug: logged with its traceback, answered 500 without internals."""
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(request, KvmemError("internal error; the server log has the details"))
