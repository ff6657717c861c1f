"""What `kvmem serve` writes to stderr: one line per request (`log_request`, logger
`kvmem.access`), kvmem's own records (clients gone, runs cut off, sweeps) and uvicorn's, as
text for people or as one JSON object a line for log pipelines (`server.log_format`).

`configure_logging` is called by `kvmem serve` alone: an app that tests build, or that another
program mounts, logs through whatever that program set up (`log_request` writes nothing
while `kvmem.access` is not enabled for INFO, Python's default). Nothing here knows routes,
users or the store; a request line holds no header and no body.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

from starlette.types import Scope

ACCESS = logging.getLogger("kvmem.access")
# The loggers `configure_logging` sets: kvmem's, and uvicorn's with the two it logs through.
LOGGERS = ("kvmem", "uvicorn", "uvicorn.error", "uvicorn.asgi")
# A request target longer than this is cut in the log line (the head is bounded anyway).
MAX_TARGET_CHARS = 2000
LogFormat = Literal["text", "json"]


def log_request(scope: Scope, status: int, seconds: float) -> None:
    """One `kvmem.access` line for a request whose response has ended (a stream included;
    `MetricsMiddleware` calls it): `client "METHOD target" status duration`, the same fields
    as the record's `fields` for the JSON format. Nothing while the logger is off for INFO."""
    if not ACCESS.isEnabledFor(logging.INFO):
        return
    client = scope.get("client")
    fields = {
        "client": client[0] if client else "-",
        "method": printable(scope["method"]),
        "target": request_target(scope),
        "status": status,
        "duration_ms": round(seconds * 1000, 1),
    }
    ACCESS.info(
        '%s "%s %s" %d %.1f ms',
        fields["client"],
        fields["method"],
        fields["target"],
        status,
        fields["duration_ms"],
        extra={"fields": fields},
    )


def request_target(scope: Scope) -> str:
    """The path and query as the client sent them (still percent-encoded), printable."""
    raw = scope.get("raw_path") or scope["path"].encode("utf-8")
    query = scope.get("query_string") or b""
    target = raw + b"?" + query if query else raw
    text = printable(target.decode("latin-1"))
    if len(text) > MAX_TARGET_CHARS:
        text = text[:MAX_TARGET_CHARS] + "..."
    return text


def printable(text: str) -> str:
    """`text` with anything outside printable ASCII, and `"` and `\\`, as `\\xNN` escapes: a
    client's request line can neither end a log line nor forge another."""
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return text
    return "".join(
        char if " " <= char <= "~" and char not in '"\\' else f"\\x{ord(char):02x}" for char in text
    )


def timestamp(record: logging.LogRecord) -> str:
    """The record's time in ISO 8601 UTC, to the millisecond."""
    moment = datetime.fromtimestamp(record.created, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class TextFormatter(logging.Formatter):
    """`2026-12-05T04:30:01.123Z INFO kvmem.access: 10.0.0.2 "GET /memory" 200 1.2 ms`."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{timestamp(record)} {record.levelname} {record.name}: {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object a line: `time`, `level`, `logger`, `message`, a request's fields, and
    `exception` (its traceback) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": timestamp(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(getattr(record, "fields", {}))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=True, default=str)


def configure_logging(log_format: LogFormat, stream: TextIO | None = None) -> None:
    """Send every record to `stream` (stderr) in `log_format`: kvmem's and uvicorn's from INFO
    up, other libraries' from WARNING up. uvicorn's own access line is left off (kvmem's
    request line replaces it: `uvicorn.run(..., access_log=False)`)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    for name in LOGGERS:
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
        # kvmem's and uvicorn's INFO; uvicorn's own loggers below follow `uvicorn` (a uvicorn
        # run earlier in the process may have given them handlers and levels of its own).
        logger.setLevel(logging.INFO if "." not in name else logging.NOTSET)
