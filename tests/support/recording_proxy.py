"""A recording HTTP proxy on 127.0.0.1: what a front end sends kvmem, exactly, and what it got.

`RecordingProxy(target).start()` forwards every request to `target` as it came (method, path,
headers, body) and passes the answer back as it streams; `exchanges` holds each request's
headers and body as the front end sent them, and the status and headers kvmem answered with.
The scripted upstream (`tests/support/upstream.py`) sees what kvmem sends on; this sees what
kvmem was sent.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

from tests.support.ports import bound_socket

# Headers about one hop, not the request: httpx and the handler set their own.
HOP_HEADERS = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "te", "upgrade"}
)


@dataclass
class Exchange:
    """One request as the front end sent it, and kvmem's answer's head."""

    method: str
    path: str
    headers: dict[str, str]  # as sent, names in the sender's case
    body: bytes
    status: int = 0
    response_headers: dict[str, str] | None = None

    def header(self, name: str) -> str | None:
        """A request header by name, whatever its case."""
        return next((v for k, v in self.headers.items() if k.lower() == name.lower()), None)

    def answer(self, name: str) -> str | None:
        """A response header by name (httpx gives them lower-cased)."""
        return (self.response_headers or {}).get(name.lower())

    def json(self) -> Any:
        return json.loads(self.body)


class RecordingProxy:
    """The proxy: `url` to give the front end, `exchanges` to read back."""

    def __init__(self, target: str) -> None:
        self.target = target.rstrip("/")
        self.exchanges: list[Exchange] = []
        self._lock = threading.Lock()
        self._client = httpx.Client(timeout=httpx.Timeout(120, connect=5))
        proxy = self

        class Handler(_Handler):
            owner = proxy

        self._socket = bound_socket()
        self._server = ThreadingHTTPServer(
            self._socket.getsockname(), Handler, bind_and_activate=False
        )
        self._server.socket.close()
        self._server.socket = self._socket
        self._server.server_activate()
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._socket.getsockname()[1]}"

    def start(self) -> RecordingProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._client.close()

    def posts(self, path: str) -> list[Exchange]:
        """The POSTs to `path` (query string aside), in arrival order."""
        with self._lock:
            return [
                e for e in self.exchanges if e.method == "POST" and e.path.split("?")[0] == path
            ]


class _Handler(BaseHTTPRequestHandler):
    owner: RecordingProxy
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._forward()

    def do_POST(self) -> None:
        self._forward()

    def do_PUT(self) -> None:
        self._forward()

    def do_DELETE(self) -> None:
        self._forward()

    def _forward(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        exchange = Exchange(self.command, self.path, dict(self.headers.items()), body)
        with self.owner._lock:
            self.owner.exchanges.append(exchange)
        headers = [(k, v) for k, v in self.headers.items() if k.lower() not in HOP_HEADERS]
        try:
            with self.owner._client.stream(
                self.command, self.owner.target + self.path, headers=headers, content=body
            ) as response:
                exchange.status = response.status_code
                exchange.response_headers = dict(response.headers)
                self.send_response(response.status_code)
                for name, value in response.headers.multi_items():
                    if name.lower() not in HOP_HEADERS:
                        self.send_header(name, value)
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                for chunk in response.iter_raw():
                    if chunk:
                        self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                        self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
        except httpx.HTTPError as exc:
            exchange.status = 502
            data = json.dumps({"error": {"message": f"proxy: {exc}"}}).encode()
            self.send_response(502)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
