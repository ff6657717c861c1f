"""`python -m tests.bench.startup_ab [--before REF] [--runs N]`: `kvmem serve`'s start to
ready, this checkout against git `REF` (default c461702, issue 43's yardstick), starts
interleaved (ABBA) on the same machine, agent on, each on its own already-migrated SQLite
database. Prints each version's wall-clock seconds from spawn to the first 200 from
`/healthz` and the CPU seconds the server used up to then (robust on a busy machine), with
the load average beside them."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import psutil
import yaml

from tests.bench.ab import write_scripts
from tests.bench.servers import AgentSpec, Fleet, fleet

BEFORE_REF = "c461702"


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


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.startup_ab", description=__doc__)
    parser.add_argument("--before", default=BEFORE_REF, help="git ref of the tree before")
    parser.add_argument("--runs", type=int, default=8, help="timed starts of each version")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvmem-startup-") as folder:
        results = measure(Path(folder), args.before, args.runs)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
