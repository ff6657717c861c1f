"""Request bodies: read within `server.max_body_bytes`, parsed as JSON, validated by pydantic."""

from __future__ import annotations

import json
import re
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, StrictBool, StrictStr, ValidationError
from starlette.requests import Request

from kvmem.errors import BadRequest, BodyTooLarge

Body = TypeVar("Body", bound=BaseModel)


class RequestBody(BaseModel):
    """A JSON request body: unknown fields are refused, types are not coerced."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class MemoryValue(RequestBody):
    """`PUT /memory/{key}`."""

    value: StrictStr


class Preferences(RequestBody):
    """`PATCH /preferences`."""

    memories: StrictBool


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The raw body, refused with 413 as soon as it passes `max_bytes` (never read whole)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise BodyTooLarge(f"the request body is {declared} bytes; the limit is {max_bytes}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise BodyTooLarge(f"the request body is over the limit of {max_bytes} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


# A `\uD800`-`\uDFFF` escape: JSON allows it, but a lone one is no character at all.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
MAX_PROBLEMS = 5


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
        errors = exc.errors(include_url=False)
        problems = "; ".join(
            f"{'.'.join(str(p) for p in error['loc'])[:100] or 'body'}: {error['msg']}"
            for error in errors[:MAX_PROBLEMS]
        )
        if len(errors) > MAX_PROBLEMS:
            problems += f"; and {len(errors) - MAX_PROBLEMS} more"
        raise BadRequest(f"invalid request body: {problems}") from exc


async def read_model(request: Request, model: type[Body], max_bytes: int) -> Body:
    """Read, parse and validate a JSON body in one step."""
    return validate(model, parse_json(await read_body(request, max_bytes)))
