"""A fast scripted OpenAI-compatible upstream for the benchmark: a raw ASGI app.

Run as its own process (`python -m tests.bench.upstream --port P ...`) by uvicorn with uvloop
and httptools, so that its own cost is small next to what is measured. Behaviour depends on
the model name (any `provider/` prefix is dropped):

- `bench-model`: the main model. Answers after `--main-latency`; streamed, `--chunks` chunks
  with `--chunk-delay` between them.
- `bench-agent`: the memory agent. Answers after `--agent-latency`, text only, no tool calls.
- `POST .../v1/messages` (Anthropic's Messages API, what litellm sends for `anthropic/...`
  models): `bench-model` answers after `--main-latency`, non-streamed only.
- `bench-hang`: never answers. It waits for the client to go away (at most `--max-hang`
  seconds) and records `time.monotonic()` of the disconnect under the request's tag (the
  first `bench-tag-<hex>` found in the body). CLOCK_MONOTONIC is shared by every process on
  Linux, so the benchmark compares it with its own clock.

`GET /control/hangs` returns `{tag: {"arrived": t, "disconnected": t|null}}`;
`POST /control/hangs/clear` empties it; `GET /control/last-main` returns the newest main-model
request body (to check what kvmem injected); `GET /control/ping` answers when the server is up.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from typing import Any

TAG = re.compile(rb"bench-tag-[0-9a-f]+")
MAIN, AGENT, HANG = "bench-model", "bench-agent", "bench-hang"
USAGE = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}


def completion(model: str, content: str) -> bytes:
    """A whole `chat.completion` body."""
    return json.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                }
            ],
            "usage": USAGE,
        }
    ).encode()


def anthropic_message(model: str, content: str) -> bytes:
    """A whole Anthropic `message` body."""
    return json.dumps(
        {
            "id": "msg_bench",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [{"type": "text", "text": content}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 5},
        }
    ).encode()


def stream_events(model: str, pieces: list[str]) -> list[bytes]:
    """The SSE events of a streamed answer, `[DONE]` included."""

    def chunk(delta: dict[str, Any], finish: str | None) -> bytes:
        body = {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "created": 1_700_000_000,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        return f"data: {json.dumps(body)}\n\n".encode()

    events = [chunk({"role": "assistant", "content": pieces[0]}, None)]
    events += [chunk({"content": piece}, None) for piece in pieces[1:]]
    events.append(chunk({}, "stop"))
    events.append(b"data: [DONE]\n\n")
    return events


class Upstream:
    """The ASGI app, with its latencies and the hanging requests it saw."""

    def __init__(
        self,
        main_latency: float,
        agent_latency: float,
        chunks: int,
        chunk_delay: float,
        max_hang: float,
    ) -> None:
        self.main_latency = main_latency
        self.agent_latency = agent_latency
        self.chunk_delay = chunk_delay
        self.max_hang = max_hang
        self.hangs: dict[str, dict[str, float | None]] = {}
        self.last_main = b"{}"  # the newest main-model request, to check what was injected
        self.main_body = completion(MAIN, "Noted, thanks.")
        self.agent_body = completion(AGENT, "Nothing to remember.")
        pieces = [f"word{i} " for i in range(max(1, chunks))]
        self.main_events = stream_events(MAIN, pieces)
        self.anthropic_body = anthropic_message(MAIN, "Noted, thanks.")

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if method == "POST" and path.endswith("/chat/completions"):
            await self.chat(receive, send)
        elif method == "POST" and path.endswith("/v1/messages"):
            await self.messages(receive, send)
        elif method == "GET" and path == "/control/ping":
            await respond(send, 200, b'{"status":"ok"}')
        elif method == "GET" and path == "/control/hangs":
            await respond(send, 200, json.dumps(self.hangs).encode())
        elif method == "GET" and path == "/control/last-main":
            await respond(send, 200, self.last_main)
        elif method == "POST" and path == "/control/hangs/clear":
            self.hangs.clear()
            await respond(send, 200, b"{}")
        elif method == "GET" and path.endswith("/models"):
            await respond(
                send,
                200,
                json.dumps(
                    {
                        "object": "list",
                        "data": [
                            {"id": m, "object": "model", "created": 0, "owned_by": "bench"}
                            for m in (MAIN, AGENT, HANG)
                        ],
                    }
                ).encode(),
            )
        else:
            await respond(send, 404, b'{"error":{"message":"not found"}}')

    async def chat(self, receive: Any, send: Any) -> None:
        raw = await read_body(receive)
        body = json.loads(raw)
        model = str(body.get("model", "")).rsplit("/", 1)[-1]
        if model == HANG:
            await self.hang(raw, receive, send)
        elif model == AGENT:
            await asyncio.sleep(self.agent_latency)
            await respond(send, 200, self.agent_body)
        elif model == MAIN:
            self.last_main = raw
            await asyncio.sleep(self.main_latency)
            if body.get("stream"):
                await self.stream(send)
            else:
                await respond(send, 200, self.main_body)
        else:
            await respond(send, 404, b'{"error":{"message":"unknown model"}}')

    async def messages(self, receive: Any, send: Any) -> None:
        body = json.loads(await read_body(receive))
        if body.get("model") != MAIN or body.get("stream"):
            await respond(
                send,
                400,
                b'{"type":"error","error":{"type":"invalid_request_error",'
                b'"message":"only bench-model, non-streamed"}}',
            )
            return
        await asyncio.sleep(self.main_latency)
        await respond(send, 200, self.anthropic_body)

    async def stream(self, send: Any) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream"),
                    (b"cache-control", b"no-cache"),
                ],
            }
        )
        last = len(self.main_events) - 1
        for index, event in enumerate(self.main_events):
            if 0 < index < last - 1 and self.chunk_delay:
                await asyncio.sleep(self.chunk_delay)
            await send({"type": "http.response.body", "body": event, "more_body": index < last})

    async def hang(self, raw: bytes, receive: Any, send: Any) -> None:
        match = TAG.search(raw)
        tag = match.group().decode() if match else f"untagged-{len(self.hangs)}"
        record: dict[str, float | None] = {"arrived": time.monotonic(), "disconnected": None}
        self.hangs[tag] = record
        try:
            async with asyncio.timeout(self.max_hang):
                while True:  # ends at the disconnect (or the timeout): at most max_hang seconds
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        record["disconnected"] = time.monotonic()
                        return
        except TimeoutError:
            await respond(send, 504, b'{"error":{"message":"bench-hang gave up waiting"}}')


async def read_body(receive: Any) -> bytes:
    """The whole request body."""
    parts = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        parts.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    return b"".join(parts)


async def respond(send: Any, status: int, body: bytes) -> None:
    """A JSON response."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    """Serve on 127.0.0.1 with uvloop and httptools."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--main-latency", type=float, default=0.020)
    parser.add_argument("--agent-latency", type=float, default=0.050)
    parser.add_argument("--chunks", type=int, default=10)
    parser.add_argument("--chunk-delay", type=float, default=0.002)
    parser.add_argument("--max-hang", type=float, default=60.0)
    args = parser.parse_args()
    import uvicorn

    app = Upstream(
        args.main_latency, args.agent_latency, args.chunks, args.chunk_delay, args.max_hang
    )
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=args.port,
        loop="uvloop",
        http="httptools",
        lifespan="off",
        access_log=False,
        log_level="warning",
        backlog=4096,
    )


if __name__ == "__main__":
    main()
