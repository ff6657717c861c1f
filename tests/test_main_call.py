"""The main-call lifecycle: however a call ends (answer, error before or after the first chunk,
a reply closed before it started), the main call ends exactly once and the upstream stream is
closed; the chunks held while waiting for the first are not lost."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from kvmem.chat.main_call import MainCall, MainStream
from kvmem.errors import KvmemError, UpstreamError
from kvmem.upstream.base import Target


class FakeMemory:
    """Counts `main_ended` calls (the MemoryService side of a call)."""

    def __init__(self) -> None:
        self.ended = 0

    def main_ended(self, memory: Any) -> None:
        self.ended += 1


class FakeClient:
    """Answers `complete` with `answer` (or raises it); streams `chunks`, then `fail` if set."""

    def __init__(
        self,
        chunks: list[dict[str, Any]] | None = None,
        fail: KvmemError | None = None,
        answer: Any = None,
    ) -> None:
        self.chunks = chunks or []
        self.fail = fail
        self.answer = answer
        self.closed = False
        self.sent = 0

    async def complete(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer

    async def stream(self, *args: Any, **kwargs: Any) -> AsyncGenerator[dict[str, Any], None]:
        try:
            for chunk in self.chunks:
                self.sent += 1
                yield chunk
            if self.fail is not None:
                raise self.fail
        finally:
            self.closed = True


def call_of(client: FakeClient, memory: FakeMemory) -> MainCall:
    turn = SimpleNamespace(inline=False)  # a turn under `placement: separate`
    return MainCall(memory, client, turn, Target("m"), [], "alice")  # type: ignore[arg-type]


def text(n: int) -> dict[str, Any]:
    return {"choices": [{"delta": {"content": f"t{n}"}}]}


ROLE = {"choices": [{"delta": {"role": "assistant", "content": ""}}]}


async def render(chunks: AsyncIterator[dict[str, Any]]) -> AsyncGenerator[str, None]:
    async for chunk in chunks:
        yield chunk["choices"][0]["delta"]["content"] or "."
    yield "end"


def on_error(exc: KvmemError) -> str:
    return f"error: {exc.message}"


async def drain(stream: MainStream) -> list[str]:
    pieces = [piece async for piece in stream]
    await stream.aclose()
    return pieces


def test_complete_ends_the_call_once_answered_or_failed() -> None:
    for answer in ({"choices": [{}]}, UpstreamError("down")):
        memory = FakeMemory()
        call = call_of(FakeClient(answer=answer), memory)
        if isinstance(answer, BaseException):
            with pytest.raises(UpstreamError):
                asyncio.run(call.complete())
        else:
            assert asyncio.run(call.complete()) == answer
        call.end()  # a second end changes nothing
        assert memory.ended == 1


def test_a_whole_stream_renders_every_chunk_and_ends_the_call_before_the_render_does() -> None:
    memory, client = FakeMemory(), FakeClient([ROLE, text(1), text(2)])
    seen_at_end: list[int] = []

    async def rendering(chunks: AsyncIterator[dict[str, Any]]) -> AsyncGenerator[str, None]:
        async for piece in render(chunks):
            if piece == "end":
                seen_at_end.append(memory.ended)  # the route's work after the last chunk
            yield piece

    async def main() -> list[str]:
        stream = await call_of(client, memory).stream(rendering, on_error)
        return await drain(stream)

    assert asyncio.run(main()) == [".", "t1", "t2", "end"]
    assert (seen_at_end, memory.ended, client.closed) == ([1], 1, True)


def test_chunks_held_until_the_first_that_counts_are_replayed() -> None:
    memory, client = FakeMemory(), FakeClient([ROLE, ROLE, text(1), text(2)])

    async def main() -> tuple[int, list[str]]:
        stream = await call_of(client, memory).stream(
            render, on_error, until=lambda c: bool(c["choices"][0]["delta"]["content"])
        )
        sent_before_reply = client.sent
        return sent_before_reply, await drain(stream)

    assert asyncio.run(main()) == (3, [".", ".", "t1", "t2", "end"])
    assert (memory.ended, client.closed) == (1, True)


def test_a_failure_before_the_first_chunk_raises_and_ends_the_call() -> None:
    memory, client = FakeMemory(), FakeClient([ROLE], fail=UpstreamError("down"))

    async def main() -> None:
        await call_of(client, memory).stream(
            render, on_error, until=lambda c: bool(c["choices"][0]["delta"]["content"])
        )

    with pytest.raises(UpstreamError):
        asyncio.run(main())
    assert (memory.ended, client.closed) == (1, True)


def test_a_failure_after_the_first_chunk_is_the_last_piece() -> None:
    memory, client = FakeMemory(), FakeClient([text(1), text(2)], fail=UpstreamError("cut"))

    async def main() -> list[str]:
        return await drain(await call_of(client, memory).stream(render, on_error))

    assert asyncio.run(main()) == ["t1", "t2", "error: cut"]
    assert (memory.ended, client.closed) == (1, True)


@pytest.mark.parametrize("read", [0, 1, 2])
def test_closing_the_reply_early_ends_the_call_and_closes_the_upstream(read: int) -> None:
    """A client that leaves before the first piece (0) or mid-stream: the same end."""
    memory, client = FakeMemory(), FakeClient([text(1), text(2), text(3)])

    async def main() -> list[str]:
        stream = await call_of(client, memory).stream(render, on_error)
        pieces = [await anext(stream) for _ in range(read)]
        await stream.aclose()
        await stream.aclose()
        return pieces

    assert asyncio.run(main()) == ["t1", "t2"][:read]
    assert (memory.ended, client.closed) == (1, True)
