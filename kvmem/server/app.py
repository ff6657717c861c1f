"""The Starlette app: `create_app(config)` wires the services, routes and error handling."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio.to_thread
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from kvmem.agent.memory_agent import MemoryAgent
from kvmem.agent.turn_memory import MemoryService
from kvmem.agent.usage import UsageStore
from kvmem.chat.conversations import ConversationStore
from kvmem.chat.task_calls import TaskCalls
from kvmem.config import Config
from kvmem.db.engine import Database
from kvmem.errors import (
    ClientGone,
    KvmemError,
    MethodNotAllowed,
    NotFound,
    UpstreamError,
    UpstreamTimeout,
    error_body,
)
from kvmem.memory.proposals import ProposalStore
from kvmem.memory.retention import sweep_history
from kvmem.memory.rules import MemoryRules
from kvmem.memory.store import MemoryStore
from kvmem.metrics import Metrics, MetricsMiddleware
from kvmem.server.auth import Authenticator
from kvmem.server.credentials import KeyStore
from kvmem.server.logs import log_request
from kvmem.server.mcp_http import McpEndpoint, McpTransport
from kvmem.server.routes import chat, health, hooks, memory, ollama, openai, ops, sessions, ui
from kvmem.server.services import Services
from kvmem.server.sessions import SessionStore
from kvmem.server.site_guard import NO_STORE, RESPONSE_HEADERS, SiteGuardMiddleware, SitePolicy
from kvmem.tokens import TokenCounter
from kvmem.upstream.model_client import ModelClient, agent_target, chat_target

log = logging.getLogger("kvmem")

MCP_STATE = "mcp"  # the lifespan state key of the MCP transport


def build_services(
    config: Config,
    *,
    database: Database | None = None,
    tokens: TokenCounter | None = None,
    client: ModelClient | None = None,
    metrics: Metrics | None = None,
) -> Services:
    """The services for `config`; pass `database`, `tokens` or `client` to share existing ones."""
    database = database or Database.from_config(config.database)
    tokens = tokens or TokenCounter()
    metrics = metrics or Metrics()
    client = client or ModelClient.from_config(
        config, on_call=metrics.upstream_call, on_surrogates=metrics.lone_surrogates
    )
    keys = KeyStore(database)
    store = MemoryStore(
        database,
        MemoryRules.from_config(config.memory),
        tokens,
        keep_days=config.memory.history.keep_days,
    )
    usage = UsageStore(database)
    proposals = ProposalStore(store)
    agent = MemoryAgent(
        config,
        store,
        client,
        agent_target(config),
        usage=usage,
        metrics=metrics,
        proposals=proposals,
    )
    metrics.agent_in_flight.set_function(lambda: agent.in_flight)
    return Services(
        config=config,
        database=database,
        tokens=tokens,
        store=store,
        keys=keys,
        auth=Authenticator(config.auth, keys, SessionStore(database, config.auth.session_seconds)),
        conversations=ConversationStore(database),
        client=client,
        chat_target=chat_target(config.chat),
        agent=agent,
        memory=MemoryService(config, store, agent),
        metrics=metrics,
        usage=usage,
        proposals=proposals,
        task_calls=TaskCalls(config.memory.tasks),
    )


def freeze_start_up(*loads: threading.Thread | None) -> None:
    """After `loads` end: freeze every object start-up made (`gc.freeze`), then turn the
    collector back on (`kvmem serve` keeps it off while it starts).

    A server's modules, classes, tables and encoding (and litellm's, when it is imported) live
    as long as the process, yet each full collection walked them all: under 50 concurrent
    writers those pauses made the p99 (112.7 -> 58.5 ms, writes/s +16 %; docs/performance.md).
    Frozen objects are still freed by reference counting; only a cycle among them stays.
    A collection first would free start-up's cycles (~2,000 objects; the server's resident
    memory measured the same without it), but it walks all ~166,000 objects (~50 ms of CPU
    holding the GIL): it runs only when a load was waited for (litellm's, seconds after
    ready), never in the way of start-up."""
    waited = False
    for load in loads:
        if load is not None:
            load.join()
            waited = True
    if waited:
        gc.collect()
    gc.freeze()
    gc.enable()


def create_app(
    config: Config,
    *,
    database: Database | None = None,
    tokens: TokenCounter | None = None,
    client: ModelClient | None = None,
    freeze_gc: bool = False,
) -> Starlette:
    """The kvmem ASGI app. Resources are created when the lifespan starts, not here.

    `freeze_gc` (for a process that only serves this app, as `kvmem serve`): once start-up's
    background loads end, what start-up made is moved out of the garbage collector's reach
    (`freeze_start_up`)."""
    owns_database = database is None
    # The app's own registry: the middleware counts into it before any lifespan state exists.
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Any]]:
        services = build_services(
            config, database=database, tokens=tokens, client=client, metrics=metrics
        )
        mcp = McpTransport(services)
        # Found now, not by the first chat: said once, and /healthz shows the agent not ready.
        for problem in services.missing_keys():
            log.warning("%s", problem)
        # The encoding (~0.2 s of CPU) is loaded before ready: the first write, and the first
        # agent run, never wait for it. (Loaded beside start-up in a thread, it held the GIL
        # while the server started and was done before ready in most starts anyway.)
        await anyio.to_thread.run_sync(services.tokens.load)
        if freeze_gc:
            threading.Thread(
                target=freeze_start_up,
                args=(services.client.preloading,),
                name="kvmem-gc-freeze",
                daemon=True,
            ).start()
        services.store.start_group_commit()
        sweep = asyncio.create_task(sweep_history(services.store), name="kvmem-history-sweep")
        try:
            # The MCP transport (started by the first /mcp request) lives as long as the app;
            # it ends first, so no MCP call is still writing while the rest shuts down.
            async with mcp.running():
                yield {"services": services, MCP_STATE: mcp}
        finally:
            sweep.cancel()
            await asyncio.gather(sweep, return_exceptions=True)
            # Agent runs may finish until their own deadlines (a memory the user just asked
            # for still lands during a deploy), never longer than drain_seconds; then the
            # rest are cancelled, and a write not committed by then is not made.
            await services.agent.shutdown(config.server.drain_seconds)
            # Every write queued by now is committed and answered before the database goes.
            await anyio.to_thread.run_sync(services.store.stop_group_commit)
            await services.client.aclose()
            if owns_database:
                services.database.dispose()

    app = Starlette(
        routes=[
            *health.routes,
            *memory.routes,
            *hooks.routes,
            *chat.routes,
            *openai.routes,
            *ollama.routes,
            *ops.routes,
            *sessions.routes,
            *ui.routes,
            Route("/mcp", McpEndpoint(MCP_STATE)),
        ],
        middleware=[
            # Outermost: a request is counted, and its log line written (kvmem serve turns the
            # `kvmem.access` logger on), once its response has ended, whatever answered it.
            Middleware(MetricsMiddleware, metrics=metrics, on_end=log_request),
            # Before any route runs (auth, bodies): a foreign Host or a cross-site write is
            # refused here, and every response gets its security headers.
            Middleware(
                SiteGuardMiddleware, policy=SitePolicy.from_config(config), render=error_response
            ),
        ],
        lifespan=lifespan,
        exception_handlers={
            KvmemError: render_error,
            HTTPException: render_http_exception,
            ClientDisconnect: render_client_gone,
            Exception: render_unexpected,
        },
    )
    # Starlette would answer `/memory/abc/` with a redirect whose Location names the host
    # of the client's own Host header; a path kvmem does not serve is a 404, nothing else.
    app.router.redirect_slashes = False
    app.state.metrics = metrics
    return app


def error_response(
    request: Request, error: KvmemError, headers: Mapping[str, str] | None = None
) -> Response:
    """`error` as the response, counted, in the body shape of its path (`error_body`)."""
    request.app.state.metrics.error(error.code)
    return JSONResponse(
        error_body(request.url.path, error), status_code=error.status, headers=headers
    )


async def render_error(request: Request, exc: Exception) -> Response:
    """A `KvmemError`, with the status and headers of its class. A model that failed is the
    operator's to fix: logged, with the message the client gets."""
    assert isinstance(exc, KvmemError)
    if isinstance(exc, UpstreamError | UpstreamTimeout):
        log.warning(
            "%s %s answered %d %s: %s",
            request.method,
            request.url.path,
            exc.status,
            exc.code,
            exc.message,
        )
    return error_response(request, exc, exc.headers)


async def render_http_exception(request: Request, exc: Exception) -> Response:
    """Starlette's own 404/405 in kvmem's error shape."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 405:
        error: KvmemError = MethodNotAllowed(
            f"{request.method} is not allowed on {request.url.path}"
        )
        return error_response(request, error, exc.headers)
    return error_response(request, NotFound(f"no route {request.method} {request.url.path}"))


async def render_client_gone(request: Request, exc: Exception) -> Response:
    """A client that left before its request was read: not a fault of kvmem's, so one INFO
    line and a 499 in the metrics (the answer goes nowhere)."""
    log.info("client gone before its request was read: %s %s", request.method, request.url.path)
    return error_response(
        request, ClientGone("the client disconnected before the request was read")
    )


async def render_unexpected(request: Request, exc: Exception) -> Response:
    """A bug: logged with its traceback, answered 500 without internals."""
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    # Answered outside the middleware that adds the security headers: add them here.
    error = KvmemError("internal error; the server log has the details")
    return error_response(request, error, {**RESPONSE_HEADERS, **NO_STORE})
