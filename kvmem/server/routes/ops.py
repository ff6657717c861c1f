"""Operating kvmem: `GET /metrics` (Prometheus) and `GET /usage` (what the agent cost a user)."""

from __future__ import annotations

import re

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from kvmem.agent.usage import DEFAULT_DAYS, MAX_DAYS
from kvmem.entries import utcnow
from kvmem.errors import BadRequest, Forbidden
from kvmem.metrics import CONTENT_TYPE
from kvmem.server.routes import route
from kvmem.server.services import services_of, user_of

DAYS = re.compile(r"[0-9]{1,3}")


async def metrics(request: Request) -> Response:
    """The app's metrics. `keys` mode: a service key only (a user's key is 403; a missing or
    wrong key 401), since the numbers are about every user of the server."""
    services = services_of(request)
    auth = services.auth
    if auth.mode == "keys" and not auth.holds_service_key(request.headers):
        await user_of(request)  # 401 for missing or wrong credentials
        raise Forbidden("/metrics needs a service key; a user's key cannot read it")
    # A few milliseconds of CPU even for thousands of series (see tests/bench/metrics_scrape.py).
    return Response(services.metrics.render(), media_type=CONTENT_TYPE)


async def usage(request: Request) -> Response:
    """This user's agent usage per UTC day over the last `days` days (default 30, max 366)."""
    services = services_of(request)
    user_id = await user_of(request)
    days = _days(request.query_params.get("days"))
    report = await run_in_threadpool(services.usage.daily, user_id, days, utcnow())
    return JSONResponse(report.as_json())


def _days(raw: str | None) -> int:
    if raw is None:
        return DEFAULT_DAYS
    if not DAYS.fullmatch(raw) or not 1 <= int(raw) <= MAX_DAYS:
        raise BadRequest(f"days must be a whole number from 1 to {MAX_DAYS}", param="days")
    return int(raw)


routes = [route("/metrics", GET=metrics), route("/usage", GET=usage)]
