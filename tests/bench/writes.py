"""Section 4: memory writes through the REST API, one writer and many at once (for one user,
and `measure_users`: each writer for its own user); and what recording each write's history
costs (`history_cost`: the same writes against a server with
`memory.history.keep_days: 0` and one with the default 90, rounds interleaved)."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
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


async def measure(
    base_url: str, writers: int, per_writer: int, seconds: float, tag: str = ""
) -> dict[str, Any]:
    """PUT /memory/{key} from `writers` concurrent writers, `per_writer` PUTs each, each
    writer sending its next PUT as soon as the previous one is answered. Every PUT changes
    its key's value (`tag` keeps repeated runs on one server from writing the same values)."""
    row, _ = await _measure(base_url, writers, per_writer, seconds, tag)
    return row


def user_headers(service_key: str, number: int) -> dict[str, str]:
    """The headers of writer `number` of `measure_users`: a service key naming its own user."""
    return {
        **JSON_HEADERS,
        "Authorization": f"Bearer {service_key}",
        "X-User-Id": f"bench_user_{number:02d}",
    }


async def measure_users(
    base_url: str, users: int, per_user: int, seconds: float, service_key: str, tag: str = ""
) -> dict[str, Any]:
    """As `measure`, but each of the `users` writers acts for a user of its own (the server in
    `auth.mode: keys`, `service_key` one of its service keys, the user in `X-User-Id`): one
    user's writes take turns by design, different users' need not."""
    row, _ = await _measure(
        base_url,
        users,
        per_user,
        seconds,
        tag,
        headers=lambda number: user_headers(service_key, number),
    )
    return {**row, "users": users}


async def _measure(
    base_url: str,
    writers: int,
    per_writer: int,
    seconds: float,
    tag: str,
    headers: Callable[[int], dict[str, str]] = lambda _number: JSON_HEADERS,
) -> tuple[dict[str, Any], list[float]]:
    latencies: list[float] = []
    errors = 0
    samples: list[str] = []
    async with session(writers) as client:

        async def writer(number: int) -> None:
            nonlocal errors
            sent = headers(number)
            for index in range(per_writer):
                key = f"bench_w{number:02d}_{index % KEYS_PER_WRITER}"
                body = json.dumps({"value": f"Writer {number} wrote value {index}{tag}."}).encode()
                started = time.perf_counter()
                try:
                    async with client.put(
                        f"{base_url}/memory/{key}", data=body, headers=sent
                    ) as response:
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
    return row, latencies


async def history_cost(
    with_history: str, without_history: str, writers: int, per_writer: int, rounds: int
) -> dict[str, Any]:
    """The same writes against a server that records history and one that does not
    (`keep_days: 0`), `rounds` rounds each, interleaved so that both see the same machine;
    the pooled latencies of each, and how much slower a write is with history (p50, mean)."""
    pooled: dict[str, list[float]] = {"on": [], "off": []}
    errors = {"on": 0, "off": 0}
    for number in range(rounds):
        order = [("on", with_history), ("off", without_history)]
        for arm, url in order if number % 2 == 0 else order[::-1]:
            row, latencies = await _measure(url, writers, per_writer, 120, f" (round {number})")
            pooled[arm] += latencies
            errors[arm] += row["errors"]
    on, off = summary_ms(pooled["on"]), summary_ms(pooled["off"])

    def slower(field: str) -> float:
        return round(100 * (on[field] - off[field]) / off[field], 1) if off[field] else 0.0

    return {
        "writers": writers,
        "rounds": rounds,
        "history_on": {**on, "errors": errors["on"]},
        "history_off": {**off, "errors": errors["off"]},
        "slower_p50_pct": slower("p50_ms"),
        "slower_mean_pct": slower("mean_ms"),
    }


def store_cost(workdir: Path, writes: int, rounds: int) -> dict[str, Any]:
    """`MemoryStore.set` in this process, on two SQLite files, history on (keep_days 90) and
    off (0), rounds interleaved: the cost of recording a change without HTTP around it."""
    from kvmem.config import Config
    from kvmem.db.engine import Database
    from kvmem.db.migrate import upgrade
    from kvmem.memory.rules import MemoryRules
    from kvmem.memory.store import MemoryStore
    from kvmem.tokens import TokenCounter

    tokens, stores, databases = TokenCounter(), {}, []
    for arm, days in (("on", 90), ("off", 0)):
        config = Config.model_validate(
            {"database": {"url": f"sqlite:///{workdir / f'store_history_{arm}.db'}"}}
        )
        databases.append(Database.from_config(config.database))
        upgrade(databases[-1].engine)
        stores[arm] = MemoryStore(
            databases[-1], MemoryRules.from_config(config.memory), tokens, keep_days=days
        )
    pooled: dict[str, list[float]] = {"on": [], "off": []}
    try:
        for number in range(rounds):
            for arm in ("on", "off") if number % 2 == 0 else ("off", "on"):
                for index in range(writes):
                    started = time.perf_counter()
                    stores[arm].set("bench", f"k{index % KEYS_PER_WRITER}", f"v {number} {index}")
                    pooled[arm].append(time.perf_counter() - started)
    finally:
        for database in databases:
            database.dispose()
    on, off = summary_ms(pooled["on"]), summary_ms(pooled["off"])
    return {
        "writers": "in-process",
        "rounds": rounds,
        "history_on": {**on, "errors": 0},
        "history_off": {**off, "errors": 0},
        "slower_p50_pct": round(100 * (on["p50_ms"] - off["p50_ms"]) / off["p50_ms"], 1),
        "slower_mean_pct": round(
            100
            * (statistics.fmean(pooled["on"]) - statistics.fmean(pooled["off"]))
            / statistics.fmean(pooled["off"]),
            1,
        ),
    }
