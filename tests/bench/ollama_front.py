"""`python -m tests.bench.ollama_front [--quick] [--out DIR]`: what Ollama's front costs.

One kvmem (agent off, a user with 20 entries, the benchmark's scripted upstream) answers the
same streamed chat on `/v1/chat/completions` and on `/api/chat`, in interleaved rounds so
that drifts of the machine hit both alike. Time to the first body byte (the first text, on
both: the upstream's first chunk carries it) and to the last, at c=1; the target is that the
Ollama front adds at most 0.5 ms of TTFB p50 over `/v1`. Prints a markdown table and writes
`ollama_front.json` to the results folder.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import uvloop

from tests.bench.load import (
    JSON_HEADERS,
    Batch,
    chat_body,
    ms,
    percentile,
    session,
    stream_once,
)
from tests.bench.memory_path import memory_items
from tests.bench.servers import MAIN_MODEL, Server, fleet

RESULTS = Path(__file__).parent / "results"
TARGET_MS = 0.5
SEEDED_ENTRIES = 20


@dataclass(frozen=True)
class Plan:
    """How much to run."""

    mode: str
    warmup_requests: int = 100
    rounds: int = 20
    requests: int = 100


FULL = Plan("full")
QUICK = Plan("quick", warmup_requests=20, rounds=4, requests=25)


async def ndjson_once(client: aiohttp.ClientSession, url: str, body: bytes, batch: Batch) -> None:
    """One streamed `/api/chat`: time to the first body byte and to the last line."""
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
    if first is None or b'"done":true' not in tail:
        batch.note_error(f"stream ended without its done line: {tail!r}")
        return
    batch.first_bytes.append(first - started)
    batch.latencies.append(ended - started)


def ollama_body() -> bytes:
    """The same chat as `chat_body(stream=True)`, in Ollama's shape (streamed by default)."""
    messages = json.loads(chat_body(MAIN_MODEL))["messages"]
    return json.dumps({"model": MAIN_MODEL, "messages": messages}).encode()


async def one_batch(once: Any, client: aiohttp.ClientSession, url: str, body: bytes,
                    requests: int) -> Batch:
    """`requests` streamed requests one after another."""
    batch = Batch()
    started = time.perf_counter()
    for _ in range(requests):
        await once(client, url, body, batch)
    batch.wall = time.perf_counter() - started
    return batch


async def measure(kvmem: Server, plan: Plan) -> dict[str, Any]:
    """Both fronts, interleaved; per front TTFB/TTLB p50/p99 and the difference."""
    fronts = {
        "v1": (stream_once, f"{kvmem.url}/v1/chat/completions", chat_body(MAIN_MODEL, stream=True)),
        "ollama": (ndjson_once, f"{kvmem.url}/api/chat", ollama_body()),
    }
    batches: dict[str, list[Batch]] = {name: [] for name in fronts}
    async with session(1) as client:
        for once, url, body in fronts.values():
            warm = await one_batch(once, client, url, body, plan.warmup_requests)
            if warm.errors:
                raise RuntimeError(f"{url} failed during warm-up: {warm.error_samples}")
        for _ in range(plan.rounds):
            for name, (once, url, body) in fronts.items():
                batches[name].append(await one_batch(once, client, url, body, plan.requests))
    table: dict[str, Any] = {}
    for name, runs in batches.items():
        first = [v for b in runs for v in b.first_bytes]
        last = [v for b in runs for v in b.latencies]
        table[name] = {
            "n": len(first),
            "errors": sum(b.errors for b in runs),
            "ttfb_p50_ms": ms(percentile(first, 50)),
            "ttfb_p99_ms": ms(percentile(first, 99)),
            "ttlb_p50_ms": ms(percentile(last, 50)),
            "ttlb_p99_ms": ms(percentile(last, 99)),
            "round_ttfb_p50s_ms": [ms(percentile(b.first_bytes, 50)) for b in runs],
        }
    added = round(table["ollama"]["ttfb_p50_ms"] - table["v1"]["ttfb_p50_ms"], 3)
    return {
        "fronts": table,
        "added_ttfb_p50_ms": added,
        "added_ttlb_p50_ms": round(table["ollama"]["ttlb_p50_ms"] - table["v1"]["ttlb_p50_ms"], 3),
        "target": f"Ollama front adds at most {TARGET_MS} ms TTFB p50 over /v1",
        "result": "PASS" if added <= TARGET_MS else "MISS",
    }


async def seed(kvmem: Server) -> None:
    """The user's entries, injected into every request as in the main benchmark."""
    async with session(1) as client:
        for key, value in memory_items(SEEDED_ENTRIES):
            async with client.put(f"{kvmem.url}/memory/{key}", data=json.dumps({"value": value}),
                                  headers=JSON_HEADERS) as response:
                if response.status not in (200, 201):
                    raise RuntimeError(f"PUT /memory/{key}: {response.status}")


async def run(plan: Plan, workdir: Path) -> dict[str, Any]:
    """Start the upstream and one kvmem, seed, measure."""
    with fleet(workdir) as servers:
        upstream = servers.upstream(0.020, 0.050, 10, 0.002)
        config, port = servers.kvmem_config("kvmem_off", upstream, None)
        kvmem = servers.kvmem("kvmem_off", config, port)
        upstream.wait_ready(30)
        kvmem.wait_ready(90)
        await seed(kvmem)
        return await measure(kvmem, plan)


def table(results: dict[str, Any]) -> str:
    """The markdown table of one run."""
    lines = ["| front | n | TTFB p50 | TTFB p99 | TTLB p50 | TTLB p99 | errors |",
             "|---|---|---|---|---|---|---|"]
    for name, label in (("v1", "`/v1/chat/completions`"), ("ollama", "`/api/chat`")):
        row = results["fronts"][name]
        lines.append(f"| {label} | {row['n']} | {row['ttfb_p50_ms']:.2f} ms | "
                     f"{row['ttfb_p99_ms']:.2f} ms | {row['ttlb_p50_ms']:.2f} ms | "
                     f"{row['ttlb_p99_ms']:.2f} ms | {row['errors']} |")
    lines.append("")
    lines.append(f"Ollama front, added TTFB p50: {results['added_ttfb_p50_ms']:+.3f} ms "
                 f"(TTLB p50 {results['added_ttlb_p50_ms']:+.3f} ms); "
                 f"{results['target']}: {results['result']}")
    return "\n".join(lines)


def main() -> int:
    """Parse the arguments, run, print and write the results."""
    parser = argparse.ArgumentParser(prog="python -m tests.bench.ollama_front",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few rounds, for a smoke run")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    plan = QUICK if args.quick else FULL
    workdir = Path(tempfile.mkdtemp(prefix="kvmem-bench-ollama-"))
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            results = runner.run(run(plan, workdir))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    results["mode"] = plan.mode
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ollama_front.json").write_text(json.dumps(results, indent=2) + "\n")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
