"""`python -m tests.bench.context_hook [--quick] [--out DIR]`: latency of `POST /memory/context`.

What an app that calls its own model pays for kvmem's memory before each call: one request to
a real `kvmem serve` (SQLite, auth.mode local) for a user holding 200 entries, at
concurrency 1 and 32. Prints a markdown table and writes `context_hook.json` to the results
folder. Runnable on its own; the main suite (`python -m tests.bench`) does not include it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.bench.load import JSON_HEADERS, SYSTEM_PROMPT, session, summary_ms
from tests.bench.memory_path import memory_items
from tests.bench.servers import HOST, Server, fleet

RESULTS = Path(__file__).parent / "results"
ENTRIES = 200
BODY = json.dumps({"system": SYSTEM_PROMPT}).encode()


@dataclass(frozen=True)
class Plan:
    """How many requests to time."""

    warmup: int = 200
    c1_requests: int = 2000
    c32_requests: int = 6400


QUICK = Plan(warmup=20, c1_requests=100, c32_requests=320)


async def seed(server: Server) -> None:
    """Give the user `ENTRIES` entries through the REST API."""
    async with session(1) as client:
        for key, value in memory_items(ENTRIES):
            async with client.put(
                f"{server.url}/memory/{key}",
                headers=JSON_HEADERS,
                data=json.dumps({"value": value}).encode(),
            ) as response:
                if response.status not in (200, 201):
                    raise RuntimeError(
                        f"PUT /memory/{key}: {response.status} {await response.text()}"
                    )


async def timed(url: str, requests: int, concurrency: int) -> dict[str, Any]:
    """`requests` POSTs with `concurrency` in flight: latency summary, req/s, errors."""
    latencies: list[float] = []
    errors: list[str] = []
    issued = 0

    async with session(concurrency) as client:

        async def worker() -> None:
            nonlocal issued
            while issued < requests:
                issued += 1
                started = time.perf_counter()
                async with client.post(url, data=BODY, headers=JSON_HEADERS) as response:
                    payload = await response.read()
                elapsed = time.perf_counter() - started
                if response.status == 200 and len(json.loads(payload)["injected"]) == ENTRIES:
                    latencies.append(elapsed)
                else:
                    errors.append(f"{response.status}: {payload[:200]!r}")

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - started
    return {
        **summary_ms(latencies),
        "req_per_s": round(len(latencies) / wall, 1),
        "errors": len(errors),
        "error_samples": errors[:3],
    }


async def measure(plan: Plan, workdir: Path) -> dict[str, Any]:
    """Start kvmem, seed the user, warm up, then time c=1 and c=32."""
    with fleet(workdir) as servers:
        port = servers.port()
        config = workdir / "context.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "server": {"host": HOST, "port": port},
                    "database": {"url": f"sqlite:///{workdir / 'context.db'}"},
                    "auth": {"mode": "local"},
                    "memory": {"tokenLimit": 20000},
                }
            )
        )
        server = servers.kvmem("kvmem_context", config, port)
        await asyncio.to_thread(server.wait_ready, 120)
        await seed(server)
        url = f"{server.url}/memory/context"
        await timed(url, plan.warmup, 4)
        c1 = await timed(url, plan.c1_requests, 1)
        c32 = await timed(url, plan.c32_requests, 32)
    return {"entries": ENTRIES, "c1": c1, "c32": c32}


def table(results: dict[str, Any]) -> str:
    """The results as a markdown table."""
    rows = ["| concurrency | requests | p50 | p99 | req/s | errors |", "|---|---|---|---|---|---|"]
    for name in ("c1", "c32"):
        row = results[name]
        rows.append(
            f"| {name[1:]} | {row['n']} | {row['p50_ms']} ms | {row['p99_ms']} ms | "
            f"{row['req_per_s']} | {row['errors']} |"
        )
    return "\n".join(rows)


def main() -> int:
    """Run the benchmark; exit 1 if any request failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few requests, to prove it runs")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for context_hook.json")
    args = parser.parse_args()
    plan = QUICK if args.quick else Plan()
    with tempfile.TemporaryDirectory(prefix="kvmem-context-bench-") as workdir:
        results = asyncio.run(measure(plan, Path(workdir)))
    results["mode"] = "quick" if args.quick else "full"
    print(f"POST /memory/context, {ENTRIES} entries ({results['mode']} run)\n")
    print(table(results))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "context_hook.json").write_text(json.dumps(results, indent=2) + "\n")
    return 1 if results["c1"]["errors"] or results["c32"]["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
