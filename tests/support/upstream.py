"""A scripted OpenAI-compatible upstream: a real HTTP server on 127.0.0.1 for the tests.

kvmem reaches it through litellm's real code path. Each test scripts, per model name, the
replies (text, tool calls, latency, errors, streamed chunks, broken connections), or a
responder that answers each request by reading it, and reads back what the upstream
received, when, and whether the client went away.
"""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    """One scripted answer to one request."""

    content: str | None = "ok"
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # {"name", "arguments"}
    delay: float = 0.0  # seconds before the response starts
    status: int = 200
    error: dict[str, Any] | None = None  # the error body for a non-200 status
    headers: dict[str, str] = field(default_factory=dict)
    chunks: list[str] | None = None  # streamed content pieces (default: content in 3 parts)
    chunk_delay: float = 0.0  # seconds between streamed chunks
    fail_after: int | None = None  # streaming: drop the connection after this many chunks
    raw: bytes | None = None  # send these bytes as the body instead of JSON
    events: list[dict[str, Any]] | None = None  # streaming: send these chunk objects as they are
    hang: bool = False  # never answer; wait until the client goes away
    reset: bool = False  # close the connection without answering
    finish_reason: str | None = None
    usage: dict[str, int] = field(
        default_factory=lambda: {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    )


@dataclass
class Received:
    """One request as the upstream saw it."""

    model: str
    body: dict[str, Any]
    headers: dict[str, str]
    started: float  # time.monotonic() when the request arrived
    ended: float | None = None  # when the upstream finished answering (or gave up)
    disconnected: bool = False  # the client closed the connection before the answer ended

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The request's messages."""
        return self.body.get("messages", [])

    @property
    def system(self) -> str:
        """The first system message's text ('' if none)."""
        for message in self.messages:
            if message.get("role") == "system":
                return message.get("content") or ""
        return ""


class ScriptedUpstream:
    """The server: `script(model, *replies)`, then read `requests`."""

    def __init__(
        self, keepalive_seconds: float | None = None, drop_idle_after: float | None = None
    ) -> None:
        """`keepalive_seconds`: close a connection idle this long between requests, as
        uvicorn (5 s by default) and vLLM do; None keeps idle connections open.

        `drop_idle_after`: a request that arrives on a connection idle longer than this is
        answered with a reset, unread. That is the race of a keep-alive timeout (the
        upstream closes just as the client reuses the connection) made certain: the client
        cannot tell it from a live connection until it has sent.
        """
        self.drop_idle_after = drop_idle_after
        self.dropped = 0  # requests reset by `drop_idle_after`
        self._replies: dict[str, deque[Reply]] = defaultdict(deque)
        self._defaults: dict[str, Reply] = {}
        self._responders: dict[str, Callable[[Received], Reply]] = {}
        self.requests: list[Received] = []
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        upstream = self

        class Handler(_Handler):
            owner = upstream
            # The socket timeout ends an idle keep-alive connection (handle_one_request
            # closes it on TimeoutError while waiting for the next request line).
            timeout = keepalive_seconds

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        """The base URL to give litellm (`api_base`)."""
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def start(self) -> ScriptedUpstream:
        """Start serving in a background thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()

    def script(self, model: str, *replies: Reply) -> None:
        """Queue replies for requests naming `model`, answered in order."""
        with self._lock:
            self._replies[model].extend(replies)

    def default(self, model: str, reply: Reply) -> None:
        """The reply for `model` once its queue is empty."""
        with self._lock:
            self._defaults[model] = reply

    def respond(self, model: str, responder: Callable[[Received], Reply]) -> None:
        """Answer requests for `model` (once its queue is empty) with `responder(request)`:
        a scripted model that reads what it was sent. It runs on the server's thread."""
        with self._lock:
            self._responders[model] = responder

    def received(self, model: str) -> list[Received]:
        """The requests that named `model`, in arrival order."""
        with self._lock:
            return [r for r in self.requests if r.model == model]

    def wait_for(self, model: str, count: int = 1, timeout: float = 10.0) -> list[Received]:
        """Block until `count` requests named `model` arrived; they are returned."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while len([r for r in self.requests if r.model == model]) < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"{count} request(s) for {model!r} did not arrive")
                self._changed.wait(remaining)
            return [r for r in self.requests if r.model == model]

    def wait_ended(self, request: Received, timeout: float = 10.0) -> Received:
        """Block until the upstream finished with `request` (answered or saw a disconnect)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while request.ended is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError("the request did not end")
                self._changed.wait(remaining)
        return request

    def _next(self, received: Received) -> Reply:
        with self._lock:
            queue = self._replies.get(received.model)
            if queue:
                return queue.popleft()
            responder = self._responders.get(received.model)
            if responder is None:
                return self._defaults.get(received.model, Reply())
        return responder(received)

    def _record(self, received: Received) -> None:
        with self._changed:
            self.requests.append(received)
            self._changed.notify_all()

    def _ended(self, received: Received, disconnected: bool = False) -> None:
        with self._changed:
            received.ended = time.monotonic()
            received.disconnected = disconnected
            self._changed.notify_all()


class _Server(ThreadingHTTPServer):
    # A real server's backlog (uvicorn: 2048); the standard library's 5 overflows under a
    # burst of new connections, and the kernel then resets some of them.
    request_queue_size = 128


class _Handler(BaseHTTPRequestHandler):
    owner: ScriptedUpstream
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
        pass

    def handle_one_request(self) -> None:
        idle_since = getattr(self, "_idle_since", None)
        limit = self.owner.drop_idle_after
        if limit is not None and idle_since is not None:
            select.select([self.connection], [], [])  # the next request (or the client's close)
            if self._peer_closed():  # a client closing an idle connection sent no request
                self.close_connection = True
                return
            if time.monotonic() - idle_since > limit:
                with self.owner._lock:
                    self.owner.dropped += 1
                self._reset()
                return
        super().handle_one_request()
        self._idle_since = time.monotonic()

    def _peer_closed(self) -> bool:
        """Whether the client closed the connection (rather than sent on it)."""
        try:
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _reset(self) -> None:
        """Close the connection with a TCP reset (SO_LINGER 0), answering nothing."""
        self.connection.setsockopt(
            socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
        )
        self.close_connection = True

    def do_GET(self) -> None:
        if self.path.rstrip("/").endswith("/models"):
            self._send_json(200, {"object": "list", "data": []})
        else:
            self._send_json(404, {"error": {"message": "not found"}})

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        received = Received(
            model=body.get("model", ""),
            body=body,
            headers={k.lower(): v for k, v in self.headers.items()},
            started=time.monotonic(),
        )
        self.owner._record(received)
        reply = self.owner._next(received)
        try:
            if self._wait(reply.delay):
                self.owner._ended(received, disconnected=True)
                return
            if reply.hang:
                while not self._wait(0.05):
                    pass
                self.owner._ended(received, disconnected=True)
                return
            if reply.reset:
                self.connection.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
                )
                self.close_connection = True
                self.owner._ended(received)
                return
            if reply.status != 200:
                error = reply.error or {"error": {"message": f"scripted {reply.status}"}}
                self._send_json(reply.status, error, reply.headers)
            elif reply.raw is not None:
                self._send_bytes(200, reply.raw, "application/json", reply.headers)
            elif body.get("stream"):
                if self._stream(received, reply, body):
                    self.owner._ended(received, disconnected=True)
                    return
            else:
                self._send_json(200, completion(received.model, reply), reply.headers)
        except (BrokenPipeError, ConnectionResetError):
            self.owner._ended(received, disconnected=True)
            return
        self.owner._ended(received)

    def _wait(self, seconds: float) -> bool:
        """Sleep up to `seconds`; True if the client closed the connection meanwhile."""
        deadline = time.monotonic() + seconds
        while True:
            remaining = deadline - time.monotonic()
            readable, _, _ = select.select(
                [self.connection], [], [], max(0.0, min(remaining, 0.05))
            )
            if readable:
                try:
                    if self.connection.recv(1, socket.MSG_PEEK) == b"":
                        return True
                except OSError:
                    return True
            if remaining <= 0:
                return False

    def _stream(self, received: Received, reply: Reply, body: dict[str, Any]) -> bool:
        """Send the reply as SSE chunks; True if the client went away."""
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.end_headers()
        events = stream_chunks(received.model, reply) if reply.events is None else [*reply.events]
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append(usage_chunk(received.model, reply))
        for index, event in enumerate(events):
            if reply.fail_after is not None and index >= reply.fail_after:
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return False
            if index and self._wait(reply.chunk_delay):
                return True
            self._chunk(f"data: {json.dumps(event)}\n\n".encode())
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")
        return False

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _send_json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        self._send_bytes(status, json.dumps(body).encode(), "application/json", headers or {})

    def _send_bytes(self, status: int, data: bytes, kind: str, headers: dict[str, str]) -> None:
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(data)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()


COMPLETION_ID = "chatcmpl-scripted"
CREATED = 1_764_000_000


def _tool_calls(reply: Reply) -> list[dict[str, Any]]:
    calls = []
    for index, call in enumerate(reply.tool_calls):
        arguments = call["arguments"]
        calls.append(
            {
                "id": call.get("id", f"call_{index}"),
                "type": "function",
                "function": {
                    "name": call["name"],
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                },
            }
        )
    return calls


def completion(model: str, reply: Reply) -> dict[str, Any]:
    """A `chat.completion` object for `reply`."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    calls = _tool_calls(reply)
    if calls:
        message["tool_calls"] = calls
    return {
        "id": COMPLETION_ID,
        "object": "chat.completion",
        "created": CREATED,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": reply.finish_reason or ("tool_calls" if calls else "stop"),
            }
        ],
        "usage": reply.usage,
    }


def _chunk_object(model: str, delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
    return {
        "id": COMPLETION_ID,
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def stream_chunks(model: str, reply: Reply) -> list[dict[str, Any]]:
    """The `chat.completion.chunk` objects for `reply` (without the usage chunk)."""
    pieces = reply.chunks
    if pieces is None:
        text = reply.content or ""
        third = max(1, len(text) // 3) if text else 1
        pieces = [text[i : i + third] for i in range(0, len(text), third)] if text else []
    events = [_chunk_object(model, {"role": "assistant", "content": ""}, None)]
    events += [_chunk_object(model, {"content": piece}, None) for piece in pieces]
    for index, call in enumerate(_tool_calls(reply)):
        arguments = call["function"]["arguments"]
        half = len(arguments) // 2
        first = {
            "index": index,
            "id": call["id"],
            "type": "function",
            "function": {"name": call["function"]["name"], "arguments": arguments[:half]},
        }
        events.append(_chunk_object(model, {"tool_calls": [first]}, None))
        rest = {"index": index, "function": {"arguments": arguments[half:]}}
        events.append(_chunk_object(model, {"tool_calls": [rest]}, None))
    finish = reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")
    events.append(_chunk_object(model, {}, finish))
    return events


def usage_chunk(model: str, reply: Reply) -> dict[str, Any]:
    """The final chunk of a stream with `include_usage`: no choices, the usage."""
    return {
        "id": COMPLETION_ID,
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": model,
        "choices": [],
        "usage": reply.usage,
    }
