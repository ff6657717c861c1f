"""Section 4: memory writes through the REST API, one writer and many at once."""

from __future__ import annotations

import json
import time
from typing import Any

import aiohttp

from tests.bench.load import (
    JSON_HEADERS,
    ms,
    percentile,
    run_workers,
    session,
    summary_ms,
)

KEYS_PER_WRITER = 10  # each writer cycles over its own keys: creates first, then replaces


async def measure(base_url: str, writers: int, per_writer: int, seconds: float) -> dict[str, Any]:
    """PUT /memory/{key} from `writers` concurrent writers, `per_writer` PUTs each, each
    writer sending its next PUT as soon as the previous one is answered."""
    latencies: list[float] = []
    errors = 0
    samples: list[str] = []
    async with session(writers) as client:

        async def writer(number: int) -> None:
            nonlocal errors
            for index in range(per_writer):
                key = f"bench_w{number:02d}_{index % KEYS_PER_WRITER}"
                body = json.dumps({"value": f"Writer {number} wrote value {index}."}).encode()
                started = time.perf_counter()
                try:
                    async with client.put(f"{base_url}/memory/{key}", data=body,
                                          headers=JSON_HEADERS) as response:
                        payload = await response.read()
                        status = response.status
                except (TimeoutError, aiohttp.ClientError) as exc:
                    status, payload = 0, f"{type(exc).__name__}: {exc}".encode()
                if status in (200, 201):
                    latencies.append(time.perf_counter() - started)
                    continue
                errors += 1
                if len(samples) < 3:
                    samples.append(f"{status}: {payload[:200]!r}")

        started = time.perf_counter()
        await run_workers(writers, writer, seconds=seconds)
        wall = time.perf_counter() - started
    row: dict[str, Any] = summary_ms(latencies)
    row.update(
        writers=writers,
        puts_per_s=round(len(latencies) / wall, 1) if wall else None,
        p90_ms=ms(percentile(latencies, 90)),
        errors=errors,
        error_samples=samples,
    )
    return row
