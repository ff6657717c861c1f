"""`python -m tests.bench.table [--quick] [--out FILE]`: issue 43's table in one command.

Starts, behind one scripted upstream (`tests.bench.upstream`): kvmem with the memory agent off
and on, the LiteLLM proxy, and the bare Starlette + httpx pass-through
(`tests.bench.passthrough`). In rounds whose order alternates (forward, then reversed; the
direct call to the upstream always first), it measures what each adds over calling the
upstream directly at c=1 (p50, p99), the streamed time to first byte at c=1, and requests per
second at c=32; then `kvmem serve`'s start to ready against c461702's
(`tests.bench.startup_ab`, starts interleaved). Each section prints the machine's 1-minute
load average at its start and end beside it (numbers taken above a load of ~1 on 2 cores are
noisy). Prints one markdown table (also written to `--out`): kvmem, the proxy, the bare
pass-through, kvmem/proxy, the goal and whether it is met.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import uvloop

from tests.bench import latency, startup_ab
from tests.bench.ab import Loads, Plan, alternate
from tests.bench.latency import DIRECT, Target
from tests.bench.servers import MAIN_MODEL, UPSTREAM_MAIN, AgentSpec, Fleet, Server, fleet

FULL = Plan(warmup=20, c1=(8, 100), stream=(8, 50), c32=(6, 640), puts=(0, 0))
QUICK = Plan(warmup=3, c1=(2, 10), stream=(2, 5), c32=(1, 64), puts=(0, 0))
STARTS = {"full": 8, "quick": 2}

KVMEM, KVMEM_ON, PROXY, BARE = "kvmem", "kvmem-agent-on", "litellm-proxy", "bare"


def bare_passthrough(servers: Fleet, upstream: Server) -> Server:
    """The bare pass-through in front of `upstream`."""
    port = servers.port()
    return servers.spawn(
        BARE,
        [
            sys.executable,
            "-m",
            "tests.bench.passthrough",
            "--port",
            str(port),
            "--upstream",
            upstream.url,
        ],
        port,
        "/healthz",
    )


async def hot_path(plan: Plan, workdir: Path, loads: Loads) -> dict[str, dict[str, Any]]:
    """c=1, streamed c=1 and c=32 tables, keyed by section then target."""
    with fleet(workdir) as servers:
        upstream = servers.upstream(0.020, 0.050, 10, 0.002)
        started: dict[str, Server] = {}
        for name, agent in ((KVMEM, None), (KVMEM_ON, AgentSpec("bench-agent"))):
            path, port = servers.kvmem_config(name, upstream, agent)
            started[name] = servers.kvmem(name, path, port)
        started[PROXY] = servers.litellm_proxy(upstream)
        started[BARE] = bare_passthrough(servers, upstream)
        upstream.wait_ready(60)
        for server in started.values():
            server.wait_ready(180)
        direct = Target(DIRECT, f"{upstream.url}/v1/chat/completions", UPSTREAM_MAIN, upstream.pid)
        targets = {
            name: Target(
                name,
                f"{server.url}/v1/chat/completions",
                UPSTREAM_MAIN if name == BARE else MAIN_MODEL,
                server.pid,
            )
            for name, server in started.items()
        }
        agent_off = [direct, targets[KVMEM], targets[PROXY], targets[BARE]]
        await latency.warm_up([direct, *targets.values()], plan.warmup)
        c1 = latency.latency_table(
            await loads.during("c=1", alternate(agent_off, *plan.c1, concurrency=1))
        )
        streamed = latency.streaming_table(
            await loads.during(
                "c=1 streamed", alternate(agent_off, *plan.stream, concurrency=1, stream=True)
            )
        )
        c32 = latency.latency_table(
            await loads.during(
                "c=32", alternate([direct, *targets.values()], *plan.c32, concurrency=32)
            )
        )
    return {"c1": c1, "streamed": streamed, "c32": c32}


def fraction(value: float, of: float) -> str:
    return f"{value / of:.2f} ×" if of else "-"


def render(
    hot: dict[str, dict[str, Any]],
    start: dict[str, dict[str, list[float]]],
    loads: Loads,
    quick: bool,
) -> str:
    c1, streamed, c32 = hot["c1"], hot["streamed"], hot["c32"]
    rows: list[tuple[str, Any, Any, Any, float, str, bool]] = []
    for label, table, key, goal in (
        ("added p50, c=1 (ms)", c1, "added_p50_ms", 0.12),
        ("added p99, c=1 (ms)", c1, "added_p99_ms", 0.25),
        ("streamed TTFB p50, added (ms)", streamed, "added_ttfb_p50_ms", 0.2),
    ):
        ours, proxy, bare = (table[n][key] for n in (KVMEM, PROXY, BARE))
        rows.append(
            (label, ours, proxy, bare, ours / proxy, f"≤ {goal} × proxy", ours / proxy <= goal)
        )
    for label, name in (("c=32 req/s, agent off", KVMEM), ("c=32 req/s, agent on", KVMEM_ON)):
        ours, proxy, bare = c32[name]["rps"], c32[PROXY]["rps"], c32[BARE]["rps"]
        rows.append((label, ours, proxy, bare, ours / proxy, "≥ 3 × proxy", ours / proxy >= 3))
    before = statistics.median(start["before"]["wall"])
    after = statistics.median(start["after"]["wall"])
    lines = [
        f"kvmem vs the LiteLLM proxy vs a bare Starlette + httpx pass-through "
        f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores"
        f"{', --quick: not a measurement' if quick else ''})",
        "",
        "| measure | kvmem | LiteLLM proxy | bare pass-through | kvmem / proxy | goal | met |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, ours, proxy, bare, ratio, goal, met in rows:
        lines.append(
            f"| {label} | {ours} | {proxy} | {bare} | {ratio:.2f} × (bare {fraction(bare, proxy)}) "
            f"| {goal} | {'yes' if met else 'no'} |"
        )
    lines.append(
        f"| start to ready (s, median) | {after:.3f} | c461702: {before:.3f} | - | "
        f"{after / before:.2f} × c461702 | ≤ 0.8 × c461702 | {'yes' if after / before <= 0.8 else 'no'} |"
    )
    notes = [
        f"Direct upstream: c=1 p50 {c1[DIRECT]['p50_ms']} ms, p99 {c1[DIRECT]['p99_ms']} ms; "
        f"TTFB p50 {streamed[DIRECT]['ttfb_p50_ms']} ms; c=32 {c32[DIRECT]['rps']} req/s.",
        "Server CPU ms per request (c=1 / c=32): "
        + "; ".join(
            f"{n} {c1[n]['server_cpu_ms_per_request'] if n in c1 else '-'} / "
            f"{c32[n]['server_cpu_ms_per_request']}"
            for n in (KVMEM, KVMEM_ON, PROXY, BARE)
        ),
        "Errors: "
        + ", ".join(
            f"{n} {sum(t[n]['errors'] for t in (c1, streamed, c32) if n in t)}"
            for n in (KVMEM, KVMEM_ON, PROXY, BARE)
        ),
        "Start to ready, s (wall; server CPU): "
        + "; ".join(f"{v} {start[v]['wall']}; {start[v]['cpu']}" for v in ("before", "after")),
        "Load average (1 min) at start -> end of each section: "
        + "; ".join(f"{name} {a:.2f} -> {b:.2f}" for name, a, b in loads.sections),
    ]
    lines += ["", *(f"- {note}" for note in notes)]
    return "\n".join(lines)


async def run(quick: bool, workdir: Path) -> str:
    plan = QUICK if quick else FULL
    loads = Loads()
    hot = await hot_path(plan, workdir / "hot", loads)
    runs = STARTS["quick" if quick else "full"]
    start = await loads.during(
        "start to ready",
        asyncio.to_thread(startup_ab.measure, workdir / "start", startup_ab.BEFORE_REF, runs),
    )
    return render(hot, start, loads, quick)


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.bench.table", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true", help="a smoke test: seconds of load")
    parser.add_argument("--out", type=Path, help="also write the table to this file")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="kvmem-table-") as folder,
        asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner,
    ):
        (Path(folder) / "hot").mkdir()
        (Path(folder) / "start").mkdir()
        text = runner.run(run(args.quick, Path(folder)))
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
