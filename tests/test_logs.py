"""`kvmem serve`'s log: one line per request and kvmem's own INFO lines on stderr, as text or
as one JSON object a line (`server.log_format`); a request line can never be forged."""

from __future__ import annotations

import io
import json
import logging
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from kvmem.server.logs import (
    ACCESS,
    LOGGERS,
    JsonFormatter,
    TextFormatter,
    configure_logging,
    printable,
    request_target,
)
from tests.support.processes import ServeProcess

STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"


@pytest.fixture
def restored_logging() -> Iterator[None]:
    """Put back what configure_logging changes, so no other test sees its handler."""
    root = logging.getLogger()
    saved = [(root, root.handlers[:], root.level, root.propagate)]
    for name in LOGGERS:
        logger = logging.getLogger(name)
        saved.append((logger, logger.handlers[:], logger.level, logger.propagate))
    yield
    for logger, handlers, level, propagate in saved:
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate = propagate


def record(message: str, *args: Any, name: str = "kvmem", **extra: Any) -> logging.LogRecord:
    made = logging.LogRecord(name, logging.INFO, __file__, 1, message, args, None)
    made.created = 1796444401.25  # 2026-12-05T04:20:01.250Z
    for key, value in extra.items():
        setattr(made, key, value)
    return made


def test_a_request_target_is_printable_and_cannot_end_the_line() -> None:
    scope = {"path": "/memory/a\nb", "raw_path": b'/memory/a\nb"\\\xff', "query_string": b"x=%0A"}
    assert request_target(scope) == "/memory/a\\x0ab\\x22\\x5c\\xff?x=%0A"
    assert request_target({"path": "/memory", "query_string": b""}) == "/memory"
    assert printable("GET") == "GET"
    long = {"path": "/", "raw_path": b"/" + b"a" * 3000, "query_string": b""}
    assert request_target(long) == "/" + "a" * 1999 + "..."


def test_the_text_format() -> None:
    line = TextFormatter().format(record("history sweep deleted %d expired changes", 3))
    assert line == "2026-12-05T04:20:01.250Z INFO kvmem: history sweep deleted 3 expired changes"


def test_the_json_format_is_one_object_a_line_with_a_requests_fields() -> None:
    fields = {"client": "10.0.0.2", "method": "GET", "target": "/memory", "status": 200}
    made = record('%s "%s %s" %d', "10.0.0.2", "GET", "/memory\n", 200, fields=fields)
    line = JsonFormatter().format(made)
    assert "\n" not in line
    assert json.loads(line) == {
        "time": "2026-12-05T04:20:01.250Z",
        "level": "INFO",
        "logger": "kvmem",
        "message": '10.0.0.2 "GET /memory\n" 200',
        **fields,
    }
    try:
        raise ValueError("boom")
    except ValueError:
        failed = record("unhandled error")
        failed.exc_info = sys.exc_info()
    entry = json.loads(JsonFormatter().format(failed))
    assert entry["exception"].startswith("Traceback") and "ValueError: boom" in entry["exception"]


def test_the_app_logs_one_line_per_request_once_it_has_ended(
    make_client: Callable[..., TestClient], caplog: pytest.LogCaptureFixture
) -> None:
    client = make_client()
    with caplog.at_level(logging.INFO, "kvmem.access"):
        assert client.put("/memory/likes", json={"value": "tea"}).status_code == 201
        assert client.get("/memory/missing?x=1").status_code == 404
        assert client.get("/nowhere").status_code == 404
    lines = [r for r in caplog.records if r.name == "kvmem.access"]
    assert [r.getMessage().split(" ", 1)[1].rsplit(" ", 2)[0] for r in lines] == [
        '"PUT /memory/likes" 201',
        '"GET /memory/missing?x=1" 404',
        '"GET /nowhere" 404',
    ]
    fields = [r.fields for r in lines]  # type: ignore[attr-defined]
    assert [(f["client"], f["method"], f["target"], f["status"]) for f in fields] == [
        ("testclient", "PUT", "/memory/likes", 201),
        ("testclient", "GET", "/memory/missing?x=1", 404),
        ("testclient", "GET", "/nowhere", 404),
    ]
    assert all(isinstance(f["duration_ms"], float) and f["duration_ms"] >= 0 for f in fields)


def test_the_app_logs_nothing_while_the_request_logger_is_off(
    make_client: Callable[..., TestClient], caplog: pytest.LogCaptureFixture
) -> None:
    client = make_client()
    with caplog.at_level(logging.WARNING):
        assert client.get("/memory").status_code == 200
    assert not ACCESS.isEnabledFor(logging.INFO)
    assert [r for r in caplog.records if r.name == "kvmem.access"] == []


def test_configure_logging_sends_kvmem_and_uvicorn_info_but_only_library_warnings(
    restored_logging: None,
) -> None:
    # As a uvicorn run earlier in the process leaves them (test_metrics runs some).
    logging.getLogger("uvicorn.error").propagate = False
    logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
    stream = io.StringIO()
    configure_logging("json", stream)
    logging.getLogger("kvmem.retention").info("history sweep deleted %d expired changes", 2)
    logging.getLogger("uvicorn.error").info("Started server process")
    logging.getLogger("sqlalchemy.engine").info("a library's chatter")
    logging.getLogger("sqlalchemy.engine").warning("a library's warning")
    entries = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(e["logger"], e["level"], e["message"]) for e in entries] == [
        ("kvmem.retention", "INFO", "history sweep deleted 2 expired changes"),
        ("uvicorn.error", "INFO", "Started server process"),
        ("sqlalchemy.engine", "WARNING", "a library's warning"),
    ]


def leave_mid_body(port: int) -> None:
    """Send a PUT whose body never arrives whole, then hang up: the client is gone."""
    with socket.create_connection(("127.0.0.1", port)) as connection:
        connection.sendall(
            b"PUT /memory/likes HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"va'
        )
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.parametrize("log_format", ["text", "json"])
def test_serve_writes_request_lines_and_its_own_info_lines_to_stderr(
    tmp_path: Path, log_format: str
) -> None:
    server = ServeProcess(
        tmp_path,
        {"server": {"log_format": log_format}, "database": {"url": "sqlite:///kv.db"}},
    ).start()
    try:
        with httpx.Client(base_url=server.url) as http:
            assert http.put("/memory/likes", json={"value": "tea"}).status_code == 201
            assert http.get("/memory/nothing_here").status_code == 404
        leave_mid_body(server.port)
        deadline = time.monotonic() + 10
        while "client gone" not in server.log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        server.stop()
    lines = server.log.read_text().splitlines()
    if log_format == "json":
        entries = [json.loads(line) for line in lines]  # every line is one JSON object
        requests = [
            (e["method"], e["target"], e["status"])
            for e in entries
            if e["logger"] == "kvmem.access"
        ]
        kvmem_info = [e["message"] for e in entries if e["logger"] == "kvmem"]
    else:
        access = [line.split(" INFO kvmem.access: ", 1) for line in lines]
        requests = []
        for parts in access:
            if len(parts) == 2:
                request, status = parts[1].split('" ')[0].split(' "')[1], parts[1].split('" ')[1]
                method, target = request.split(" ")
                requests.append((method, target, int(status.split(" ")[0])))
        kvmem_info = [
            line.split(" INFO kvmem: ", 1)[1] for line in lines if " INFO kvmem: " in line
        ]
        assert all(line[:24].endswith("Z") for line in lines), lines
    # /healthz is polled until the server is up; then one line per request, in order.
    polled = [r for r in requests if r[1] == "/healthz"]
    assert polled and all(r == ("GET", "/healthz", 200) for r in polled)
    assert [r for r in requests if r[1] != "/healthz"] == [
        ("PUT", "/memory/likes", 201),
        ("GET", "/memory/nothing_here", 404),
        ("PUT", "/memory/likes", 499),
    ]
    assert kvmem_info[1] == f"the memory page is at {server.url}/ui"
    assert "client gone before its request was read: PUT /memory/likes" in kvmem_info
