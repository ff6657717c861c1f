"""`python -m tests.bench.passthrough --port P --upstream URL`: the bare Starlette + httpx
pass-through that issue 43 measures kvmem against: `POST /v1/chat/completions` forwarded to
`URL/v1/chat/completions` as is (body and the Authorization header), the answer streamed back
as it comes. No memory, no checks, no logging: what any proxy in front of an upstream costs.
Served by uvicorn with httptools and uvloop, access log off; `GET /healthz` answers 200."""

from __future__ import annotations

import argparse
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route


def build(upstream: str) -> Starlette:
    """The pass-through app in front of `upstream` (a base URL)."""
    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
        async with httpx.AsyncClient(base_url=upstream, limits=limits, timeout=60) as client:
            state["client"] = client
            yield

    async def chat(request: Request) -> Response:
        client: httpx.AsyncClient = state["client"]
        headers = {"content-type": "application/json"}
        if "authorization" in request.headers:
            headers["authorization"] = request.headers["authorization"]
        outgoing = client.build_request(
            "POST", "/v1/chat/completions", content=await request.body(), headers=headers
        )
        answer = await client.send(outgoing, stream=True)
        return StreamingResponse(
            answer.aiter_raw(),
            status_code=answer.status_code,
            media_type=answer.headers.get("content-type"),
            background=BackgroundTask(answer.aclose),
        )

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/healthz", healthz),
        ],
        lifespan=lifespan,
    )


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.passthrough")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="the upstream's base URL")
    args = parser.parse_args()
    uvicorn.run(
        build(args.upstream),
        host="127.0.0.1",
        port=args.port,
        http="httptools",
        loop="uvloop",
        access_log=False,
        log_level="warning",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
