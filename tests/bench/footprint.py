"""Section 6: kvmem's footprint: start-to-ready time, RSS under load, `kvmem memory list`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from tests.bench.load import JSON_HEADERS, chat_body, run_workers, session
from tests.bench.servers import MAIN_MODEL, Server, child_env, tool

MIB = 1024 * 1024


def rss_mib(server: Server) -> float:
    """Resident memory of the server process and its children, in MiB."""
    process = psutil.Process(server.pid)
    total = process.memory_info().rss
    for child in process.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            total += child.memory_info().rss
    return total / MIB


def slope_per_minute(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MiB) samples, in MiB per minute."""
    if len(samples) < 2:
        return 0.0
    xs = [t for t, _ in samples]
    ys = [v for _, v in samples]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    if not spread:
        return 0.0
    return 60 * sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread


async def mixed_load(
    server: Server, *, requests: int | None, seconds: float, concurrency: int, on_tick: Any = None
) -> dict[str, int]:
    """Chat (plain and streamed) and memory reads and writes, in turn, from `concurrency`
    workers, until `requests` are done (if given) or `seconds` have passed."""
    counts = {"ok": 0, "errors": 0}
    chat_url = f"{server.url}/v1/chat/completions"
    plain = chat_body(MAIN_MODEL)
    streamed = chat_body(MAIN_MODEL, stream=True)
    issued = 0
    deadline = time.perf_counter() + seconds

    async with session(concurrency) as client:

        async def one(kind: int) -> bool:
            if kind == 0:
                request = client.post(chat_url, data=plain, headers=JSON_HEADERS)
            elif kind == 1:
                request = client.post(chat_url, data=streamed, headers=JSON_HEADERS)
            elif kind == 2:
                value = json.dumps({"value": f"Soak value {issued}."}).encode()
                request = client.put(
                    f"{server.url}/memory/soak_{issued % 5}", data=value, headers=JSON_HEADERS
                )
            else:
                request = client.get(f"{server.url}/memory")
            try:
                async with request as response:
                    await response.read()
                    return response.status in (200, 201)
            except (TimeoutError, aiohttp.ClientError):
                return False

        async def worker(_: int) -> None:
            nonlocal issued
            while (requests is None or issued < requests) and time.perf_counter() < deadline:
                issued += 1
                ok = await one(issued % 4)
                counts["ok" if ok else "errors"] += 1

        async def ticker() -> None:
            while on_tick is not None and time.perf_counter() < deadline:
                on_tick()
                await asyncio.sleep(1.0)

        tick = asyncio.ensure_future(ticker())
        try:
            await run_workers(concurrency, worker, seconds=seconds + 30)
        finally:
            tick.cancel()
    return counts


async def soak(
    server: Server, *, warmup_requests: int, seconds: float, concurrency: int, sample_every: float
) -> dict[str, Any]:
    """RSS after warm-up and after `seconds` of mixed load; growth in MiB/min."""
    warm = await mixed_load(server, requests=warmup_requests, seconds=120, concurrency=concurrency)
    await asyncio.sleep(0.5)
    after_warmup = rss_mib(server)
    started = time.perf_counter()
    samples: list[tuple[float, float]] = [(0.0, after_warmup)]
    last_sample = started

    def sample() -> None:
        nonlocal last_sample
        now = time.perf_counter()
        if now - last_sample >= sample_every:
            samples.append((now - started, rss_mib(server)))
            last_sample = now

    counts = await mixed_load(
        server, requests=None, seconds=seconds, concurrency=concurrency, on_tick=sample
    )
    elapsed = time.perf_counter() - started
    await asyncio.sleep(0.5)
    after_load = rss_mib(server)
    samples.append((time.perf_counter() - started, after_load))
    return {
        "rss_after_warmup_mib": round(after_warmup, 1),
        "rss_after_load_mib": round(after_load, 1),
        "load_seconds": round(elapsed, 1),
        "load_requests": counts["ok"],
        "load_errors": counts["errors"] + warm["errors"],
        "growth_mib_per_min": round((after_load - after_warmup) / (elapsed / 60), 3),
        "fitted_growth_mib_per_min": round(slope_per_minute(samples), 3),
        "samples": [(round(t, 1), round(v, 2)) for t, v in samples],
    }


def memory_list_seconds(config: Path, runs: int) -> dict[str, Any]:
    """Wall time of `kvmem memory list` as a subprocess (median of `runs`)."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        done = subprocess.run(
            [*tool("kvmem"), "memory", "list", "--config", str(config)],
            env=child_env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=60,
        )
        times.append(time.perf_counter() - started)
        if done.returncode != 0:
            raise RuntimeError(f"kvmem memory list failed: {done.stderr.decode()[-500:]}")
    entries = len(json.loads(done.stdout)["memories"])
    return {
        "runs": runs,
        "median_ms": round(statistics.median(times) * 1000, 1),
        "min_ms": round(min(times) * 1000, 1),
        "max_ms": round(max(times) * 1000, 1),
        "entries": entries,
    }
