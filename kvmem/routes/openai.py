"""The OpenAI-compatible proxy: `POST /v1/chat/completions` and `GET /v1/models`.

A request passes through to the configured upstream with the memory block injected into its
system message, while the memory agent reads the request's own messages. Responses keep
OpenAI's shapes, streamed or not; an upstream failure after the stream started is sent as a
final `data: {"error": ...}` event, so no client mistakes a cut stream for a whole answer.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from kvmem.bodies import parse_json, read_body
from kvmem.errors import BadRequest, KvmemError, ModelNotFound, openai_error_body
from kvmem.prompts import ChatLine, with_memory
from kvmem.provider import chat_target
from kvmem.routes.streaming import ClosingStreamingResponse
from kvmem.services import services_of, user_of
from kvmem.turn_memory import TurnMemory, check_conversation_id

# Fields kvmem sets itself; every other field of the request goes upstream as sent.
OWN_FIELDS = frozenset({"model", "messages", "stream"})


async def chat_completions(request: Request) -> Response:
    services = services_of(request)
    body = parse_json(await read_body(request, services.config.server.max_body_bytes))
    model, messages, stream = _check_request(body)
    body_user = body.get("user") if isinstance(body.get("user"), str) else None
    user_id = await user_of(request, body_user)
    if model not in services.config.chat.served_models():
        raise ModelNotFound(
            f"the model {model!r} does not exist; available: "
            + ", ".join(services.config.chat.served_models())
        )
    temporary = request.headers.get("x-memory", "").strip().lower() == "off"
    # The client's conversation, so that the history says which one an agent write came from.
    conversation_id = check_conversation_id(request.headers.get("x-conversation-id"))
    memory = await services.memory.begin(
        user_id, conversation_id,
        [ChatLine(m["role"], _text(m.get("content"))) for m in messages],
        temporary=temporary,
    )
    upstream_messages = inject(messages, memory.block)
    target = chat_target(services.config.chat, model)
    params = {k: v for k, v in body.items() if k not in OWN_FIELDS}
    if not stream:
        try:
            response = await services.client.complete(target, upstream_messages, user_id, **params)
        finally:
            services.memory.main_ended(memory)
        return JSONResponse(response, headers=memory_headers(memory))

    chunks = services.client.stream(target, upstream_messages, user_id, **params)
    try:
        first = await anext(chunks, None)
    except BaseException:
        services.memory.main_ended(memory)
        await chunks.aclose()
        raise
    streamed = ClosingStreamingResponse(_forward(first, chunks, memory, services.memory.main_ended))
    streamed.headers.update(memory_headers(memory))
    return streamed


def memory_headers(memory: TurnMemory) -> dict[str, str]:
    """`X-Memory-Injected` (entries in the block) and `X-Memory-Agent` (the agent's state
    as the headers leave: a streamed reply's agent is usually still `running`)."""
    return {"X-Memory-Injected": str(len(memory.injected)), "X-Memory-Agent": memory.run.state}


async def _forward(
    first: dict[str, Any] | None,
    chunks: AsyncIterator[dict[str, Any]],
    memory: TurnMemory,
    main_ended: Any,
) -> AsyncIterator[str]:
    """Forward each upstream chunk as it arrives; an error becomes the final event."""
    try:
        if first is not None:
            yield _data(first)
            async for chunk in chunks:
                yield _data(chunk)
    except KvmemError as exc:
        yield _data(openai_error_body(exc))
        return
    finally:
        main_ended(memory)
        await chunks.aclose()
    yield "data: [DONE]\n\n"


def _data(value: Any) -> str:
    return f"data: {json.dumps(value, ensure_ascii=False, separators=(',', ':'))}\n\n"


def _check_request(body: Any) -> tuple[str, list[dict[str, Any]], bool]:
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    model, messages, stream = body.get("model"), body.get("messages"), body.get("stream", False)
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' is required and must be a string", param="model")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty array", param="messages")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRequest(
                f"messages[{index}] must be an object with a 'role'", param=f"messages[{index}]"
            )
    if not isinstance(stream, bool):
        raise BadRequest("'stream' must be a boolean", param="stream")
    return model, messages, stream


def _text(content: Any) -> str:
    """The text of a message's content: a string, or the text parts of a list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
        )
    return ""


def inject(messages: list[dict[str, Any]], block: str) -> list[dict[str, Any]]:
    """The messages with the memory block appended to the first system message (or a new one)."""
    if not block:
        return messages
    for index, message in enumerate(messages):
        if message["role"] in ("system", "developer"):
            content = message.get("content")
            if isinstance(content, list):
                updated = {**message, "content": [*content, {"type": "text", "text": block}]}
            else:
                updated = {**message, "content": with_memory(_text(content), block)}
            return [*messages[:index], updated, *messages[index + 1 :]]
    return [{"role": "system", "content": block}, *messages]


async def list_models(request: Request) -> Response:
    services = services_of(request)
    await user_of(request)
    return JSONResponse(
        {
            "object": "list",
            "data": [
                {"id": model, "object": "model", "created": 0, "owned_by": "kvmem"}
                for model in services.config.chat.served_models()
            ],
        }
    )


routes = [
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    Route("/v1/models", list_models, methods=["GET"]),
]
