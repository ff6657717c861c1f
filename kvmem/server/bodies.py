"""Request bodies: read within `server.max_body_bytes` and `server.body_timeout_seconds`,
parsed as JSON, validated by pydantic."""

from __future__ import annotations

import asyncio
import json
import math
import re
import sys
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr, ValidationError
from starlette.requests import Request

from kvmem.errors import BadRequest, BodyTooLarge, RequestTimeout, describe_problems

Body = TypeVar("Body", bound=BaseModel)


class RequestBody(BaseModel):
    """A JSON request body: unknown fields are refused, types are not coerced."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class MemoryValue(RequestBody):
    """`PUT /memory/{key}`: the value, and when it expires (at most one of the two; neither:
    never)."""

    value: StrictStr
    expires_at: StrictStr | None = None
    expires_in: StrictInt | StrictStr | None = None


class Preferences(RequestBody):
    """`PATCH /preferences`: either switch, or both."""

    memories: StrictBool | None = None
    review: StrictBool | None = None


async def read_body(request: Request, max_bytes: int, timeout: float | None = None) -> bytes:
    """The raw body, refused with 413 as soon as it passes `max_bytes` (never read whole), and
    with 408 unless all of it arrives within `timeout` seconds.

    `timeout` defaults to the app's `server.body_timeout_seconds`, so that every route that
    reads a body is bounded without passing it: a client dribbling a byte a second would
    otherwise hold a connection and a task for as long as it likes.
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise BodyTooLarge(f"the request body is {declared} bytes; the limit is {max_bytes}")
    if timeout is None:
        timeout = _configured_body_timeout(request)
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout):
            async for chunk in request.stream():
                size += len(chunk)
                if size > max_bytes:
                    raise BodyTooLarge(f"the request body is over the limit of {max_bytes} bytes")
                chunks.append(chunk)
    except TimeoutError as exc:
        raise RequestTimeout(
            f"the request body did not arrive within {timeout:g} s (server.body_timeout_seconds)"
        ) from exc
    return b"".join(chunks)


def _configured_body_timeout(request: Request) -> float | None:
    services = getattr(request.state, "services", None)
    return services.config.server.body_timeout_seconds if services is not None else None


# The integers a JSON body may hold: SQLite and PostgreSQL store signed 64-bit integers, and
# an upstream or client on the other side may not take more either.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class _BadNumber(ValueError):
    """A number JSON bodies may not hold (raised from inside `json.loads`)."""


def _refuse_constant(name: str) -> Any:
    raise _BadNumber(f"the JSON body holds {name}, which is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 parses to infinity
        raise _BadNumber(f"the JSON body holds a number out of range ({text[:40]})")
    return value


def _int64(text: str) -> int:
    value = int(text)
    if not INT64_MIN <= value <= INT64_MAX:
        raise _BadNumber(
            f"the JSON body holds an integer outside the signed 64-bit range ({text[:40]})"
        )
    return value


def _loads(text: str) -> Any:
    """`json.loads` refusing `NaN`, `Infinity`, `-Infinity`, floats that overflow and
    integers outside signed 64 bits (`_BadNumber`)."""
    return json.loads(
        text, parse_constant=_refuse_constant, parse_float=_finite_float, parse_int=_int64
    )


def check_numbers(raw: bytes) -> None:
    """`BadRequest` if `raw`, when it is JSON at all, holds a number JSON bodies may not hold
    (for a body another parser reads: /mcp's); malformed JSON is left to that parser."""
    try:
        _loads(raw.decode("utf-8"))
    except _BadNumber as exc:
        raise BadRequest(str(exc)) from exc
    except (ValueError, RecursionError):
        return


# A `\uD800`-`\uDFFF` escape: JSON allows it, but a lone one is no character at all.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def parse_json(raw: bytes) -> Any:
    """`raw` decoded as UTF-8 JSON, or `BadRequest` saying what is wrong (also for `NaN`,
    `Infinity` and integers outside signed 64 bits: the one check of every body's numbers)."""
    try:
        data = _loads(raw.decode("utf-8"))
    except _BadNumber as exc:
        raise BadRequest(str(exc)) from exc
    except UnicodeDecodeError as exc:
        raise BadRequest(f"the body is not valid UTF-8 (byte {exc.start})") from exc
    except RecursionError as exc:
        raise BadRequest("the JSON body is nested too deeply") from exc
    except json.JSONDecodeError as exc:
        raise BadRequest(
            f"malformed JSON body: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from exc
    except ValueError as exc:  # Python refuses to convert an integer of over 4,300 digits
        raise BadRequest(
            f"the JSON body holds an integer of more than {sys.get_int_max_str_digits()} digits"
        ) from exc
    if _SURROGATE_ESCAPE.search(raw):
        try:  # pairs decode to real characters; a lone surrogate cannot be encoded
            json.dumps(data, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as exc:
            raise BadRequest(
                "the JSON body holds a lone surrogate escape (\\uD800-\\uDFFF)"
            ) from exc
    return data


def validate(model: type[Body], data: Any) -> Body:
    """`data` as `model`, or `BadRequest` naming each wrong field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise BadRequest(f"invalid request body: {describe_problems(exc, 'body')}") from exc


async def read_model(
    request: Request, model: type[Body], max_bytes: int, *, optional: bool = False
) -> Body:
    """Read, parse and validate a JSON body in one step: the one way a route reads a body
    into a pydantic model. With `optional`, a blank body reads as `{}` (every field's default).
    """
    raw = await read_body(request, max_bytes)
    return validate(model, {} if optional and not raw.strip() else parse_json(raw))
