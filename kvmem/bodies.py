"""Request bodies: read within `server.max_body_bytes` and `server.body_timeout_seconds`,
parsed as JSON, validated by pydantic."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, StrictBool, StrictStr, ValidationError
from starlette.requests import Request

from kvmem.errors import BadRequest, BodyTooLarge, RequestTimeout, describe_problems

Body = TypeVar("Body", bound=BaseModel)


class RequestBody(BaseModel):
    """A JSON request body: unknown fields are refused, types are not coerced."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class MemoryValue(RequestBody):
    """`PUT /memory/{key}`."""

    value: StrictStr


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


# A `\uD800`-`\uDFFF` escape: JSON allows it, but a lone one is no character at all.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def parse_json(raw: bytes) -> Any:
    """`raw` decoded as UTF-8 JSON, or `BadRequest` saying what is wrong."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise BadRequest(f"the body is not valid UTF-8 (byte {exc.start})") from exc
    except RecursionError as exc:
        raise BadRequest("the JSON body is nested too deeply") from exc
    except json.JSONDecodeError as exc:
        raise BadRequest(f"malformed JSON body: {exc.msg} at line {exc.lineno} column {exc.colno}") from exc
    except ValueError as exc:  # Python refuses to convert an integer of over 4,300 digits
        raise BadRequest(
            f"the JSON body holds an integer of more than {sys.get_int_max_str_digits()} digits"
        ) from exc
    if _SURROGATE_ESCAPE.search(raw):
        try:  # pairs decode to real characters; a lone surrogate cannot be encoded
            json.dumps(data, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as exc:
            raise BadRequest("the JSON body holds a lone surrogate escape (\\uD800-\\uDFFF)") from exc
    return data


def validate(model: type[Body], data: Any) -> Body:
    """`data` as `model`, or `BadRequest` naming each wrong field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise BadRequest(f"invalid request body: {describe_problems(exc, 'body')}") from exc


async def read_model(request: Request, model: type[Body], max_bytes: int) -> Body:
    """Read, parse and validate a JSON body in one step."""
    return validate(model, parse_json(await read_body(request, max_bytes)))
