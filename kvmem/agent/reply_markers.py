"""Memory markers cut out of every choice of a model's answer, whole or streamed.

A request may ask for several choices (`"n": 2`); each is its own reply, and a streamed
answer sends their chunks interleaved, each choice's under its `index`. `ReplyMarkers` keeps
one `MarkerFilter` (kvmem/agent/markers.py) per index, so a marker split across one choice's
chunks is held for that choice alone and no choice's text leaks into another's. Markers are
cut out of every choice, but only choice 0's (the reply the person sees and the one `/chat`
stores) are applied: `markers`. A choice of another shape (not an object, no `message` or
`delta` object) is left as it is, for the route to judge (kvmem/upstream/completion_shapes.py),
never a 500 here.

It knows the OpenAI answer and chunk shapes, nothing of HTTP, routes or the store;
kvmem/chat/main_call.py uses it.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from kvmem.agent.markers import Marker, MarkerFilter

Chunk = dict[str, Any]
# The choice whose markers are applied: the reply the person sees.
APPLIED_INDEX = 0


class ReplyMarkers:
    """The markers of one answer, cut out choice by choice; `markers` are choice 0's."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self._filters: dict[Any, MarkerFilter] = {}

    @property
    def markers(self) -> list[Marker]:
        """The markers choice 0 closed: the ones to apply."""
        applied = self._filters.get(APPLIED_INDEX)
        return applied.markers if applied is not None else []

    def _filter(self, index: Any) -> MarkerFilter:
        markers = self._filters.get(index)
        if markers is None:
            markers = self._filters[index] = MarkerFilter(self.max_chars)
        return markers

    def strip_whole(self, response: Any) -> None:
        """Cut the markers out of every choice of a whole answer (in place)."""
        for index, choice in _choices(response):
            message = choice.get("message")
            if not isinstance(message, dict) or not isinstance(message.get("content"), str):
                continue
            if index in self._filters:  # a second choice with an index seen: never applied
                markers = MarkerFilter(self.max_chars)
            else:
                markers = self._filter(index)
            message["content"] = markers.feed(message["content"]) + markers.finish()

    async def strip_streamed(self, chunks: AsyncIterator[Chunk]) -> AsyncGenerator[Chunk, None]:
        """The chunks with the markers cut out of each choice's `delta.content` (in place).
        What a choice's filter still holds goes out with that choice's chunk that carries
        its `finish_reason`, or, if the stream ends without one, in one more chunk."""
        last: dict[Any, tuple[Chunk, dict[str, Any]]] = {}  # per index: its latest chunk
        try:
            async for chunk in chunks:
                for index, choice in _choices(chunk):
                    delta = choice.get("delta")
                    if not isinstance(delta, dict):
                        continue
                    markers = self._filter(index)
                    content = delta.get("content")
                    text = markers.feed(content) if isinstance(content, str) else ""
                    if choice.get("finish_reason") is not None:
                        text += markers.finish()
                    if isinstance(content, str) or text:
                        delta["content"] = text
                    last[index] = (chunk, choice)
                yield chunk
            for index, (chunk, choice) in last.items():
                # The stream ended without this choice's finish_reason, or went on after it.
                rest = self._filters[index].finish()
                if rest:
                    yield {
                        **chunk,
                        "choices": [{**choice, "delta": {"content": rest}, "finish_reason": None}],
                    }
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]


def _choices(answer: Any) -> list[tuple[Any, dict[str, Any]]]:
    """An answer's (or chunk's) choices that are objects, each with its `index` (its
    position when it has none; a key that cannot be hashed as its repr)."""
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not isinstance(choices, list):
        return []
    found = []
    for position, choice in enumerate(choices):
        if isinstance(choice, dict):
            index = choice.get("index", position)
            if isinstance(index, dict | list):
                index = repr(index)
            found.append((index, choice))
    return found
