"""Section 5: the memory agent's bound, against an instance whose agent model never answers.

For each request the client notes `time.monotonic()` when the main response completed; the
upstream notes when that request's agent call was disconnected (kvmem cancelling it). Both
read CLOCK_MONOTONIC, which all processes of a Linux machine share.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import aiohttp

from tests.bench.load import (
    JSON_HEADERS,
    chat_body,
    ms,
    percentile,
    run_workers,
    session,
)
from tests.bench.servers import MAIN_MODEL, Server, upstream_hangs

SLACK = 0.100  # the bound: cancelled within grace + 100 ms


async def measure(
    kvmem: Server, upstream: Server, *, requests: int, concurrency: int, grace: float
) -> dict[str, Any]:
    """The time from main response end to agent cancellation, over `requests` requests."""
    await asyncio.to_thread(upstream_hangs, upstream, True)
    run = os.urandom(3).hex()
    tags = [f"bench-tag-{run}{index:04x}" for index in range(requests)]
    ended: dict[str, float] = {}
    errors: list[str] = []
    url = f"{kvmem.url}/v1/chat/completions"
    queue = list(reversed(tags))

    async with session(concurrency) as client:

        async def worker(_: int) -> None:
            while queue:
                tag = queue.pop()
                try:
                    async with client.post(
                        url, data=chat_body(MAIN_MODEL, tag=tag), headers=JSON_HEADERS
                    ) as response:
                        body = await response.read()
                        ended[tag] = time.monotonic()  # the main response is complete
                        if response.status != 200:
                            errors.append(f"{response.status}: {body[:200]!r}")
                except (TimeoutError, aiohttp.ClientError) as exc:
                    errors.append(f"{type(exc).__name__}: {exc}")

        await run_workers(concurrency, worker, seconds=60 + requests)

    # Wait (bounded) until every agent call was cut off, or clearly will not be.
    deadline = time.monotonic() + grace + 10
    hangs: dict[str, dict[str, float | None]] = {}
    while time.monotonic() < deadline:
        hangs = await asyncio.to_thread(upstream_hangs, upstream)
        if all((hangs.get(tag) or {}).get("disconnected") for tag in ended):
            break
        await asyncio.sleep(0.2)

    deltas = []
    missing = []
    for tag, end in ended.items():
        cut = (hangs.get(tag) or {}).get("disconnected")
        if cut is None:
            missing.append(tag)
        else:
            deltas.append(cut - end)
    worst = max(deltas) if deltas else float("nan")
    return {
        "requests": requests,
        "completed": len(ended),
        "concurrency": concurrency,
        "grace_seconds": grace,
        "bound_ms": ms(grace + SLACK),
        "max_ms": ms(worst),
        "p50_ms": ms(percentile(deltas, 50)),
        "p99_ms": ms(percentile(deltas, 99)),
        "min_ms": ms(min(deltas)) if deltas else float("nan"),
        "never_cancelled": len(missing),
        "main_errors": len(errors),
        "error_samples": errors[:3],
        "within_bound": bool(deltas)
        and not missing
        and not errors
        and len(ended) == requests
        and worst <= grace + SLACK,
    }
