"""`python -m tests.bench [--quick] [--out DIR]`: measure kvmem beside the model.

Starts on 127.0.0.1 a scripted upstream, seven kvmem instances (agent off, agent on, agent
that hangs; history kept and not kept; the litellm path; `auth.mode: keys` for many users'
writes) and the LiteLLM proxy, measures every section, prints a markdown table per section
and the target checks (PASS/MISS), and writes results.json, results.md and latency.png to
the results folder. Exits 0 when every section ran, whatever the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

import psutil
import uvloop

from tests.bench import (
    agent_bound,
    footprint,
    latency,
    memory_path,
    report,
    writes,
    writes_users,
)
from tests.bench.latency import Target
from tests.bench.load import JSON_HEADERS, seed, session
from tests.bench.memory_path import memory_items
from tests.bench.servers import (
    ANTHROPIC_MODEL,
    MAIN_MODEL,
    UPSTREAM_MAIN,
    AgentSpec,
    Fleet,
    Server,
    fleet,
    http_get,
    postgres_database,
)

RESULTS = Path(__file__).parent / "results"
POSTGRES_ENV = "KVMEM_BENCH_POSTGRES_URL"
SEEDED_ENTRIES = 20


@dataclass(frozen=True)
class Plan:
    """How much of each section to run."""

    mode: str
    main_latency: float = 0.020
    agent_latency: float = 0.050
    chunks: int = 10
    chunk_delay: float = 0.002
    warmup_requests: int = 50
    batch_seconds: float = 30.0  # a cap per batch, far above what a batch should take
    c1_rounds: int = 10
    c1_requests: int = 60
    c32_rounds: int = 5
    c32_requests: int = 640
    stream_rounds: int = 10
    stream_requests: int = 40
    memory_path_iterations: int = 3000
    writes_single: int = 500
    writes_per_writer: int = 20  # x 50 writers
    history_rounds: int = 4  # interleaved rounds per arm of the history-cost comparison
    agent_requests: int = 100
    agent_concurrency: int = 8
    agent_grace: float = 3.0
    soak_seconds: float = 300.0
    soak_warmup_requests: int = 400
    soak_sample_every: float = 5.0
    startup_runs: int = 3
    memory_list_runs: int = 5


FULL = Plan(mode="full")
QUICK = Plan(
    mode="quick",
    # Enough requests for every table and target to have numbers; CI runs this on every
    # change and judges none of them, so each extra request is only cost.
    warmup_requests=3,
    c1_rounds=2,
    c1_requests=8,
    c32_rounds=1,
    c32_requests=64,
    stream_rounds=2,
    stream_requests=5,
    memory_path_iterations=300,
    writes_single=100,
    writes_per_writer=4,
    history_rounds=2,
    agent_requests=10,
    agent_concurrency=4,
    agent_grace=0.5,
    soak_seconds=3.0,
    soak_warmup_requests=20,
    soak_sample_every=1.0,
    # One `kvmem memory list` proves the command runs (the median of five is for the full run;
    # each run is a fresh process importing kvmem, ~1.2 s of CPU).
    startup_runs=1,
    memory_list_runs=1,
)


def main() -> int:
    """Parse the arguments, run, print and write the results."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.bench", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true", help="every section for a few seconds")
    parser.add_argument(
        "--out", type=Path, default=RESULTS, help=f"results folder (default {RESULTS})"
    )
    parser.add_argument(
        "--soak-seconds",
        type=float,
        default=None,
        help="override the length of the RSS soak (section 6)",
    )
    parser.add_argument(
        "--keep-workdir",
        action="store_true",
        help="keep the temporary folder with the configs, databases and logs",
    )
    args = parser.parse_args()
    plan = QUICK if args.quick else FULL
    if args.soak_seconds is not None:
        plan = Plan(**{**asdict(plan), "soak_seconds": args.soak_seconds})
    workdir = Path(tempfile.mkdtemp(prefix="kvmem-bench-"))
    machine_before = machine_cpu()
    # A SIGTERM (a CI timeout, say) unwinds like Ctrl-C, so every server is still stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.perf_counter()
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            sections, raw, meta = runner.run(run(plan, workdir))
    except BaseException:
        print(f"benchmark failed; configs and server logs are in {workdir}", file=sys.stderr)
        raise
    meta["duration_s"] = round(time.perf_counter() - started, 1)
    meta["other_cpu"] = other_cpu(machine_before, machine_cpu(), meta["duration_s"])
    results = {
        "meta": meta,
        "sections": sections,
        "targets": [
            check.as_json() for check in report.checks(sections, quick=plan.mode == "quick")
        ],
    }
    results = finite(results)
    text = report.write(results, raw, args.out)
    print(text)
    print(f"results: {args.out / 'results.json'}, {args.out / 'latency.png'}")
    if not args.keep_workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


async def run(plan: Plan, workdir: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Every section, in an order that keeps each one's measurement clean."""
    sections: dict[str, Any] = {}
    with fleet(workdir) as servers:
        upstream = servers.upstream(
            plan.main_latency, plan.agent_latency, plan.chunks, plan.chunk_delay
        )
        kvmem = {
            name: servers.kvmem(name, *servers.kvmem_config(name, upstream, agent))
            for name, agent in (
                ("kvmem_off", None),
                ("kvmem_on", AgentSpec("bench-agent")),
                ("kvmem_hang", AgentSpec("bench-hang", plan.agent_grace)),
            )
        }
        # The litellm path (section 1b): a provider litellm translates (Anthropic-shaped).
        litellm_path = servers.kvmem(
            "kvmem_litellm",
            *servers.kvmem_config("kvmem_litellm", upstream, None, chat_model=ANTHROPIC_MODEL),
        )
        # Two more for history's cost (section 4), started now so that they start in parallel.
        history = {
            days: servers.kvmem(
                name,
                *servers.kvmem_config(
                    name, upstream, None, memory_extra={"history": {"keep_days": days}}
                ),
            )
            for name, days in (("kvmem_history_on", 90), ("kvmem_history_off", 0))
        }
        # And one in `auth.mode: keys`, whose service key names a different user per writer.
        users = servers.kvmem(
            "kvmem_users",
            *servers.kvmem_config("kvmem_users", upstream, None, auth=writes_users.KEYS_AUTH),
        )
        proxy = servers.litellm_proxy(upstream)
        step("starting the upstream, 7 kvmem instances and the LiteLLM proxy")
        upstream.wait_ready(30)
        for server in [*kvmem.values(), *history.values(), litellm_path, users]:
            server.wait_ready(90)
        proxy.wait_ready(180)
        proxy_ready = proxy.ready_seconds
        step(
            f"ready: kvmem {[round(s.ready_seconds or 0, 1) for s in kvmem.values()]} s, "
            f"proxy {proxy_ready:.1f} s (all starting at once)"
        )
        for server in kvmem.values():
            await seed(server.url, memory_items(SEEDED_ENTRIES))
            await check_injection(server, upstream, SEEDED_ENTRIES)
        await seed(litellm_path.url, memory_items(SEEDED_ENTRIES))

        targets = [
            Target("direct", f"{upstream.url}/v1/chat/completions", UPSTREAM_MAIN, upstream.pid),
            Target(
                "kvmem_off",
                f"{kvmem['kvmem_off'].url}/v1/chat/completions",
                MAIN_MODEL,
                kvmem["kvmem_off"].pid,
            ),
            Target(
                "kvmem_on",
                f"{kvmem['kvmem_on'].url}/v1/chat/completions",
                MAIN_MODEL,
                kvmem["kvmem_on"].pid,
            ),
            Target("litellm_proxy", f"{proxy.url}/v1/chat/completions", MAIN_MODEL, proxy.pid),
        ]
        step("sections 1-2: latency and streaming, targets interleaved")
        sections["latency"], sections["streaming"], raw = await latency.measure(targets, plan)
        step("section 1b: the litellm path (Anthropic-shaped upstream), targets interleaved")
        sections["litellm_path"] = await latency.measure_c1(
            [
                targets[0],
                Target(
                    "kvmem_litellm",
                    f"{litellm_path.url}/v1/chat/completions",
                    ANTHROPIC_MODEL,
                    litellm_path.pid,
                ),
                Target(
                    "litellm_proxy", f"{proxy.url}/v1/chat/completions", ANTHROPIC_MODEL, proxy.pid
                ),
            ],
            plan,
        )
        servers.stop(litellm_path)
        servers.stop(proxy)

        step("section 5: agent bound (agent model hangs)")
        sections["agent_bound"] = await agent_bound.measure(
            kvmem["kvmem_hang"],
            upstream,
            requests=plan.agent_requests,
            concurrency=plan.agent_concurrency,
            grace=plan.agent_grace,
        )
        servers.stop(kvmem["kvmem_hang"])

        step("section 4: memory writes")
        sections["writes"] = {
            "sqlite": await write_rounds(kvmem["kvmem_off"].url, plan),
            "postgresql": None,
        }
        sections["writes"]["sqlite"]["50_users"] = await writes.measure_users(
            users.url, 50, plan.writes_per_writer, 120, writes_users.SERVICE_KEY
        )
        servers.stop(users)
        step("section 4: the cost of recording history (keep_days 90 vs 0, interleaved)")
        sections["writes"]["history"] = await history_rounds(servers, history, plan)
        admin_url = os.environ.get(POSTGRES_ENV)
        if admin_url:
            with postgres_database(admin_url) as url:
                config, port = servers.kvmem_config("kvmem_pg", upstream, None, database_url=url)
                pg = servers.kvmem("kvmem_pg", config, port)
                try:
                    pg.wait_ready(90)
                    sections["writes"]["postgresql"] = await write_rounds(pg.url, plan)
                finally:
                    servers.stop(pg)  # before the database is dropped
        servers.stop(kvmem["kvmem_off"])

        step("section 3: memory path in-process")
        sections["memory_path"] = await asyncio.to_thread(
            memory_path.measure, workdir, plan.memory_path_iterations, 60.0
        )

        step("section 6: footprint")
        listing = await asyncio.to_thread(
            footprint.memory_list_seconds, kvmem["kvmem_on"].config, plan.memory_list_runs
        )
        servers.stop(kvmem["kvmem_on"])
        fresh, startup_runs = await startup(servers, upstream, plan.startup_runs)
        await seed(fresh.url, memory_items(SEEDED_ENTRIES))
        soak = await footprint.soak(
            fresh,
            warmup_requests=plan.soak_warmup_requests,
            seconds=plan.soak_seconds,
            concurrency=4,
            sample_every=plan.soak_sample_every,
        )
        sections["footprint"] = {
            "soak": soak,
            "memory_list": listing,
            "startup": {
                "runs_s": startup_runs,
                "median_s": round(statistics.median(startup_runs), 3),
                "litellm_proxy_s": round(proxy_ready, 3) if proxy_ready else None,
            },
        }
    meta = {
        "mode": plan.mode,
        "started_utc": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": f"{os.cpu_count()} CPUs, {platform.machine()}, "
        f"Python {platform.python_version()}",
        "versions": {"kvmem": version("kvmem"), "litellm": version("litellm")},
        "upstream": {
            "main_latency_ms": plan.main_latency * 1000,
            "agent_latency_ms": plan.agent_latency * 1000,
            "chunks": plan.chunks,
            "chunk_delay_ms": plan.chunk_delay * 1000,
        },
        "setup": {
            "kvmem": "kvmem serve (uvicorn), auth.mode local, SQLite (WAL), tokenLimit 20000, "
            f"user with {SEEDED_ENTRIES} entries injected into every request",
            "litellm_proxy": "litellm --config (1 worker), no master key, no database, "
            "same model string and upstream as kvmem",
            "client": "aiohttp on uvloop, keep-alive connections, one process",
        },
        "plan": asdict(plan),
        "command": "python -m tests.bench" + (" --quick" if plan.mode == "quick" else ""),
    }
    return sections, raw, meta


async def write_rounds(base_url: str, plan: Plan) -> dict[str, Any]:
    """Section 4 against one server: 1 writer, then 50."""
    return {
        "1": await writes.measure(base_url, 1, plan.writes_single, seconds=120),
        "50": await writes.measure(base_url, 50, plan.writes_per_writer, seconds=120),
    }


async def history_rounds(servers: Fleet, history: dict[int, Server], plan: Plan) -> dict[str, Any]:
    """Section 4, history's cost: two fresh SQLite servers, `keep_days` 90 (the default) and 0;
    then `MemoryStore.set` in this process. The servers are stopped afterwards."""
    on, off = history[90].url, history[0].url
    try:
        # Short batches, alternating, so that both servers see the same machine load.
        return {
            "1": await writes.history_cost(
                on, off, 1, max(1, plan.writes_single // 10), 10 * plan.history_rounds
            ),
            "50": await writes.history_cost(
                on, off, 50, max(1, plan.writes_per_writer // 4), 4 * plan.history_rounds
            ),
            "store": await asyncio.to_thread(
                writes.store_cost, servers.workdir, plan.writes_single, 2 * plan.history_rounds
            ),
        }
    finally:
        for server in history.values():
            servers.stop(server)


async def startup(servers: Fleet, upstream: Server, runs: int) -> tuple[Server, list[float]]:
    """Start a fresh kvmem (agent on) `runs` times; the last one is left running."""
    config, port = servers.kvmem_config("kvmem_fresh", upstream, AgentSpec("bench-agent"))
    times = []
    server = None
    for _index in range(runs):
        if server is not None:
            servers.stop(server)
        server = servers.kvmem("kvmem_fresh", config, port)
        times.append(round(await asyncio.to_thread(server.wait_ready, 90), 3))
    assert server is not None
    return server, times


async def check_injection(server: Server, upstream: Server, count: int) -> None:
    """Make sure a chat request through `server` carries the user's `count` entries."""
    async with session(1) as client:
        body = json.dumps(
            {"model": MAIN_MODEL, "messages": [{"role": "user", "content": "hello"}]}
        ).encode()
        async with client.post(
            f"{server.url}/v1/chat/completions", data=body, headers=JSON_HEADERS
        ) as response:
            if response.status != 200:
                raise RuntimeError(
                    f"{server.name}: chat answered {response.status}: {await response.text()}"
                )
    status, last = await asyncio.to_thread(http_get, upstream.url + "/control/last-main")
    system = json.loads(last)["messages"][0]["content"]
    injected = system.count("\n[")
    if status != 200 or injected != count:
        raise RuntimeError(f"{server.name} injected {injected} entries, expected {count}")


def machine_cpu() -> tuple[float, float]:
    """(busy CPU seconds of the whole machine, CPU seconds of this process and its reaped
    children: every server, once stopped)."""
    total = psutil.cpu_times()
    busy = total.user + total.nice + total.system + total.irq + total.softirq
    own = os.times()
    return busy, own.user + own.system + own.children_user + own.children_system


def other_cpu(
    before: tuple[float, float], after: tuple[float, float], seconds: float
) -> dict[str, float]:
    """How much CPU the rest of the machine used during the run: other work skews every
    number, so the report says so."""
    foreign = max(0.0, (after[0] - before[0]) - (after[1] - before[1]))
    cpus = os.cpu_count() or 1
    return {
        "cpu_seconds": round(foreign, 1),
        "share_of_machine": round(foreign / (seconds * cpus), 3) if seconds else 0.0,
    }


def step(message: str) -> None:
    """Progress on stderr (stdout holds the tables)."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def finite(value: Any) -> Any:
    """`value` with NaN and infinities replaced by None, so results.json is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite(item) for item in value]
    return value


if __name__ == "__main__":
    sys.exit(main())
