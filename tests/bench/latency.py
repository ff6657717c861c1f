"""Sections 1 and 2: what each target adds over calling the upstream directly.

The targets are measured in interleaved rounds (direct, kvmem agent off, kvmem agent on,
LiteLLM proxy, then again), so that slow drifts of the machine hit all of them alike.
"""

from __future__ import annotations

import asyncio
import math
import statistics
from dataclasses import dataclass, field
from typing import Any

import psutil

from tests.bench.load import (
    Batch,
    chat_body,
    ms,
    percentile,
    run_batch,
    session,
    summary_ms,
)

DIRECT = "direct"


@dataclass(frozen=True)
class Target:
    """Something that answers OpenAI chat completions."""

    name: str
    url: str  # the full /v1/chat/completions URL
    model: str  # the model id this target serves
    pid: int | None = None  # the serving process, whose CPU time per request is reported

    def cpu_seconds(self) -> float:
        """User + system CPU time the serving process (and any children) has used so far."""
        if self.pid is None:
            return 0.0
        process = psutil.Process(self.pid)
        total = 0.0
        for one in (process, *process.children(recursive=True)):
            try:
                times = one.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system
        return total


@dataclass
class Series:
    """Everything one target measured at one setting, over all rounds."""

    latencies: list[float] = field(default_factory=list)
    first_bytes: list[float] = field(default_factory=list)
    round_p50s: list[float] = field(default_factory=list)
    round_ttfb_p50s: list[float] = field(default_factory=list)
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    wall: float = 0.0
    cpu: float = 0.0  # CPU seconds the serving process used during the batches

    def add(self, batch: Batch, cpu: float = 0.0) -> None:
        """Fold one round's batch in."""
        self.cpu += cpu
        self.latencies += batch.latencies
        self.first_bytes += batch.first_bytes
        if batch.latencies:
            self.round_p50s.append(percentile(batch.latencies, 50))
        if batch.first_bytes:
            self.round_ttfb_p50s.append(percentile(batch.first_bytes, 50))
        self.errors += batch.errors
        self.error_samples += batch.error_samples[: max(0, 3 - len(self.error_samples))]
        self.wall += batch.wall

    @property
    def rps(self) -> float:
        """Successful requests per second of wall time."""
        return len(self.latencies) / self.wall if self.wall else math.nan


async def interleave(
    targets: list[Target],
    *,
    rounds: int,
    requests: int,
    concurrency: int,
    seconds_per_batch: float,
    stream: bool = False,
) -> dict[str, Series]:
    """`rounds` rounds; in each, one batch per target, in order."""
    series = {target.name: Series() for target in targets}
    clients = {target.name: session(concurrency) for target in targets}
    bodies = {target.name: chat_body(target.model, stream=stream) for target in targets}
    try:
        for _ in range(rounds):
            for target in targets:
                cpu_before = target.cpu_seconds()
                batch = await run_batch(
                    clients[target.name],
                    target.url,
                    bodies[target.name],
                    requests=requests,
                    concurrency=concurrency,
                    seconds=seconds_per_batch,
                    stream=stream,
                )
                series[target.name].add(batch, target.cpu_seconds() - cpu_before)
                await asyncio.sleep(0.05)  # let the previous target's leftovers settle
    finally:
        await asyncio.gather(*(client.close() for client in clients.values()))
    return series


async def warm_up(
    targets: list[Target], requests: int, streams: tuple[bool, ...] = (False, True)
) -> None:
    """A few unmeasured requests to each target, plain and streamed, at c=1 and c=8."""
    for target in targets:
        async with session(8) as client:
            for stream in streams:
                body = chat_body(target.model, stream=stream)
                for concurrency in (1, 8):
                    batch = await run_batch(
                        client,
                        target.url,
                        body,
                        requests=requests,
                        concurrency=concurrency,
                        seconds=30,
                        stream=stream,
                    )
                    if batch.errors:
                        raise RuntimeError(
                            f"{target.name} failed during warm-up ({batch.errors} errors): "
                            + "; ".join(batch.error_samples)
                        )


def latency_table(series: dict[str, Series]) -> dict[str, dict[str, Any]]:
    """Per target: p50/p99/rps and what it adds over the direct target."""
    direct = series[DIRECT]
    direct_p50 = percentile(direct.latencies, 50)
    direct_p99 = percentile(direct.latencies, 99)
    table: dict[str, dict[str, Any]] = {}
    for name, one in series.items():
        row = summary_ms(one.latencies)
        p50, p99 = percentile(one.latencies, 50), percentile(one.latencies, 99)
        row.update(
            rps=round(one.rps, 1),
            server_cpu_ms_per_request=round(1000 * one.cpu / len(one.latencies), 2)
            if one.latencies
            else None,
            added_p50_ms=ms(p50 - direct_p50),
            added_p99_ms=ms(p99 - direct_p99),
            round_p50s_ms=[ms(v) for v in one.round_p50s],
            round_p50_stdev_ms=(
                ms(statistics.stdev(one.round_p50s)) if len(one.round_p50s) > 1 else 0.0
            ),
            errors=one.errors,
            error_samples=one.error_samples,
        )
        table[name] = row
    return table


def streaming_table(series: dict[str, Series]) -> dict[str, dict[str, Any]]:
    """Per target: time to first byte and to last byte, and what it adds over direct."""
    direct = series[DIRECT]
    base = {
        "ttfb": (percentile(direct.first_bytes, 50), percentile(direct.first_bytes, 99)),
        "ttlb": (percentile(direct.latencies, 50), percentile(direct.latencies, 99)),
    }
    table: dict[str, dict[str, Any]] = {}
    for name, one in series.items():
        row: dict[str, Any] = {
            "n": len(one.latencies),
            "errors": one.errors,
            "error_samples": one.error_samples,
            "server_cpu_ms_per_request": round(1000 * one.cpu / len(one.latencies), 2)
            if one.latencies
            else None,
        }
        for label, values in (("ttfb", one.first_bytes), ("ttlb", one.latencies)):
            p50, p99 = percentile(values, 50), percentile(values, 99)
            row[f"{label}_p50_ms"] = ms(p50)
            row[f"{label}_p99_ms"] = ms(p99)
            row[f"added_{label}_p50_ms"] = ms(p50 - base[label][0])
            row[f"added_{label}_p99_ms"] = ms(p99 - base[label][1])
        row["round_ttfb_p50s_ms"] = [ms(v) for v in one.round_ttfb_p50s]
        table[name] = row
    return table


async def measure_c1(targets: list[Target], plan: Any) -> dict[str, Any]:
    """Only the non-streamed c=1 rounds (the first target is the direct one)."""
    await warm_up(targets, plan.warmup_requests, streams=(False,))
    c1 = await interleave(
        targets,
        rounds=plan.c1_rounds,
        requests=plan.c1_requests,
        concurrency=1,
        seconds_per_batch=plan.batch_seconds,
    )
    return latency_table(c1)


async def measure(
    targets: list[Target], plan: Any
) -> tuple[dict[str, Any], dict[str, Any], dict[str, list[float]]]:
    """Sections 1 and 2; also the raw c=1 latencies (ms) for the plot."""
    await warm_up(targets, plan.warmup_requests)
    c1 = await interleave(
        targets,
        rounds=plan.c1_rounds,
        requests=plan.c1_requests,
        concurrency=1,
        seconds_per_batch=plan.batch_seconds,
    )
    c32 = await interleave(
        targets,
        rounds=plan.c32_rounds,
        requests=plan.c32_requests,
        concurrency=32,
        seconds_per_batch=plan.batch_seconds,
    )
    streamed = await interleave(
        targets,
        rounds=plan.stream_rounds,
        requests=plan.stream_requests,
        concurrency=1,
        seconds_per_batch=plan.batch_seconds,
        stream=True,
    )
    latency = {"c1": latency_table(c1), "c32": latency_table(c32)}
    streaming = {"c1": streaming_table(streamed)}
    raw = {
        "latency_c1": {name: [v * 1000 for v in s.latencies] for name, s in c1.items()},
        "ttfb_c1": {name: [v * 1000 for v in s.first_bytes] for name, s in streamed.items()},
    }
    return latency, streaming, raw
