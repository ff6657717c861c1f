"""The client side: aiohttp requests timed one by one, in bounded batches, and their statistics.

Every batch is bounded twice: by a request count and by a deadline.
"""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

JSON_HEADERS = {"Content-Type": "application/json"}
SYSTEM_PROMPT = "You are a helpful assistant."
QUESTION = "What should I cook tonight? Something quick, please."


def session(concurrency: int) -> aiohttp.ClientSession:
    """A keep-alive client session able to hold `concurrency` connections to one server.

    It drops a connection idle 2 s, before any server here closes it (uvicorn's and kvmem's
    keep-alive is 5 s): a request sent on a connection just as its server closes it fails
    ("Server disconnected"), and while the other targets of a loaded run took their turn,
    a whole round's connections once went idle ~5 s and 18 requests to the upstream failed."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(
            limit=max(concurrency, 1) + 8, ttl_dns_cache=None, keepalive_timeout=2.0
        ),
        timeout=aiohttp.ClientTimeout(total=60),
    )


def chat_body(model: str, *, stream: bool = False, tag: str | None = None) -> bytes:
    """The request every target gets: a system prompt and one user message."""
    question = f"{QUESTION} ({tag})" if tag else QUESTION
    body: dict[str, Any] = {
        "model": model,
        "messages": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": question},
        ],
    }
    if stream:
        body["stream"] = True
    return json.dumps(body).encode()


@dataclass
class Batch:
    """What one batch measured: seconds per successful request, failures, wall time."""

    latencies: list[float] = field(default_factory=list)
    first_bytes: list[float] = field(default_factory=list)  # streaming only
    errors: int = 0
    wall: float = 0.0
    error_samples: list[str] = field(default_factory=list)

    def note_error(self, message: str) -> None:
        """Count a failed request, keeping the first few messages."""
        self.errors += 1
        if len(self.error_samples) < 3:
            self.error_samples.append(message[:300])


async def post_once(client: aiohttp.ClientSession, url: str, body: bytes, batch: Batch) -> None:
    """One non-streamed POST; its latency (to the last byte of the body) goes into `batch`."""
    started = time.perf_counter()
    try:
        async with client.post(url, data=body, headers=JSON_HEADERS) as response:
            payload = await response.read()
            status = response.status
    except (TimeoutError, aiohttp.ClientError) as exc:
        batch.note_error(f"{type(exc).__name__}: {exc}")
        return
    elapsed = time.perf_counter() - started
    if status == 200 and b"chat.completion" in payload:
        batch.latencies.append(elapsed)
    else:
        batch.note_error(f"{status}: {payload[:200]!r}")


async def stream_once(
    client: aiohttp.ClientSession, url: str, body: bytes, batch: Batch, end: bytes = b"[DONE]"
) -> None:
    """One streamed POST: time to the first body byte and to the end of the stream, which
    must close with `end` (`[DONE]` for SSE; Ollama's NDJSON ends on a `"done":true` line)."""
    started = time.perf_counter()
    first: float | None = None
    tail = b""
    try:
        async with client.post(url, data=body, headers=JSON_HEADERS) as response:
            if response.status != 200:
                batch.note_error(f"{response.status}: {(await response.read())[:200]!r}")
                return
            async for piece in response.content.iter_any():
                if first is None:
                    first = time.perf_counter()
                tail = (tail + piece)[-200:]
    except (TimeoutError, aiohttp.ClientError) as exc:
        batch.note_error(f"{type(exc).__name__}: {exc}")
        return
    ended = time.perf_counter()
    if first is None or end not in tail:
        batch.note_error(f"stream ended without {end!r}: {tail!r}")
        return
    batch.first_bytes.append(first - started)
    batch.latencies.append(ended - started)


async def seed(base_url: str, items: Sequence[tuple[str, str]]) -> None:
    """Give the (local) user these memory entries through the REST API."""
    async with session(1) as client:
        for key, value in items:
            body = json.dumps({"value": value}).encode()
            async with client.put(
                f"{base_url}/memory/{key}", data=body, headers=JSON_HEADERS
            ) as response:
                if response.status not in (200, 201):
                    raise RuntimeError(
                        f"{base_url}: PUT /memory/{key} answered "
                        f"{response.status}: {await response.text()}"
                    )


async def run_batch(
    client: aiohttp.ClientSession,
    url: str,
    body: bytes,
    *,
    requests: int,
    concurrency: int,
    seconds: float,
    stream: bool = False,
) -> Batch:
    """`requests` requests with `concurrency` in flight, stopping early after `seconds`."""
    batch = Batch()
    once = stream_once if stream else post_once
    issued = 0
    started = time.perf_counter()
    deadline = started + seconds

    async def worker() -> None:
        nonlocal issued
        while issued < requests and time.perf_counter() < deadline:
            issued += 1
            await once(client, url, body, batch)

    await asyncio.gather(*(worker() for _ in range(max(1, min(concurrency, requests)))))
    batch.wall = time.perf_counter() - started
    return batch


async def run_workers(count: int, work: Callable[[int], Any], *, seconds: float) -> None:
    """Run `work(i)` for i in range(count) as concurrent tasks, cancelled after `seconds`."""
    tasks = [asyncio.ensure_future(work(i)) for i in range(count)]
    try:
        async with asyncio.timeout(seconds):
            await asyncio.gather(*tasks)
    except TimeoutError:
        pass
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def percentile(values: Sequence[float], q: float) -> float:
    """The `q`-th percentile (0-100) with linear interpolation; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def ms(seconds: float) -> float:
    """Seconds to milliseconds, rounded to 3 decimals (NaN stays NaN)."""
    return round(seconds * 1000, 3) if not math.isnan(seconds) else math.nan


def summary_ms(values: Sequence[float]) -> dict[str, float]:
    """n, p50, p99, mean and max of `values` (seconds), in milliseconds."""
    return {
        "n": len(values),
        "p50_ms": ms(percentile(values, 50)),
        "p99_ms": ms(percentile(values, 99)),
        "mean_ms": ms(statistics.fmean(values)) if values else math.nan,
        "max_ms": ms(max(values)) if values else math.nan,
    }
