"""`python -m tests.bench.ab [--before REF] [--quick]`: kvmem's hot path before and after a
change, side by side in one run (issue 24: "no regression against today's numbers").

Exports the tree of git `REF` (default `b383428`, the last commit before the house refactor of
issue 24 and the sweep of issue 22) into a temporary folder and starts, behind the same scripted
upstream, four `kvmem serve`: before and after (this checkout), each with the memory agent off
and on. One Python runs them all: each server's launcher puts its tree first on `sys.path` (and
in `PYTHONPATH`), prints where `kvmem` came from and refuses to start from the wrong tree.

Then, in rounds whose order alternates (before first, then after first), it measures: what
kvmem adds over calling the upstream directly at c=1, non-streamed (p50, p99) and streamed
(time to first byte); requests per second at c=32 with the agent off and on; the servers' CPU
time per request; and `PUT /memory/{key}` at c=1. Prints one table with before, after and
after/before, with the load average of the machine during each section (CPU ms per request
and the ratios hold up on a busy machine; wall-clock times do not).

`python -m tests.bench.ab scripts DIR [--before REF]` only writes `DIR/kvmem-before` and
`DIR/kvmem-after`, kvmem scripts of the two trees, for `tests.bench.writes_users --kvmem`.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvloop

from tests.bench import latency
from tests.bench.latency import DIRECT, Series, Target
from tests.bench.load import summary_ms
from tests.bench.servers import (
    MAIN_MODEL,
    REPO,
    UPSTREAM_MAIN,
    AgentSpec,
    Fleet,
    Server,
    child_env,
    fleet,
)
from tests.bench.writes import _measure

# The last commit before the work of issues 22 and 24 (a fixed ref: `main` moves on).
BEFORE_REF = "b383428"
IMPORTED = "kvmem imported from "

LAUNCHER = '''#!{python}
"""kvmem's CLI from {tree} (written by tests.bench.ab)."""
import os
import sys

TREE = {tree!r}
sys.path.insert(0, TREE)
os.environ["PYTHONPATH"] = TREE
import kvmem
import kvmem.migrations

for module in (kvmem, kvmem.migrations):
    if not os.path.realpath(module.__file__).startswith(os.path.realpath(TREE) + os.sep):
        sys.exit(f"{{module.__name__}} came from {{module.__file__}}, not from {{TREE}}")
print({imported!r} + kvmem.__file__, file=sys.stderr, flush=True)
from kvmem.cli import main

sys.exit(main())
'''


def export_tree(ref: str, folder: Path) -> Path:
    """The files of git `ref` in `folder`, laid out as installed: `migrations/` (a package
    of its own in the repo, `kvmem.migrations` once installed) moved into `kvmem/`, so that
    the tree does not borrow this checkout's migrations through the editable install."""
    archive = subprocess.run(
        ["git", "archive", "--format=tar", ref, "kvmem", "migrations"],
        cwd=REPO,
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    (folder / "migrations").rename(folder / "kvmem" / "migrations")
    return folder


def launcher(path: Path, tree: Path) -> Path:
    """Write an executable kvmem script at `path` that runs the kvmem of `tree`."""
    path.write_text(LAUNCHER.format(python=sys.executable, tree=str(tree), imported=IMPORTED))
    path.chmod(0o755)
    return path


def write_scripts(folder: Path, before: str) -> tuple[Path, Path]:
    """`folder/kvmem-before` (git `before`, exported to `folder/before-tree`) and
    `folder/kvmem-after` (this checkout)."""
    tree = folder / "before-tree"
    tree.mkdir(parents=True)
    export_tree(before, tree)
    return launcher(folder / "kvmem-before", tree), launcher(folder / "kvmem-after", REPO)


@dataclass(frozen=True)
class Plan:
    """How much of each measure: (rounds, requests per round)."""

    warmup: int
    c1: tuple[int, int]
    stream: tuple[int, int]
    c32: tuple[int, int]
    puts: tuple[int, int]


FULL = Plan(warmup=20, c1=(8, 80), stream=(8, 40), c32=(6, 640), puts=(8, 100))
QUICK = Plan(warmup=3, c1=(2, 10), stream=(2, 5), c32=(1, 64), puts=(2, 10))


def merge(into: Series, one: Series) -> None:
    """Fold the series of one round into the pooled one."""
    into.latencies += one.latencies
    into.first_bytes += one.first_bytes
    into.round_p50s += one.round_p50s
    into.round_ttfb_p50s += one.round_ttfb_p50s
    into.errors += one.errors
    into.error_samples += one.error_samples[: max(0, 3 - len(into.error_samples))]
    into.wall += one.wall
    into.cpu += one.cpu


async def alternate(
    targets: list[Target], rounds: int, requests: int, concurrency: int, stream: bool = False
) -> dict[str, Series]:
    """`rounds` rounds of one batch per target; the direct target (if any) first, then the
    others in order on even rounds and in reverse order on odd ones."""
    direct = [t for t in targets if t.name == DIRECT]
    others = [t for t in targets if t.name != DIRECT]
    pooled = {target.name: Series() for target in targets}
    for number in range(rounds):
        order = direct + (others if number % 2 == 0 else others[::-1])
        measured = await latency.interleave(
            order,
            rounds=1,
            requests=requests,
            concurrency=concurrency,
            seconds_per_batch=60,
            stream=stream,
        )
        for name, one in measured.items():
            merge(pooled[name], one)
    return pooled


async def measure_puts(
    targets: list[tuple[Target, str]], rounds: int, puts: int
) -> dict[str, dict[str, Any]]:
    """`PUT /memory/{key}` at c=1 against each (target, base URL), rounds alternating."""
    latencies: dict[str, list[float]] = {t.name: [] for t, _ in targets}
    cpu = dict.fromkeys(latencies, 0.0)
    errors = dict.fromkeys(latencies, 0)
    for _, url in targets:  # not counted: the first writes create the user and load the tokenizer
        await _measure(url, 1, 20, 60, " (ab warm-up)")
    for number in range(rounds):
        for target, url in targets if number % 2 == 0 else targets[::-1]:
            before = target.cpu_seconds()
            row, values = await _measure(url, 1, puts, 60, f" (ab round {number})")
            cpu[target.name] += target.cpu_seconds() - before
            latencies[target.name] += values
            errors[target.name] += row["errors"]
    return {
        name: {
            **summary_ms(values),
            "errors": errors[name],
            "cpu_ms": round(1000 * cpu[name] / len(values), 2) if values else None,
        }
        for name, values in latencies.items()
    }


class Loads:
    """The machine's 1-minute load average at the start and end of each section."""

    def __init__(self) -> None:
        self.sections: list[tuple[str, float, float]] = []

    async def during(self, name: str, work: Any) -> Any:
        start = os.getloadavg()[0]
        result = await work
        self.sections.append((name, start, os.getloadavg()[0]))
        return result


def start_servers(servers: Fleet, upstream: Server, scripts: dict[str, Path]) -> dict[str, Server]:
    """`<version>-off` and `<version>-on` (the agent) for each kvmem script."""
    started = {}
    for version, script in scripts.items():
        for agent in ("off", "on"):
            name = f"{version}-{agent}"
            spec = AgentSpec("bench-agent") if agent == "on" else None
            path, port = servers.kvmem_config(name, upstream, spec)
            started[name] = servers.spawn(
                name,
                [str(script), "serve", "--config", str(path)],
                port,
                "/healthz",
                env=child_env(),
                config=path,
            )
    return started


def imported_from(server: Server) -> str:
    """Where the server's launcher said `kvmem` came from."""
    for line in server.log.read_text(errors="replace").splitlines():
        if line.startswith(IMPORTED):
            return line[len(IMPORTED) :]
    raise RuntimeError(f"{server.name} did not say where kvmem came from:\n{server.log_tail()}")


def ratio(before: Any, after: Any) -> str:
    if not isinstance(before, int | float) or not isinstance(after, int | float) or not before:
        return "-"
    return f"{after / before:.2f}"


async def run(plan: Plan, workdir: Path, before: str) -> None:
    scripts = dict(
        zip(("before", "after"), write_scripts(workdir / "scripts", before), strict=True)
    )
    loads = Loads()
    with fleet(workdir) as servers:
        upstream = servers.upstream(0.020, 0.050, 10, 0.002)
        started = start_servers(servers, upstream, scripts)
        upstream.wait_ready(60)
        for server in started.values():
            server.wait_ready(180)
        print(f"# kvmem before ({before}) and after (this checkout), side by side\n")
        for name, server in started.items():
            print(f"- {name}: {imported_from(server)}")
        direct = Target(DIRECT, f"{upstream.url}/v1/chat/completions", UPSTREAM_MAIN, upstream.pid)
        targets = {
            name: Target(name, f"{server.url}/v1/chat/completions", MAIN_MODEL, server.pid)
            for name, server in started.items()
        }
        off = [direct, targets["before-off"], targets["after-off"]]
        await latency.warm_up([direct, *targets.values()], plan.warmup)
        c1 = latency.latency_table(
            await loads.during("c=1 non-streamed", alternate(off, *plan.c1, concurrency=1))
        )
        streamed = latency.streaming_table(
            await loads.during(
                "c=1 streamed", alternate(off, *plan.stream, concurrency=1, stream=True)
            )
        )
        c32 = latency.latency_table(
            await loads.during(
                "c=32 agent off and on",
                alternate([direct, *targets.values()], *plan.c32, concurrency=32),
            )
        )
        puts = await loads.during(
            "PUT c=1",
            measure_puts(
                [(targets[f"{v}-off"], started[f"{v}-off"].url) for v in ("before", "after")],
                *plan.puts,
            ),
        )
    rows: list[tuple[str, Any, Any]] = []
    for label, table, key in (
        ("c=1 added p50 ms", c1, "added_p50_ms"),
        ("c=1 added p99 ms", c1, "added_p99_ms"),
        ("c=1 server CPU ms/req", c1, "server_cpu_ms_per_request"),
        ("streamed c=1 added TTFB p50 ms", streamed, "added_ttfb_p50_ms"),
        ("streamed c=1 added TTFB p99 ms", streamed, "added_ttfb_p99_ms"),
        ("streamed c=1 server CPU ms/req", streamed, "server_cpu_ms_per_request"),
    ):
        rows.append((label, table["before-off"][key], table["after-off"][key]))
    for agent in ("off", "on"):
        for label, key in (
            ("req/s", "rps"),
            ("p50 ms", "p50_ms"),
            ("p99 ms", "p99_ms"),
            ("server CPU ms/req", "server_cpu_ms_per_request"),
        ):
            rows.append(
                (
                    f"c=32 agent {agent} {label}",
                    c32[f"before-{agent}"][key],
                    c32[f"after-{agent}"][key],
                )
            )
    for label, key in (("p50 ms", "p50_ms"), ("p99 ms", "p99_ms"), ("server CPU ms/PUT", "cpu_ms")):
        rows.append(
            (f"PUT /memory/{{key}} c=1 {label}", puts["before-off"][key], puts["after-off"][key])
        )
    print(f"\n| measure | before ({before}) | after | after/before |\n|---|---|---|---|")
    for label, old, new in rows:
        print(f"| {label} | {old} | {new} | {ratio(old, new)} |")
    errors = {
        name: c1.get(name, {}).get("errors", 0)
        + c32[name]["errors"]
        + streamed.get(name, {}).get("errors", 0)
        + puts.get(name, {}).get("errors", 0)
        for name in targets
    }
    print(
        f"\nDirect upstream: c=1 p50 {c1[DIRECT]['p50_ms']} ms, TTFB p50 "
        f"{streamed[DIRECT]['ttfb_p50_ms']} ms, c=32 {c32[DIRECT]['rps']} req/s. "
        f"Errors: {errors}. Samples: "
        f"{[s for t in (c1, c32, streamed) for r in t.values() for s in r['error_samples']][:3]}"
    )
    print(
        "Load average (1 min) at start -> end of each section: "
        + "; ".join(f"{name} {start:.1f} -> {end:.1f}" for name, start, end in loads.sections)
    )
    print(
        f"(rounds, requests per round): c=1 {plan.c1}, streamed {plan.stream}, "
        f"c=32 {plan.c32}, PUT {plan.puts}; rounds alternate which version goes first."
    )


def main() -> int:
    """Measure before and after, or (`scripts DIR`) only write the two kvmem scripts."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.bench.ab", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "scripts",
        nargs="?",
        metavar="scripts DIR",
        help="only write DIR/kvmem-before and DIR/kvmem-after",
    )
    parser.add_argument("folder", nargs="?", help=argparse.SUPPRESS)
    parser.add_argument("--before", default=BEFORE_REF, help="git ref of the tree before")
    parser.add_argument("--quick", action="store_true", help="a smoke test: seconds of load")
    args = parser.parse_args()
    if args.scripts is not None:
        if args.scripts != "scripts" or not args.folder:
            parser.error("the only command is `scripts DIR`")
        for script in write_scripts(Path(args.folder), args.before):
            print(script)
        return 0
    with (
        tempfile.TemporaryDirectory(prefix="kvmem-ab-") as folder,
        asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner,
    ):
        runner.run(run(QUICK if args.quick else FULL, Path(folder), args.before))
    return 0


if __name__ == "__main__":
    sys.exit(main())
