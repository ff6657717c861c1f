"""The paging query parameters of the list routes (`/memory/history`,
`/memory/{key}/history`, `/conversations`): `limit` and `before`, read and checked alike
everywhere (a bad value is a 400 naming the parameter)."""

from __future__ import annotations

from starlette.requests import Request

from kvmem.errors import BadRequest

DEFAULT_LIMIT, MAX_LIMIT = 50, 500
MAX_ID = 2**63 - 1


def int_param(request: Request, name: str, default: int | None, low: int, high: int) -> int | None:
    """The query parameter `name` as an integer from `low` to `high` (`default` if absent)."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not raw.isascii() or not raw.isdigit() or len(raw) > 19:
        raise BadRequest(f"{name} must be an integer from {low} to {high}, not {raw[:40]!r}")
    value = int(raw)
    if not low <= value <= high:
        raise BadRequest(f"{name} must be an integer from {low} to {high}, not {value}")
    return value


def limit_param(request: Request) -> int:
    """`limit`: how many items a page holds (default 50, from 1 to 500)."""
    limit = int_param(request, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
    assert limit is not None
    return limit
