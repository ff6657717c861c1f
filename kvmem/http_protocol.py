"""The HTTP/1.1 protocol `kvmem serve` runs: uvicorn's httptools protocol with a bound on the
request head and kvmem's error body for the requests the HTTP parser refuses.

httptools (uvicorn's default when installed) buffers a request line and headers of any size
before the app sees them, so a bound in the app would come after the memory is spent. This
protocol counts the bytes of a request's head as they arrive and answers 431
`headers_too_large` once they pass `server.max_header_bytes`, holding at most that plus one
socket read. Requests the parser cannot read (a NUL or a bare LF in a header, both
`Content-Length` and `Transfer-Encoding`, ...) answer 400 `bad_request` in kvmem's JSON shape
instead of uvicorn's plain text. It knows nothing of kvmem's routes.
"""

from __future__ import annotations

import json
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from kvmem.errors import BadRequest, HeadersTooLarge, KvmemError, openai_error_body

REASONS = {400: b"Bad Request", 431: b"Request Header Fields Too Large"}
# After refusing a request, how long what the client still sends is read and dropped, so
# that it can read the answer, before the connection is closed.
LINGER_SECONDS = 2.0


class _HeadRefused(Exception):
    """Raised from a parser callback to stop parsing a request whose head is too large."""


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with `max_header_bytes` and JSON error bodies."""

    max_header_bytes = 65_536

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_bytes = 0  # bytes of the current request's head received so far
        self._reading_head = True
        self._head_ended_now = False
        self._refusal: KvmemError | None = None
        self._discarding = False  # refused: what the client still sends is dropped

    def data_received(self, data: bytes) -> None:
        if self._discarding:
            return
        was_reading_head = self._reading_head
        self._head_ended_now = False
        super().data_received(data)
        if self._discarding or not was_reading_head or self._head_ended_now:
            return
        # Every byte fed while the head is still open belongs to it (the parser would buffer
        # it all): past the bound, refuse now rather than wait for the end of the head.
        self._head_bytes += len(data)
        if self._reading_head and self._head_bytes > self.max_header_bytes:
            self._refuse(self._too_large())

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._reading_head = True

    def on_headers_complete(self) -> None:
        self._reading_head = False
        self._head_ended_now = True
        # The request line and header lines as sent ("NAME: value\r\n"), without the final CRLF.
        line = len(self.parser.get_method()) + len(self.url) + len(" HTTP/1.1\r\n") + 1
        size = line + sum(len(name) + len(value) + 4 for name, value in self.headers)
        self._head_bytes = 0
        if size > self.max_header_bytes:
            self._refusal = self._too_large()
            raise _HeadRefused  # uvicorn answers a parser error with send_400_response
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._reading_head = True
        self._head_bytes = 0

    def send_400_response(self, msg: str) -> None:
        """Answer a request the parser refused, in kvmem's error shape (not plain text)."""
        error = self._refusal or BadRequest(
            "malformed HTTP request: the request line or headers could not be parsed"
        )
        self._refuse(error)

    def _too_large(self) -> HeadersTooLarge:
        return HeadersTooLarge(
            f"the request line and headers are over the limit of {self.max_header_bytes} bytes"
        )

    def _refuse(self, error: KvmemError) -> None:
        if self.cycle is not None and not self.cycle.response_complete:
            # A pipelined request went wrong while the one before it is still answering:
            # an error written now would land inside that response.
            self.transport.close()
            return
        openai = getattr(self, "url", b"").startswith(b"/v1/")
        body = json.dumps(
            openai_error_body(error) if openai else error.body(), separators=(",", ":")
        ).encode()
        head = [b"HTTP/1.1 %d %s\r\n" % (error.status, REASONS.get(error.status, b""))]
        head += [name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers]
        head += [
            b"content-type: application/json\r\n",
            b"x-content-type-options: nosniff\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n\r\n",
        ]
        self.transport.write(b"".join(head) + body)
        # Closing at once, with the client still sending its head, would reset the connection
        # and lose the answer; so end our side, drop what still comes for a moment, then close.
        self._discarding = True
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_SECONDS, self.transport.close)


def http_protocol(max_header_bytes: int) -> type[BoundedHttpToolsProtocol]:
    """The protocol class to give uvicorn (`http=`), bounding request heads to `max_header_bytes`."""
    return type(
        "KvmemHttpProtocol", (BoundedHttpToolsProtocol,), {"max_header_bytes": max_header_bytes}
    )


def uvicorn_options(max_header_bytes: int) -> dict[str, Any]:
    """The uvicorn settings that make a server kvmem's: `kvmem serve` and the tests use them."""
    return {"http": http_protocol(max_header_bytes)}
