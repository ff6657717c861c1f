"""`POST /chat` and `/conversations`: stored conversations with memory, streamed or not.

A turn may name a scope (`"scope"` in the body, or `X-Memory-Scope`); the scope is the
request's, not the conversation's: each turn names its own."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from pydantic import Field, StrictBool, StrictInt, StrictStr
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from kvmem.agent.prompts import ChatLine
from kvmem.agent.turn_memory import TurnMemory
from kvmem.chat.conversations import new_conversation_id
from kvmem.chat.main_call import MainCall
from kvmem.entries import utcnow
from kvmem.errors import BadRequest, StoreUnavailable, UserErased, error_body
from kvmem.server.bodies import INT64_MAX, RequestBody, read_model
from kvmem.server.routes import route, turn_scope
from kvmem.server.routes.paging import limit_param
from kvmem.server.routes.streaming import ClosingStreamingResponse
from kvmem.server.services import Services, services_of, user_of
from kvmem.upstream.completion_shapes import a_string, chunk_choices, first_choice

log = logging.getLogger("kvmem.chat")


class ChatRequest(RequestBody):
    """`POST /chat`."""

    message: StrictStr
    conversation_id: StrictStr | None = None
    max_turns: StrictInt | None = Field(None, ge=0)
    memory: StrictBool = True
    stream: StrictBool = False
    # The turn's scope (`memory.scopes`): per request, not kept with the conversation.
    scope: StrictStr | None = None


class Turn:
    """One /chat turn: its request, its conversation and its memory."""

    def __init__(self, services: Services, user_id: str, body: ChatRequest, scope: str) -> None:
        self.services = services
        self.user_id = user_id
        self.body = body
        self.scope = scope
        self.new = body.conversation_id is None
        self.conversation_id = body.conversation_id or new_conversation_id()
        self.memory: TurnMemory | None = None
        self.began = utcnow()  # an erasure of the user after this keeps the turn from being stored

    async def start(self) -> MainCall:
        """Load the history (404 if not the user's) and start the main call on it: the agent
        reads the conversation's recent messages, the model the last `max_turns` of them."""
        config = self.services.config
        max_turns = config.chat.max_turns if self.body.max_turns is None else self.body.max_turns
        history = []
        if not self.new:
            # Within the database's integer range: `max_turns` may be as large as 2**63 - 1.
            count = min(max(2 * max_turns, config.memory.message_window_size), INT64_MAX)
            history = await run_in_threadpool(
                self.services.conversations.recent, self.user_id, self.conversation_id, count
            )
        window = [ChatLine(m.role, m.content) for m in history]
        window.append(ChatLine("user", self.body.message))
        sent = history[max(0, len(history) - 2 * max_turns) :] if max_turns else []
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": config.chat.system_prompt},
            *({"role": m.role, "content": m.content} for m in sent),
            {"role": "user", "content": self.body.message},
        ]
        call = await MainCall.start(
            self.services.memory,
            self.services.client,
            self.user_id,
            messages,
            conversation_id=self.conversation_id,
            temporary=not self.body.memory,
            window=window,
            scope=self.scope,
        )
        self.memory = call.memory
        return call

    async def store(self, reply: str) -> None:
        """Keep the finished turn (user message and reply together).

        Chat survives memory: if the store cannot be written the reply is still sent (the
        turn is not kept, and the log says so).
        """
        try:
            stored = await run_in_threadpool(
                self.services.conversations.record_turn,
                self.user_id,
                self.conversation_id,
                self.body.message,
                reply,
                new=self.new,
                began=self.began,
            )
        except UserErased:
            log.info("user %s was erased during the turn; not stored", self.user_id)
            return
        except StoreUnavailable as exc:
            log.warning(
                "turn not stored, store unavailable: user=%s conversation=%s: %s",
                self.user_id,
                self.conversation_id,
                exc,
            )
            return
        if not stored:
            log.info(
                "conversation %s was deleted during the turn; not stored", self.conversation_id
            )

    def reply(self, text: str) -> dict[str, Any]:
        """The /chat reply object."""
        assert self.memory is not None
        return {
            "conversation_id": self.conversation_id,
            "response": text,
            "memory": self.memory.as_json(),
        }


async def chat(request: Request) -> Response:
    services = services_of(request)
    user_id = await user_of(request)
    body = await read_model(request, ChatRequest, services.config.server.max_body_bytes)
    if not body.message.strip():
        raise BadRequest("message is empty")
    if "\x00" in body.message:
        raise BadRequest("message contains a NUL character, which cannot be stored")
    turn = Turn(services, user_id, body, turn_scope(request, body.scope))
    call = await turn.start()
    if not body.stream:
        response = await call.complete()
        message = first_choice(response)["message"]
        text = a_string(message.get("content"), "the message's content") or ""
        await turn.store(text)
        return JSONResponse(turn.reply(text))

    # The first delta is awaited before answering, so a failure before it is a plain error.
    path = request.url.path
    stream = await call.stream(
        lambda chunks: _events(turn, chunks),
        # A failure after the first delta: the stream's last event (the turn is not stored).
        lambda exc: sse("error", error_body(path, exc)),
        until=lambda c: bool(_delta_text(c)),
    )
    return ClosingStreamingResponse(stream)


def _delta_text(chunk: dict[str, Any]) -> str:
    """A chunk's text; `UpstreamError` for a chunk of the wrong shape (kvmem reads it)."""
    choices = chunk_choices(chunk)
    delta = (choices[0].get("delta") or {}) if choices else {}
    return a_string(delta.get("content"), "a delta's content") or ""


def sse(event: str, data: Any) -> str:
    """One Server-Sent Event."""
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


async def _events(turn: Turn, chunks: AsyncIterator[dict[str, Any]]) -> AsyncGenerator[str, None]:
    """Deltas and agent writes as they come; once stored, the writes still to land, then done."""
    parts: list[str] = []
    assert turn.memory is not None
    run = turn.memory.run
    async for chunk in chunks:
        text = _delta_text(chunk)
        if text:
            parts.append(text)
            yield sse("delta", {"content": text})
        # Agent writes go out as they land, between deltas, not after the last one (and
        # never before the first: the reply starts with text).
        if parts:
            for update in run.landed():
                yield sse("memory", update.as_json())
    await turn.store("".join(parts))
    if run.task is not None:
        async for update in run.events():
            yield sse("memory", update.as_json())
    yield sse("done", turn.reply("".join(parts)))


async def list_conversations(request: Request) -> Response:
    services = services_of(request)
    user_id = await user_of(request)
    limit = limit_param(request)
    before = request.query_params.get("before")
    page = await run_in_threadpool(services.conversations.list, user_id, limit, before)
    return JSONResponse(page.as_json())


async def get_conversation(request: Request) -> Response:
    services = services_of(request)
    user_id = await user_of(request)
    info, messages = await run_in_threadpool(
        services.conversations.get, user_id, request.path_params["conversation_id"]
    )
    return JSONResponse({**info.as_json(), "messages": [m.as_json() for m in messages]})


async def delete_conversation(request: Request) -> Response:
    services = services_of(request)
    user_id = await user_of(request)
    await run_in_threadpool(
        services.conversations.delete, user_id, request.path_params["conversation_id"]
    )
    return Response(status_code=204)


routes = [
    Route("/chat", chat, methods=["POST"]),
    route("/conversations", GET=list_conversations),
    route("/conversations/{conversation_id}", GET=get_conversation, DELETE=delete_conversation),
]
