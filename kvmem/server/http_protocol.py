"""The HTTP/1.1 protocol `kvmem serve` runs: uvicorn's httptools protocol with bounds on what a
connection may send before the app sees a request, and kvmem's error body for the requests it
refuses.

httptools (uvicorn's default when installed) buffers a request line, headers and chunked
trailers of any size, and waits for them for ever; a bound in the app would come after the
memory (or the file descriptor) is spent. This protocol:

- counts the bytes of a request's head as they arrive and answers 431 `headers_too_large`
  once they pass `server.max_header_bytes`, holding at most that plus one socket read;
  chunked trailers count toward the same bound (the head's size plus the trailers');
- closes a connection whose request head has not arrived within
  `server.header_timeout_seconds` (408 `request_timeout` when part of a head came; an idle
  connection is just closed), and, between requests, one idle for `KEEP_ALIVE_SECONDS`.
  The head deadlines are checked by one periodic sweep per server (`HeadDeadlines`), not by
  a timer per request: arming and cancelling a timer on every request cost more CPU than
  the rest of these bounds together, so a late head is closed up to `SWEEP_SECONDS` (or a
  quarter of the timeout, when shorter) after its deadline;
- answers 400 `bad_request` in kvmem's JSON shape, then closes, for what the parser cannot
  read: a NUL or a bare LF in a header, both `Content-Length` and `Transfer-Encoding`, a
  malformed chunk size or extension;
- answers every request parsed before the one it refuses first, in order, and only then
  writes the refusal.

It knows nothing of kvmem's routes.
"""

from __future__ import annotations

import asyncio
import json
import weakref
from itertools import chain
from typing import TYPE_CHECKING, Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from kvmem.errors import BadRequest, HeadersTooLarge, KvmemError, RequestTimeout, error_body

if TYPE_CHECKING:
    from kvmem.config import ServerConfig

REASONS = {400: b"Bad Request", 408: b"Request Timeout", 431: b"Request Header Fields Too Large"}
# After refusing a request, how long what the client still sends is read and dropped, so
# that it can read the answer, before the connection is closed.
LINGER_SECONDS = 2.0
# A keep-alive connection idle this long between requests is closed (uvicorn's
# `timeout_keep_alive`); a connection that sends part of a head is bounded by the head timeout.
KEEP_ALIVE_SECONDS = 5.0
# How often a server's head deadlines are checked (at most; a quarter of the head timeout
# when that is shorter, never more often than every MIN_SWEEP_SECONDS).
SWEEP_SECONDS = 1.0
MIN_SWEEP_SECONDS = 0.01


class _HeadRefused(Exception):
    """Raised from a parser callback to stop parsing a request whose head is too large."""


class HeadDeadlines:
    """One server's head timeout: a timer that, while the server has connections, wakes every
    `period` seconds and times out each connection whose request head is late.

    A connection notes when it started waiting for a head (`_head_since`, a float per
    request); only this sweep holds a timer, so a request costs no timer of its own."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, connections: set[Any], timeout: float
    ) -> None:
        self.loop = loop
        self.connections = connections  # uvicorn's live protocols of this server
        self.timeout = timeout
        self.period = max(MIN_SWEEP_SECONDS, min(SWEEP_SECONDS, timeout / 4))
        self._timer: asyncio.TimerHandle | None = None

    def watch(self) -> None:
        """Make sure the sweep runs: a connection has just been made."""
        if self._timer is None:
            self._timer = self.loop.call_later(self.period, self.sweep)

    def sweep(self) -> None:
        """Time out every late head; sleep when the server has no connection left."""
        self._timer = None
        if not self.connections:
            return
        # The next sweep is armed first: an error timing out one connection must not end
        # the head timeout of every other.
        self._timer = self.loop.call_later(self.period, self.sweep)
        now = self.loop.time()
        for connection in list(self.connections):  # websocket protocols have no head deadline
            since = getattr(connection, "_head_since", None)
            if since is not None and now - since >= self.timeout:
                connection._head_timed_out()


# Each server's sweep, found from any of its connections (uvicorn's ServerState is shared by
# every connection of a server and dropped with it).
_deadlines: weakref.WeakKeyDictionary[Any, HeadDeadlines] = weakref.WeakKeyDictionary()


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with kvmem's bounds and JSON error bodies.

    The methods run for every request call uvicorn's as `HttpToolsProtocol.name(self, ...)`
    rather than through `super()`, which builds an object per call (Python 3.11)."""

    max_header_bytes = 65_536
    header_timeout_seconds = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._phase = "idle"  # "idle" (between requests), "head", "body" of the parsed request
        self._head_bytes = 0  # bytes of the current request's head received so far
        self._head_size = 0  # the last head's size as sent, which trailers add to
        self._trailer_bytes = 0  # bytes fed since the last chunk header, in reads without body
        self._after_chunk_header = False
        self._head_ended_now = False
        self._fed_body = False
        self._unanswered = 0  # requests parsed whose response is not complete
        self._refusal: KvmemError | None = None  # set in a callback, answered by send_400
        self._pending: KvmemError | None = None  # a refusal waiting for earlier answers
        self._discarding = False  # refused: what the client still sends is dropped
        # When this connection started waiting for a request head (loop time), None while a
        # request is being read or answered; HeadDeadlines times it out.
        self._head_since: float | None = None

    # -- the connection --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        deadlines = _deadlines.get(self.server_state)
        if deadlines is None or deadlines.loop is not self.loop:
            deadlines = HeadDeadlines(self.loop, self.connections, self.header_timeout_seconds)
            _deadlines[self.server_state] = deadlines
        deadlines.watch()
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        if self._discarding:
            return
        was_reading_head = self._phase != "body"
        self._head_ended_now = False
        self._fed_body = False
        HttpToolsProtocol.data_received(self, data)
        if self._discarding:
            return
        if self._after_chunk_header and not self._fed_body:
            # After the last chunk's size line come the trailers, which the parser buffers
            # like a head: bound them by what is left of the head's allowance.
            self._trailer_bytes += len(data)
            if self._head_size + self._trailer_bytes > self.max_header_bytes:
                self._refuse(
                    HeadersTooLarge(
                        f"the request line, headers and trailers are over the limit of "
                        f"{self.max_header_bytes} bytes"
                    )
                )
            return
        if not was_reading_head or self._head_ended_now:
            return
        # Every byte fed while the head is still open belongs to it (the parser would buffer
        # it all): past the bound, refuse now rather than wait for the end of the head.
        self._head_bytes += len(data)
        if self._phase != "body" and self._head_bytes > self.max_header_bytes:
            self._refuse(self._too_large())

    # -- parser callbacks ------------------------------------------------------------------

    def on_message_begin(self) -> None:
        HttpToolsProtocol.on_message_begin(self)
        self._phase = "head"

    def on_headers_complete(self) -> None:
        self._phase = "body"
        self._head_ended_now = True
        # The request line and header lines as sent ("NAME: value\r\n"), without the final
        # CRLF: "METHOD URL HTTP/1.1\r\n" is 12 bytes more than the method and URL, a header
        # line 4 more than its name and value (summed in C: no generator per request).
        headers = self.headers
        size = (
            len(self.parser.get_method())
            + len(self.url)
            + 12
            + 4 * len(headers)
            + sum(map(len, chain.from_iterable(headers)))
        )
        self._head_bytes = 0
        self._head_size = size
        if size > self.max_header_bytes:
            self._refusal = self._too_large()
            raise _HeadRefused  # uvicorn answers a parser error with send_400_response
        self._head_since = None  # the head came in time
        before = self.cycle
        HttpToolsProtocol.on_headers_complete(self)
        if self.cycle is not before:
            self._unanswered += 1

    def on_chunk_header(self) -> None:
        self._after_chunk_header = True
        self._trailer_bytes = 0

    def on_body(self, body: bytes) -> None:
        self._fed_body = True  # this read is not (only) trailers
        HttpToolsProtocol.on_body(self, body)

    def on_chunk_complete(self) -> None:
        self._after_chunk_header = False

    def on_message_complete(self) -> None:
        HttpToolsProtocol.on_message_complete(self)
        self._phase = "idle"
        self._head_bytes = 0

    def on_response_complete(self) -> None:
        self._unanswered -= 1
        HttpToolsProtocol.on_response_complete(self)
        if self._unanswered > 0 or self.transport.is_closing():
            return
        if self._pending is not None:
            error, self._pending = self._pending, None
            self._write_refusal(error)
        else:
            self._head_since = self.loop.time()  # the next head's time starts now

    # -- refusals --------------------------------------------------------------------------

    def send_400_response(self, msg: str) -> None:
        """Answer a request the parser refused, in kvmem's error shape (not plain text)."""
        error = self._refusal or BadRequest(
            "malformed HTTP request: the chunked body could not be parsed"
            if self._phase == "body"
            else "malformed HTTP request: the request line or headers could not be parsed"
        )
        self._refuse(error)

    def _too_large(self) -> HeadersTooLarge:
        return HeadersTooLarge(
            f"the request line and headers are over the limit of {self.max_header_bytes} bytes"
        )

    def _refuse(self, error: KvmemError) -> None:
        """Stop reading; answer `error` once every request parsed before it is answered."""
        self._discarding = True
        self._cancel_head_timer()
        cycle = self.cycle
        if self._phase == "body" and cycle is not None and not cycle.response_complete:
            # The refused bytes are this request's own body (or trailers).
            if cycle.response_started:
                # Its answer is under way: an error written now would land inside it.
                self.transport.close()
                return
            # Not answered yet: the app will not get the rest of the body (it sees the
            # client gone), and the refusal is this request's answer.
            self._forget(cycle)
        if self._unanswered > 0:
            self._pending = error  # written by on_response_complete, after the last answer
            return
        self._write_refusal(error)

    def _forget(self, cycle: Any) -> None:
        cycle.disconnected = True
        cycle.message_event.set()
        for queued in list(self.pipeline):
            if queued[0] is cycle:
                self.pipeline.remove(queued)
        self._unanswered -= 1

    def _write_refusal(self, error: KvmemError) -> None:
        path = getattr(self, "url", b"").decode("latin-1")
        body = json.dumps(error_body(path, error), separators=(",", ":")).encode()
        head = [b"HTTP/1.1 %d %s\r\n" % (error.status, REASONS.get(error.status, b""))]
        head += [
            name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers
        ]
        head += [
            b"content-type: application/json\r\n",
            b"x-content-type-options: nosniff\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n\r\n",
        ]
        self.transport.write(b"".join(head) + body)
        # Closing at once, with the client still sending, would reset the connection and
        # lose the answer; so end our side, drop what still comes for a moment, then close.
        self._discarding = True
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_SECONDS, self.transport.close)

    # -- the head timeout (checked by HeadDeadlines) ----------------------------------------

    def _arm_head_timer(self) -> None:
        self._head_since = self.loop.time()

    def _cancel_head_timer(self) -> None:
        self._head_since = None

    def _head_timed_out(self) -> None:
        self._head_since = None
        if self.transport.is_closing() or self._discarding:
            return
        if self._phase == "head":
            self._refuse(
                RequestTimeout(
                    f"the request line and headers did not arrive within "
                    f"{self.header_timeout_seconds:g} s (server.header_timeout_seconds)"
                )
            )
        else:  # nothing of a request came (or only the rest of one already answered)
            self.transport.close()


def http_protocol(server: ServerConfig) -> type[BoundedHttpToolsProtocol]:
    """The protocol class to give uvicorn (`http=`), with the bounds of `server`."""
    return type(
        "KvmemHttpProtocol",
        (BoundedHttpToolsProtocol,),
        {
            "max_header_bytes": server.max_header_bytes,
            "header_timeout_seconds": server.header_timeout_seconds,
        },
    )


def uvicorn_options(server: ServerConfig) -> dict[str, Any]:
    """The uvicorn settings that make a server kvmem's: `kvmem serve` and the tests use them."""
    return {"http": http_protocol(server), "timeout_keep_alive": KEEP_ALIVE_SECONDS}
