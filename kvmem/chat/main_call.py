"""The main model call of a chat request, with memory around it: one lifecycle for every route.

`/v1/chat/completions`, the Ollama routes and `/chat` all do the same thing around the model,
through `MainCall.start`: memory begins (block read, agent running) before the call and the
block goes into the messages' system message; the call answers whole or streamed; when it
ends, however it ends (answer, upstream error, timeout, client gone), the agent's grace period
starts and the upstream stream is closed, exactly once. `MainCall` owns that; a route only
turns its request into messages and the model's chunks into its own reply shape (`Render`),
and says how an error looks once a stream has started (`kvmem.errors.error_body`).

Under `placement: inline` the call also cuts the memory markers out of the model's reply
(kvmem/agent/reply_markers.py) before any route sees it, whole or streamed: each choice's
`message.content` or `delta.content` is rewritten to the text a client may see. When the
call ends the markers choice 0 closed go to `MemoryService.apply_markers`.

It knows nothing of HTTP: a `MainStream` is the body iterator a streamed response sends, and
closing it (started or not) ends the call.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from typing import Any

from kvmem.agent.markers import marker_limit
from kvmem.agent.prompts import ChatLine, with_memory
from kvmem.agent.reply_markers import ReplyMarkers
from kvmem.agent.turn_memory import MemoryService, TurnMemory
from kvmem.chat.retrieved_context import persons_words
from kvmem.errors import KvmemError
from kvmem.upstream.base import Target
from kvmem.upstream.model_client import ModelClient, chat_target

log = logging.getLogger("kvmem.chat")

Chunk = dict[str, Any]
# Turns the model's chunks into a reply's pieces (SSE events, NDJSON lines); an error from the
# upstream comes out of the chunks and passes through it.
Render = Callable[[AsyncIterator[Chunk]], AsyncGenerator[str, None]]


class MainCall:
    """One call of the main model for a request whose memory has begun (`MainCall.start`)."""

    def __init__(
        self,
        memory_service: MemoryService,
        client: ModelClient,
        memory: TurnMemory,
        target: Target,
        messages: list[dict[str, Any]],
        user_id: str,
        params: dict[str, Any] | None = None,
    ) -> None:
        self.memory = memory
        self.messages = messages
        self._memory_service = memory_service
        self._client = client
        self._target = target
        self._user_id = user_id
        self._params = params or {}
        self._chunks: AsyncIterator[Chunk] | None = None
        self._ended = False
        self._markers = (
            ReplyMarkers(marker_limit(_char_limit(memory_service, memory)))
            if memory.inline
            else None
        )

    @classmethod
    async def start(
        cls,
        memory_service: MemoryService,
        client: ModelClient,
        user_id: str,
        messages: list[dict[str, Any]],
        *,
        model: str | None = None,
        params: dict[str, Any] | None = None,
        conversation_id: str | None = None,
        temporary: bool = False,
        window: Sequence[ChatLine] | None = None,
        task: str | None = None,
        scope: str = "",
    ) -> MainCall:
        """Begin the request's memory and set up its main call: what every route does.

        `MemoryService.begin` reads the user's block and starts the agent on `window` (by
        default the messages' own text, `chat_lines`; `/chat` passes its stored history);
        `temporary` (`X-Memory: off`) reads and writes nothing. The block goes into the
        messages' system message (`inject`), and the call goes to `model` (default
        `chat.model`; see `chat_target`) with `params` beside the messages. A front end's
        `task` call (`kvmem.chat.task_calls`) gets no memory: no block, no agent, no markers.
        `scope` is the turn's (`MemoryRules.scope`; "": none).
        """
        target = chat_target(memory_service.config.chat, model)
        if task is not None:
            memory = memory_service.task_call(task)
        else:
            memory = await memory_service.begin(
                user_id,
                conversation_id,
                chat_lines(messages) if window is None else window,
                temporary=temporary,
                scope=scope,
            )
        return cls(
            memory_service, client, memory, target, inject(messages, memory.block), user_id, params
        )

    async def complete(self) -> dict[str, Any]:
        """The whole answer (an OpenAI `chat.completion` dict); the call has ended on return,
        and an inline turn's markers are applied (or their deadline has passed)."""
        try:
            response = await self._client.complete(
                self._target, self.messages, self._user_id, **self._params
            )
            if self._markers is not None:
                self._markers.strip_whole(response)
            return response
        finally:
            self.end()
            if self._markers is not None and self.memory.run.task is not None:
                # asyncio.wait, not await: a client that goes away must not cancel the writes.
                await asyncio.wait({self.memory.run.task})

    async def stream(
        self,
        render: Render,
        on_error: Callable[[KvmemError], str],
        *,
        until: Callable[[Chunk], bool] = lambda chunk: True,
    ) -> MainStream:
        """Start the streamed call and wait for its first chunk for which `until` holds.

        A failure before then raises (the route answers with a plain error response); after
        it, `on_error` renders the failure as the stream's last piece.
        """
        chunks = self._client.stream(self._target, self.messages, self._user_id, **self._params)
        if self._markers is not None:
            chunks = self._markers.strip_streamed(chunks)
        self._chunks = chunks
        held: list[Chunk] = []
        try:
            async for chunk in chunks:
                held.append(chunk)
                if until(chunk):
                    break
        except BaseException:
            await self.close()
            raise
        return MainStream(self, held, render, on_error)

    def end(self) -> None:
        """The main response is complete (or failed): start the agent's grace period, once."""
        if not self._ended:
            self._ended = True
            if self._markers is not None:
                self._memory_service.apply_markers(
                    self.memory, self._user_id, self._markers.markers
                )
            self._memory_service.main_ended(self.memory)

    async def close(self) -> None:
        """End the call and close the upstream stream (idempotent)."""
        self.end()
        if self._chunks is not None:
            await self._chunks.aclose()  # type: ignore[attr-defined]


class MainStream:
    """A streamed reply: `render` over the model's chunks, an error as the last piece.

    An async iterator rather than a generator, so that `aclose` ends the call even when the
    client left before the first piece was asked for (a generator never started has no
    `finally` to run).
    """

    def __init__(
        self,
        call: MainCall,
        held: list[Chunk],
        render: Render,
        on_error: Callable[[KvmemError], str],
    ) -> None:
        self._call = call
        self._held = held
        self._render = render
        self._on_error = on_error
        self._upstream = self._chunks()
        self._pieces = self._run()

    def __aiter__(self) -> MainStream:
        return self

    async def __anext__(self) -> str:
        return await self._pieces.__anext__()

    async def aclose(self) -> None:
        """Stop: the rendering, the upstream and the call (the agent's grace period starts)."""
        try:
            await self._pieces.aclose()
        finally:
            await self._upstream.aclose()
            await self._call.close()

    async def _chunks(self) -> AsyncGenerator[Chunk, None]:
        """The chunks held while waiting for the first, then the rest as they arrive; the
        call ends the moment they do (before the route's own work after the last chunk)."""
        try:
            for chunk in self._held:
                yield chunk
            self._held = []
            assert self._call._chunks is not None
            async for chunk in self._call._chunks:
                yield chunk
        finally:
            await self._call.close()

    async def _run(self) -> AsyncGenerator[str, None]:
        rendered = self._render(self._upstream)
        try:
            async for piece in rendered:
                yield piece
        except KvmemError as exc:
            # Logged with the message the stream's last piece carries.
            log.warning("the main model's stream failed: %s: %s", exc.code, exc.message)
            yield self._on_error(exc)
        finally:
            await rendered.aclose()


def _char_limit(memory_service: MemoryService, memory: TurnMemory) -> int:
    """The longest value a marker of this turn may hold: its layers' `charLimit`."""
    config = memory_service.config.memory
    scopes = config.scopes
    if scopes is None or memory.run.scope == "":
        return config.char_limit
    scoped = scopes.char_limit or config.char_limit
    return scoped if scopes.isolated else max(config.char_limit, scoped)


def message_text(content: Any) -> str:
    """The text of an OpenAI message's content: a string, or the non-empty text parts of a
    list joined by newlines (images, audio and files have none)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            part["text"]
            for part in content
            if isinstance(part, dict)
            and part.get("type") == "text"
            and isinstance(part.get("text"), str)
            and part["text"]
        )
    return ""


def chat_lines(messages: list[dict[str, Any]]) -> list[ChatLine]:
    """OpenAI messages as the memory agent reads them (see `chat_line`)."""
    return [chat_line(m["role"], m.get("content")) for m in messages]


def chat_line(role: str, content: Any) -> ChatLine:
    """One OpenAI message as the memory agent reads it: its text, and of a user message only
    the person's words, without the retrieved context a front end wrapped around them
    (`kvmem.chat.retrieved_context`; each text part on its own, as Open WebUI wraps each)."""
    if role != "user":
        return ChatLine(role, message_text(content))
    if isinstance(content, list):
        content = [
            {**part, "text": persons_words(part["text"])}
            if isinstance(part, dict) and isinstance(part.get("text"), str)
            else part
            for part in content
        ]
    elif isinstance(content, str):
        content = persons_words(content)
    return ChatLine(role, message_text(content))


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
                updated = {**message, "content": with_memory(message_text(content), block)}
            return [*messages[:index], updated, *messages[index + 1 :]]
    return [{"role": "system", "content": block}, *messages]
