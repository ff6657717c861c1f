"""Ollama's own API in front of the configured chat model: `/api/chat`, `/api/generate`,
`/api/tags`, `/api/show`, `/api/version` and `/api/ps`.

Anything configured with `OLLAMA_HOST` gets memory by pointing at kvmem. The model call is the
same as `/v1`'s (`kvmem.chat.main_call`: the block injected, the agent on the request's messages,
`X-Memory: off`, `X-Memory-Scope`, the auth of every route); only the request translation and the reply
rendering (`kvmem.server.ollama_shapes`) are Ollama's. Replies stream as NDJSON by default; a
failure after the first line is a last line `{"error": "..."}`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from kvmem.chat.main_call import MainCall
from kvmem.errors import ModelNotFound, error_body
from kvmem.server.bodies import read_model
from kvmem.server.ollama_replies import Reply, has_output, ndjson
from kvmem.server.ollama_shapes import (
    OLLAMA_API_VERSION,
    ChatBody,
    GenerateBody,
    Generation,
    ShowBody,
    model_entry,
    resolve_model,
    show_reply,
    timestamp,
)
from kvmem.server.routes import conversation_id, memory_headers, memory_off, route, turn_scope
from kvmem.server.routes.streaming import ClosingStreamingResponse
from kvmem.server.services import Services, services_of, user_of

NDJSON = "application/x-ndjson"


async def chat(request: Request) -> Response:
    """`POST /api/chat`: a chat, answered in Ollama's shape."""
    return await _generation(request, ChatBody)


async def generate(request: Request) -> Response:
    """`POST /api/generate`: a prompt (and `system`), the text in `response`."""
    return await _generation(request, GenerateBody)


async def _generation(request: Request, shape: type[ChatBody | GenerateBody]) -> Response:
    """The main call, exactly as on `/v1`: the request read in Ollama's shape and turned into
    OpenAI's, the reply turned back into Ollama's (`kvmem.server.ollama_shapes`)."""
    started = time.monotonic_ns()
    services = services_of(request)
    user_id = await user_of(request)
    body: Generation = await read_model(request, shape, services.config.server.max_body_bytes)
    reply = Reply(body.kind, _served(services, body.model), started)
    if body.loads_only:
        return _loaded(reply, body.stream)
    params = body.params()
    if body.stream:
        params["stream_options"] = {"include_usage": True}  # for the last line's counts
    messages = body.openai_messages()
    temporary = memory_off(request)
    task = services.task_calls.task_of(request.headers, messages)
    # The served model's id, as `/v1` names it: a model's scope is the same on both.
    scope = turn_scope(request, model=reply.model, reads_memory=task is None and not temporary)
    call = await MainCall.start(
        services.memory,
        services.client,
        user_id,
        messages,
        model=reply.model,
        params=params,
        conversation_id=conversation_id(request),
        temporary=temporary,
        task=task,
        scope=scope,
    )
    if not body.stream:
        return JSONResponse(reply.whole(await call.complete()), headers=memory_headers(call.memory))
    path = request.url.path
    lines = await call.stream(
        reply.lines, lambda exc: ndjson(error_body(path, exc)), until=has_output
    )
    return _ndjson_response(lines, memory_headers(call.memory))


def _ndjson_response(lines: AsyncIterator[str], headers: dict[str, str] | None = None) -> Response:
    response = ClosingStreamingResponse(lines)
    response.headers["content-type"] = NDJSON  # Ollama's stream, not Server-Sent Events
    response.headers.update(headers or {})
    return response


def _loaded(reply: Reply, stream: bool) -> Response:
    if stream:
        return _ndjson_response(_one(ndjson(reply.loaded())))
    return JSONResponse(reply.loaded())


async def _one(line: str) -> AsyncGenerator[str, None]:
    yield line


def _served(services: Services, wanted: str) -> str:
    """The served model id `wanted` names, else 404 (see `resolve_model`)."""
    served = services.config.chat.served_models()
    model = resolve_model(wanted, served)
    if model is None:
        raise ModelNotFound(f"model {wanted!r} not found; available: " + ", ".join(served))
    return model


async def tags(request: Request) -> Response:
    """`GET /api/tags`: the served models as Ollama models."""
    services = services_of(request)
    await user_of(request)
    now = timestamp()
    return JSONResponse(
        {"models": [model_entry(model, now) for model in services.config.chat.served_models()]}
    )


async def show(request: Request) -> Response:
    """`POST /api/show`: one served model's details and capabilities."""
    services = services_of(request)
    await user_of(request)
    body = await read_model(request, ShowBody, services.config.server.max_body_bytes)
    return JSONResponse(show_reply(_served(services, body.wanted), timestamp()))


async def version(request: Request) -> Response:
    """`GET /api/version`: the Ollama API version kvmem serves."""
    await user_of(request)
    return JSONResponse({"version": OLLAMA_API_VERSION})


async def running(request: Request) -> Response:
    """`GET /api/ps`: the loaded models (none: they run upstream)."""
    await user_of(request)
    return JSONResponse({"models": []})


routes = [
    route("/api/chat", POST=chat),
    route("/api/generate", POST=generate),
    route("/api/tags", GET=tags),
    route("/api/show", POST=show),
    route("/api/version", GET=version),
    route("/api/ps", GET=running),
]
