"""The OpenAI-compatible proxy: `POST /v1/chat/completions` and `GET /v1/models`.

A request passes through to the configured upstream with the memory block injected into its
system message, while the memory agent reads the request's own messages; `X-Memory-Scope`
(or, with `memory.scopes.by_model`, the model) names the turn's scope. Responses keep
OpenAI's shapes, streamed or not; an upstream failure after the stream started is sent as a
final `data: {"error": ...}` event, so no client mistakes a cut stream for a whole answer.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from pydantic import BaseModel, ConfigDict, SkipValidation, model_validator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from kvmem.chat.main_call import MainCall
from kvmem.errors import BadRequest, ModelNotFound, error_body
from kvmem.server.bodies import read_model
from kvmem.server.routes import conversation_id, memory_headers, memory_off, turn_scope
from kvmem.server.routes.streaming import ClosingStreamingResponse
from kvmem.server.services import services_of, user_of


class CompletionRequest(BaseModel):
    """`POST /v1/chat/completions`: kvmem reads `model`, `messages` and `stream` (each
    refusal names its `param`, as OpenAI's do); every other field goes upstream as sent."""

    model_config = ConfigDict(extra="allow", frozen=True)

    model: str
    # Checked by `_openai_checks`, then kept as sent (not copied): they go upstream.
    messages: SkipValidation[list[dict[str, Any]]]
    stream: bool = False

    @model_validator(mode="before")
    @classmethod
    def _openai_checks(cls, body: Any) -> Any:
        # A `BadRequest` (not a ValueError) passes through pydantic as raised, with its param.
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
        return body

    def params(self) -> dict[str, Any]:
        """Every field but those kvmem sets itself, in the order sent."""
        return dict(self.model_extra or {})

    @property
    def user(self) -> str | None:
        """OpenAI's `user` field, when it is a string (a user id, under `auth.user_from_body`)."""
        user = (self.model_extra or {}).get("user")
        return user if isinstance(user, str) else None


async def chat_completions(request: Request) -> Response:
    services = services_of(request)
    body = await read_model(request, CompletionRequest, services.config.server.max_body_bytes)
    user_id = await user_of(request, body.user)
    if body.model not in services.config.chat.served_models():
        raise ModelNotFound(
            f"the model {body.model!r} does not exist; available: "
            + ", ".join(services.config.chat.served_models())
        )
    temporary = memory_off(request)
    task = services.task_calls.task_of(request.headers, body.messages)
    scope = turn_scope(request, model=body.model, reads_memory=task is None and not temporary)
    call = await MainCall.start(
        services.memory,
        services.client,
        user_id,
        body.messages,
        model=body.model,
        params=body.params(),
        # The client's conversation, so that the history says which one an agent write came from.
        conversation_id=conversation_id(request),
        temporary=temporary,
        task=task,
        scope=scope,
    )
    if not body.stream:
        return JSONResponse(await call.complete(), headers=memory_headers(call.memory))
    path = request.url.path
    streamed = ClosingStreamingResponse(
        await call.stream(_events, lambda exc: _data(error_body(path, exc)))
    )
    streamed.headers.update(memory_headers(call.memory))
    return streamed


async def _events(chunks: AsyncIterator[dict[str, Any]]) -> AsyncGenerator[str, None]:
    """Each upstream chunk as it arrives, then OpenAI's end marker (a failure after the
    stream started is the final event, in OpenAI's error shape)."""
    async for chunk in chunks:
        yield _data(chunk)
    yield "data: [DONE]\n\n"


def _data(value: Any) -> str:
    return f"data: {json.dumps(value, ensure_ascii=False, separators=(',', ':'))}\n\n"


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
