"""Ollama's replies: the model's OpenAI answers (whole, or chunks as they stream) written as
`/api/chat`'s or `/api/generate`'s NDJSON lines, tool calls put back together. It knows
nothing of HTTP, memory or the upstream; the requests' side is `kvmem.server.ollama_shapes`.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

from kvmem.errors import UpstreamError
from kvmem.server.ollama_shapes import timestamp
from kvmem.upstream.completion_shapes import (
    a_string,
    an_array,
    an_object,
    chunk_choices,
    first_choice,
    usage_of,
)


def ndjson(value: dict[str, Any]) -> str:
    """One NDJSON line."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")) + "\n"


def done_reason(finish_reason: str | None) -> str:
    """Ollama's `done_reason` for an OpenAI `finish_reason` (tool calls end with `stop`)."""
    return "length" if finish_reason == "length" else "stop"


def tool_call(name: str, arguments: Any) -> dict[str, Any]:
    """An OpenAI tool call in Ollama's shape: the arguments as an object."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError as exc:
            raise UpstreamError(
                f"the model called {name!r} with arguments that are not JSON", upstream_status=200
            ) from exc
    if not isinstance(arguments, dict):
        raise UpstreamError(
            f"the model called {name!r} with arguments that are not a JSON object",
            upstream_status=200,
        )
    return {"function": {"name": name, "arguments": arguments}}


@dataclass
class ToolCallParts:
    """OpenAI's streamed tool-call fragments, put back together (Ollama sends calls whole)."""

    calls: dict[int, dict[str, str]] = field(default_factory=dict)

    def add(self, fragments: list[dict[str, Any]] | None) -> None:
        """Fold in one delta's `tool_calls`."""
        for fragment in an_array(fragments, "a delta's tool_calls"):
            fragment = an_object(fragment, "a streamed tool call")
            index = fragment.get("index", 0)
            if not isinstance(index, int):
                raise UpstreamError(
                    "the model call failed: a streamed tool call's index is "
                    "not an integer (a malformed response)",
                    upstream_status=200,
                )
            call = self.calls.setdefault(index, {"name": "", "arguments": ""})
            function = an_object(fragment.get("function"), "a streamed tool call's function")
            call["name"] += a_string(function.get("name"), "a tool call's name") or ""
            call["arguments"] += (
                a_string(function.get("arguments"), "a tool call's arguments") or ""
            )

    def whole(self) -> list[dict[str, Any]]:
        """The calls, in Ollama's shape."""
        return [tool_call(c["name"], c["arguments"]) for _, c in sorted(self.calls.items())]


@dataclass
class Reply:
    """How one request's answer is written: `/api/chat`'s `message` or `/api/generate`'s
    `response`, for `model`, timed from `started` (a `time.monotonic_ns()`)."""

    kind: Literal["chat", "generate"]
    model: str
    started: int

    def part(
        self, text: str, tool_calls: list[dict[str, Any]] | None = None, *, done: bool = False
    ) -> dict[str, Any]:
        """A reply object holding `text` (and, for chat, tool calls)."""
        value: dict[str, Any] = {"model": self.model, "created_at": timestamp()}
        if self.kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if tool_calls:
                message["tool_calls"] = tool_calls
            value["message"] = message
        else:
            value["response"] = text
        value["done"] = done
        return value

    def last(
        self,
        text: str,
        finish_reason: str | None,
        usage: dict[str, Any] | None,
        tool_calls: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """The closing object: `done`, `done_reason` and the counts that are known."""
        value = self.part(text, tool_calls, done=True)
        value["done_reason"] = done_reason(finish_reason)
        value["total_duration"] = time.monotonic_ns() - self.started
        prompt, completion = (
            (usage or {}).get("prompt_tokens"),
            (usage or {}).get("completion_tokens"),
        )
        # Without the upstream's usage litellm reports zeros, which are not counts.
        if isinstance(prompt, int) and isinstance(completion, int) and prompt + completion > 0:
            value["prompt_eval_count"] = prompt
            value["eval_count"] = completion
        return value

    def loaded(self) -> dict[str, Any]:
        """The answer to a request with nothing to say, which Ollama clients send to load a
        model (`ollama run` does): done at once, no model call."""
        value = self.part("", done=True)
        value["done_reason"] = "load"
        return value

    def whole(self, completion: dict[str, Any]) -> dict[str, Any]:
        """A non-streamed OpenAI completion as one Ollama reply."""
        # Every field read is checked: a wrong shape is the upstream's failure (502), not ours.
        choice = first_choice(completion)
        message = choice["message"]
        calls = []
        for call in an_array(message.get("tool_calls"), "the message's tool_calls"):
            function = an_object(
                an_object(call, "a tool call").get("function"), "a tool call's function"
            )
            calls.append(
                tool_call(
                    a_string(function.get("name"), "a tool call's name") or "",
                    function.get("arguments"),
                )
            )
        return self.last(
            a_string(message.get("content"), "the message's content") or "",
            a_string(choice.get("finish_reason"), "finish_reason"),
            usage_of(completion),
            calls,
        )

    async def lines(self, chunks: AsyncIterator[dict[str, Any]]) -> AsyncGenerator[str, None]:
        """Streamed OpenAI chunks as NDJSON lines: each piece of text as it arrives, the tool
        calls once whole, then the closing line."""
        calls = ToolCallParts()
        finish_reason, usage = None, None
        async for chunk in chunks:
            usage = usage_of(chunk) or usage
            for choice in chunk_choices(chunk)[:1]:
                delta = an_object(choice.get("delta"), "a chunk's delta")
                content = a_string(delta.get("content"), "a delta's content")
                if content:
                    yield ndjson(self.part(content))
                calls.add(delta.get("tool_calls"))
                finish_reason = (
                    a_string(choice.get("finish_reason"), "finish_reason") or finish_reason
                )
        if calls.calls:
            yield ndjson(self.part("", calls.whole()))
        yield ndjson(self.last("", finish_reason, usage))


def has_output(chunk: dict[str, Any]) -> bool:
    """Whether a streamed chunk carries anything for an Ollama line (text, a call, the end)."""
    return any(
        (choice.get("delta") or {}).get("content")
        or (choice.get("delta") or {}).get("tool_calls")
        or choice.get("finish_reason")
        for choice in chunk_choices(chunk)
    )
