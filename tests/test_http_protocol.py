"""The HTTP framing bounds of `kvmem serve` (issue 22, items 1-6; CONTRACT section 18), probed
with raw sockets against a real server (uvicorn with kvmem's HTTP protocol, as `kvmem serve`
runs it). Each test failed on the protocol before these bounds."""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.apps import LiveServer

MakeServer = Callable[..., LiveServer]
HEAD_LIMIT = 8192
BODY_LIMIT = 1024


def converse(
    port: int, request: bytes, *, more: bytes = b"", pause: float = 0.0, wait: float = 10.0
) -> tuple[bytes, bool, float]:
    """Send `request` (then, `pause` seconds later, `more`, ignoring a refusal that closed the
    socket), and read for up to `wait` seconds; (every byte answered, whether the server
    closed, seconds until then)."""
    started = time.monotonic()
    answer, closed = b"", False
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as sock:
        try:
            sock.sendall(request)
            time.sleep(pause)
            sock.sendall(more)
        except OSError:
            pass  # the server refused and closed while we were still sending
        deadline = started + wait
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            try:
                data = sock.recv(65536)
            except TimeoutError:
                break
            except ConnectionResetError:
                closed = True
                break
            if not data:
                closed = True
                break
            answer += data
    return answer, closed, time.monotonic() - started


def answers(raw: bytes) -> list[tuple[str, dict[str, str], Any]]:
    """The HTTP answers in `raw`, in order, as (status line, headers but `date` and `server`,
    JSON body or None)."""
    found = []
    while raw:
        head, _, rest = raw.partition(b"\r\n\r\n")
        status, *lines = head.decode("latin-1").split("\r\n")
        headers = {
            name.lower(): value
            for name, value in (line.split(": ", 1) for line in lines)
            if name.lower() not in ("date", "server")
        }
        size = int(headers.get("content-length", "0"))
        body, raw = rest[:size], rest[size:]
        found.append((status, headers, json.loads(body) if body else None))
    return found


def error(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


def entries(server: LiveServer) -> list[Any]:
    return httpx.get(f"{server.url}/memory").json()["memories"]


def chunked_put(chunks: bytes) -> bytes:
    return (
        b"PUT /memory/k HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks
    )


# --- item 1: chunked trailers count toward server.max_header_bytes --------------------------

TRAILERS_OVER = error(
    "headers_too_large",
    f"the request line, headers and trailers are over the limit of {HEAD_LIMIT} bytes",
)


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-T: ",
        chunked_put(b'd\r\n{"value":"v"}\r\n0\r\nX-T: '),
    ],
    ids=["healthz", "put"],
)
def test_item1_chunked_trailers_past_the_head_limit_are_431(
    make_server: MakeServer, request_bytes: bytes
) -> None:
    server = make_server(server={"max_header_bytes": HEAD_LIMIT})
    # A trailer of 1 MiB and counting (sent once /healthz has answered): it used to be
    # buffered whole, with no end in sight.
    answer, closed, _ = converse(server.port, request_bytes, pause=0.3, more=b"a" * (1024 * 1024))
    got = answers(answer)
    statuses = [status for status, _, _ in got]
    if request_bytes.startswith(b"GET"):  # /healthz answers before reading a body
        assert statuses == ["HTTP/1.1 200 OK", "HTTP/1.1 431 Request Header Fields Too Large"]
    else:
        assert statuses == ["HTTP/1.1 431 Request Header Fields Too Large"]
    _, headers, body = got[-1]
    assert (headers["connection"], body, closed) == ("close", TRAILERS_OVER, True)
    assert entries(server) == []


# --- item 2: the request head must arrive within server.header_timeout_seconds ---------------


def test_item2_a_head_not_sent_within_the_timeout_is_408_and_idle_sockets_are_closed(
    make_server: MakeServer,
) -> None:
    server = make_server(server={"header_timeout_seconds": 1})
    half, half_closed, half_took = converse(
        server.port, b"GET /memory HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    )
    assert answers(half) == [
        (
            "HTTP/1.1 408 Request Timeout",
            {
                "content-type": "application/json",
                "x-content-type-options": "nosniff",
                "content-length": "135",
                "connection": "close",
            },
            error(
                "request_timeout",
                "the request line and headers did not arrive within 1 s "
                "(server.header_timeout_seconds)",
            ),
        )
    ]
    # The server's clock starts at accept, a little before the client's: 0.9 s, not 1.
    assert half_closed and 0.9 <= half_took < 5
    # A socket that sends nothing at all is closed without a word.
    idle, idle_closed, idle_took = converse(server.port, b"")
    assert (idle, idle_closed) == (b"", True)
    assert 0.9 <= idle_took < 5
    # So is a kept-alive connection that sends nothing after its first answer.
    kept, kept_closed, kept_took = converse(
        server.port, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    )
    assert ([status for status, _, _ in answers(kept)], kept_closed) == (["HTTP/1.1 200 OK"], True)
    assert 0.9 <= kept_took < 5


def test_item2_the_head_timeout_does_not_cut_a_request_whose_head_came_in_time(
    make_server: MakeServer,
) -> None:
    server = make_server(server={"header_timeout_seconds": 1})
    body = b'{"value": "v"}'
    head = (
        b"PUT /memory/k HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    )
    # The body comes well after the head timeout (and after a sweep of the deadlines): the
    # head arrived in time, so the request is read and answered; only then does the idle
    # connection's next head have 1 s to come.
    answer, closed, took = converse(server.port, head, pause=2, more=body)
    assert [status for status, _, _ in answers(answer)] == ["HTTP/1.1 201 Created"]
    assert closed and 3 <= took < 7
    assert [(entry["key"], entry["value"]) for entry in entries(server)] == [("k", "v")]


# --- item 3: malformed chunk sizes answer 400 in kvmem's shape ------------------------------


@pytest.mark.parametrize(
    "chunks",
    [
        b"zz\r\n",
        b"-2\r\n",
        b"99999999999999999999\r\n",
        b"3;a\x00b\r\nabc\r\n0\r\n\r\n",
    ],
    ids=["zz", "negative", "20-digits", "nul-in-extension"],
)
def test_item3_a_malformed_chunk_size_is_400_in_kvmems_shape_then_close(
    make_server: MakeServer, chunks: bytes
) -> None:
    server = make_server()
    answer, closed, _ = converse(server.port, chunked_put(chunks))
    assert answers(answer) == [
        (
            "HTTP/1.1 400 Bad Request",
            {
                "content-type": "application/json",
                "x-content-type-options": "nosniff",
                "content-length": "105",
                "connection": "close",
            },
            error("bad_request", "malformed HTTP request: the chunked body could not be parsed"),
        )
    ]
    assert closed
    assert entries(server) == []


# --- item 4: every 413 closes the connection, also after Expect: 100-continue ---------------

BODY_OVER = error("body_too_large", f"the request body is 2000 bytes; the limit is {BODY_LIMIT}")


@pytest.mark.parametrize("expect", [True, False], ids=["expect-100-continue", "body-sent"])
def test_item4_a_413_answers_connection_close(make_server: MakeServer, expect: bool) -> None:
    server = make_server(server={"max_body_bytes": BODY_LIMIT})
    head = (
        b"PUT /memory/k HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 2000\r\n" + (b"Expect: 100-continue\r\n" if expect else b"") + b"\r\n"
    )
    # With Expect, the client waits for 100 Continue and sends no body; the next request it
    # would send on the same connection used to hang, read as the body.
    body = b"" if expect else b'{"value": "' + b"a" * 1986 + b'"}'
    answer, closed, _ = converse(server.port, head + body, wait=5)
    assert answers(answer) == [
        (
            "HTTP/1.1 413 Request Entity Too Large",
            {
                "content-length": "97",
                "content-type": "application/json",
                "connection": "close",
                "x-content-type-options": "nosniff",
                "cache-control": "no-store",
            },
            BODY_OVER,
        )
    ]
    assert closed
    assert entries(server) == []


# --- item 5: a valid request pipelined before a refused one is answered first ---------------


def test_item5_a_valid_request_pipelined_before_a_malformed_one_is_answered_first(
    make_server: MakeServer,
) -> None:
    server = make_server()
    body = b'{"value": "v"}'
    valid = (
        b"PUT /memory/k HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    malformed = b"GET /memory HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: a\x00b\r\n\r\n"
    answer, closed, _ = converse(server.port, valid + malformed)
    got = answers(answer)
    assert [status for status, _, _ in got] == ["HTTP/1.1 201 Created", "HTTP/1.1 400 Bad Request"]
    assert got[1][1:] == (
        {
            "content-type": "application/json",
            "x-content-type-options": "nosniff",
            "content-length": "116",
            "connection": "close",
        },
        error(
            "bad_request", "malformed HTTP request: the request line or headers could not be parsed"
        ),
    )
    assert closed
    assert [(entry["key"], entry["value"]) for entry in entries(server)] == [("k", "v")]


# --- item 6: a client gone mid-body is a 499 at INFO, never a 500 ---------------------------


def request_series(server: LiveServer) -> dict[tuple[str, ...], float]:
    text = httpx.get(f"{server.url}/metrics").text
    found = {}
    for family in text_string_to_metric_families(text):
        for name, labels, value, *_ in family.samples:
            if name == "kvmem_errors_total" or (
                name == "kvmem_http_requests_total" and labels["route"] != "/metrics"
            ):
                found[(name, *labels.values())] = value
    return found


def test_item6_a_client_gone_mid_body_is_499_at_info(
    make_server: MakeServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    server = make_server()
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(
            b"PUT /memory/k HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"value": '
        )
        time.sleep(0.3)  # the handler is now reading the body
    deadline = time.monotonic() + 10
    while ("kvmem_http_requests_total", "/memory/{key}", "PUT", "499") not in request_series(
        server
    ):
        assert time.monotonic() < deadline, request_series(server)
        time.sleep(0.05)
    assert request_series(server) == {
        ("kvmem_http_requests_total", "/memory/{key}", "PUT", "499"): 1,
        ("kvmem_errors_total", "client_gone"): 1,
    }
    kvmem = [
        (r.levelname, r.getMessage(), r.exc_info is not None)
        for r in caplog.records
        if r.name.startswith("kvmem") and r.name != "kvmem.access"  # the request log aside
    ]
    assert kvmem == [("INFO", "client gone before its request was read: PUT /memory/k", False)]
    assert entries(server) == []


# --- the protocol's refusals are in the error shape of the path's API ------------------------

HEAD_OVER = f"the request line and headers are over the limit of {HEAD_LIMIT} bytes"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/chat", {"error": HEAD_OVER}),  # Ollama's clients read a string
        (
            "/v1/chat/completions",
            {
                "error": {
                    "code": "headers_too_large",
                    "message": HEAD_OVER,
                    "type": "invalid_request_error",
                    "param": None,
                }
            },
        ),
        ("/memory/k", error("headers_too_large", HEAD_OVER)),
    ],
    ids=["ollama", "openai", "kvmem"],
)
def test_an_oversized_head_is_refused_in_the_error_shape_of_its_path(
    make_server: MakeServer, path: str, body: dict[str, Any]
) -> None:
    server = make_server(server={"max_header_bytes": HEAD_LIMIT})
    request = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"X-Big: {'a' * HEAD_LIMIT}\r\nContent-Length: 2\r\n\r\n{{}}"
    ).encode()
    answer, closed, _ = converse(server.port, request)
    assert answers(answer) == [
        (
            "HTTP/1.1 431 Request Header Fields Too Large",
            {
                "content-type": "application/json",
                "x-content-type-options": "nosniff",
                "content-length": str(len(json.dumps(body, separators=(",", ":")))),
                "connection": "close",
            },
            body,
        )
    ]
    assert closed
    assert entries(server) == []


def test_an_oversized_head_is_refused_while_it_is_still_arriving(make_server: MakeServer) -> None:
    """A head past `max_header_bytes` is refused as the bytes come, not once it ends: the
    client here never ends its head (no blank line), yet is answered 431 and closed at once,
    long before the head timeout; nothing more than the bound is held meanwhile."""
    server = make_server(server={"max_header_bytes": HEAD_LIMIT, "header_timeout_seconds": 30})
    unfinished = f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: {'a' * 4 * HEAD_LIMIT}"
    answer, closed, took = converse(server.port, unfinished.encode(), wait=5)
    assert answers(answer) == [
        (
            "HTTP/1.1 431 Request Header Fields Too Large",
            {
                "content-type": "application/json",
                "x-content-type-options": "nosniff",
                "content-length": str(
                    len(json.dumps(error("headers_too_large", HEAD_OVER), separators=(",", ":")))
                ),
                "connection": "close",
            },
            error("headers_too_large", HEAD_OVER),
        )
    ]
    assert closed and took < 5
