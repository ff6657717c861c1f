"""The OpenAI-compatible proxy: `POST /v1/chat/completions` and `GET /v1/models`.

A request passes through to the configured upstream with the memory block injected into its
system message, while the memory agent reads the request's own messages. Responses keep
OpenAI's shapes, streamed or not; an upstream failure after the stream started is sent as a
final `data: {"error": ...}` event, so no client mistakes a cut stream for a whole answer.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from kvmem.bodies import parse_json, read_body
from kvmem.errors import BadRequest, KvmemError, ModelNotFound, openai_error_body
from kvmem.main_call import MainCall, chat_lines, inject
from kvmem.model_client import chat_target
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
        user_id, conversation_id, chat_lines(messages), temporary=temporary
    )
    upstream_messages = inject(messages, memory.block)
    target = chat_target(services.config.chat, model)
    params = {k: v for k, v in body.items() if k not in OWN_FIELDS}
    call = MainCall(services.memory, services.client, memory, target, upstream_messages, user_id,
                    params)
    if not stream:
        return JSONResponse(await call.complete(), headers=memory_headers(memory))
    streamed = ClosingStreamingResponse(await call.stream(_events, _error_event))
    streamed.headers.update(memory_headers(memory))
    return streamed


def memory_headers(memory: TurnMemory) -> dict[str, str]:
    """`X-Memory-Injected` (entries in the block) and `X-Memory-Agent` (the agent's state
    as the headers leave: a streamed reply's agent is usually still `running`)."""
    return {"X-Memory-Injected": str(len(memory.injected)), "X-Memory-Agent": memory.run.state}


async def _events(chunks: AsyncIterator[dict[str, Any]]) -> AsyncGenerator[str, None]:
    """Each upstream chunk as it arrives, then OpenAI's end marker."""
    async for chunk in chunks:
        yield _data(chunk)
    yield "data: [DONE]\n\n"


def _error_event(exc: KvmemError) -> str:
    """A failure after the stream started: the final event, in OpenAI's error shape."""
    return _data(openai_error_body(exc))


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
