"""`python -m tests.bench.startup_ab [--before REF] [--runs N]`: `kvmem serve`'s start to
ready, this checkout against git `REF` (default c461702, issue 43's yardstick), starts
interleaved (ABBA) on the same machine, agent on, each on its own already-migrated SQLite
database. Prints each version's wall-clock seconds from spawn to the first 200 from
`/healthz` and the CPU seconds the server used up to then (robust on a busy machine), with
the load average beside them.

`--floor` also times, in fresh processes, only what start-up cannot leave out or put after
ready (issue 43): SQLAlchemy (every store query of the first write) and the token encoding
(ready means loaded); then with the rest of what no server can start without (aiohttp for
the first model call, the config's pydantic models, click, uvicorn and Starlette). Each
process exits as soon as it is done: its time is a lower bound of any start to ready."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import yaml

from tests.bench.ab import write_scripts
from tests.bench.servers import REPO, AgentSpec, Fleet, child_env, fleet

BEFORE_REF = "c461702"
# What no start to ready can skip: (label, the imports, in a process with the collector off
# as `kvmem serve` has it, that then loads the encoding and exits).
FLOORS = (
    (
        "SQLAlchemy + encoding",
        "import sqlalchemy, sqlalchemy.orm, sqlalchemy.dialects.sqlite",
    ),
    (
        "+ aiohttp, pydantic config, click, uvicorn, Starlette",
        "import sqlalchemy, sqlalchemy.orm, sqlalchemy.dialects.sqlite, aiohttp, click, yaml,"
        " uvicorn, uvloop, httptools, starlette.applications, kvmem.config",
    ),
)


def start_once(
    servers: Fleet, name: str, config: Path, port: int, script: Path
) -> tuple[float, float]:
    """(seconds to ready, CPU seconds of the server's process tree until ready)."""
    server = servers.kvmem(name, config, port, command=str(script))
    try:
        seconds = server.wait_ready(120)
        process = psutil.Process(server.pid)
        cpu = sum(
            t.user + t.system
            for t in (p.cpu_times() for p in (process, *process.children(recursive=True)))
        )
        return seconds, cpu
    finally:
        servers.stop(server)


def plain_config(path: Path, port: int) -> tuple[Path, int]:
    """The bench config without the agent's run bounds (fields the older tree refuses):
    the same config for both versions."""
    config = yaml.safe_load(path.read_text())
    for field in ("max_runs_per_user", "max_concurrent_runs"):
        config["memory"]["agent"].pop(field)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path, port


def measure(workdir: Path, before: str, runs: int) -> dict[str, dict[str, list[float]]]:
    """`runs` timed starts of each version, ABBA order, after one untimed start each (it
    migrates the new database)."""
    scripts = dict(
        zip(("before", "after"), write_scripts(workdir / "scripts", before), strict=True)
    )
    results: dict[str, dict[str, list[float]]] = {
        v: {"wall": [], "cpu": [], "load": []} for v in scripts
    }
    with fleet(workdir) as servers:
        upstream = servers.upstream(0.020, 0.050, 10, 0.002)
        upstream.wait_ready(60)
        configs = {
            version: plain_config(
                *servers.kvmem_config(f"start-{version}", upstream, AgentSpec("bench-agent"))
            )
            for version in scripts
        }
        for version, script in scripts.items():
            start_once(servers, f"start-{version}", *configs[version], script)
        for number in range(runs):
            order = list(scripts) if number % 4 in (0, 3) else list(scripts)[::-1]
            for version in order:
                wall, cpu = start_once(
                    servers, f"start-{version}", *configs[version], scripts[version]
                )
                results[version]["wall"].append(round(wall, 3))
                results[version]["cpu"].append(round(cpu, 3))
                results[version]["load"].append(round(os.getloadavg()[0], 2))
    return results


def floor_once(imports: str) -> tuple[float, float]:
    """(seconds from spawn to exit, CPU seconds) of one process that imports `imports`,
    loads the token encoding and exits at once."""
    code = (
        "import gc, os\ngc.disable()\n"
        f"{imports}\n"
        "from kvmem.tokens import TokenCounter\nTokenCounter().load()\nos._exit(0)\n"
    )
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=child_env())
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise RuntimeError(f"the floor process exited with {process.returncode}: {imports}")
    return seconds, usage.ru_utime + usage.ru_stime


def measure_floor(runs: int) -> dict[str, dict[str, list[float]]]:
    """`runs` timed processes of each floor, in turns, after one untimed one each."""
    results: dict[str, dict[str, list[float]]] = {
        label: {"wall": [], "cpu": [], "load": []} for label, _ in FLOORS
    }
    for _, imports in FLOORS:
        floor_once(imports)
    for number in range(runs):
        for label, imports in FLOORS if number % 2 == 0 else FLOORS[::-1]:
            wall, cpu = floor_once(imports)
            results[label]["wall"].append(round(wall, 3))
            results[label]["cpu"].append(round(cpu, 3))
            results[label]["load"].append(round(os.getloadavg()[0], 2))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.startup_ab", description=__doc__)
    parser.add_argument("--before", default=BEFORE_REF, help="git ref of the tree before")
    parser.add_argument("--runs", type=int, default=8, help="timed starts of each version")
    parser.add_argument(
        "--floor", action="store_true", help="also time what no start to ready can skip"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvmem-startup-") as folder:
        results = measure(Path(folder), args.before, args.runs)
    floors = measure_floor(args.runs) if args.floor else {}
    print(
        f"| start to ready ({args.runs} starts each, ABBA) | before ({args.before}) | after | after/before |"
    )
    print("|---|---|---|---|")
    for label, key in (("wall s, median", "wall"), ("server CPU s, median", "cpu")):
        old = statistics.median(results["before"][key])
        new = statistics.median(results["after"][key])
        print(f"| {label} | {old:.3f} | {new:.3f} | {new / old:.2f} |")
    for version, series in results.items():
        print(f"{version}: wall {series['wall']}; cpu {series['cpu']}; load {series['load']}")
    if floors:
        old_wall, old_cpu = (statistics.median(results["before"][key]) for key in ("wall", "cpu"))
        print()
        print(
            f"| floor, spawn to exit ({args.runs} each) | wall s | CPU s "
            "| wall / before | CPU / before |"
        )
        print("|---|---|---|---|---|")
        for label, series in floors.items():
            wall, cpu = (statistics.median(series[key]) for key in ("wall", "cpu"))
            print(
                f"| {label} | {wall:.3f} | {cpu:.3f} | {wall / old_wall:.2f} | {cpu / old_cpu:.2f} |"
            )
        for label, series in floors.items():
            print(f"{label}: wall {series['wall']}; cpu {series['cpu']}; load {series['load']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
