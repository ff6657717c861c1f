"""`python -m tests.bench.writes_users`: memory writes on SQLite on their own, in under 2 minutes.

Starts a kvmem in `auth.mode: keys` on a fresh SQLite file (one per `--kvmem` script, so that
two installations can be compared side by side) and measures, in rounds that alternate between
the servers: 50 writers each for its own user (`50_users`), 50 writers for one user (`50`) and
one writer (`1`). Prints writes/s, latency and the server's CPU time per write, per server
and measure, pooled over the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import psutil
import uvloop

from tests.bench.load import summary_ms
from tests.bench.servers import Server, fleet, tool
from tests.bench.writes import _measure, user_headers

SERVICE_KEY = "sk-bench-service"
KEYS_AUTH = {"mode": "keys", "service_keys": [SERVICE_KEY]}


async def measure_round(
    server: Server, users: int, per_user: int, single: int, tag: str
) -> dict[str, tuple[dict[str, Any], list[float]]]:
    """One round of the three measures against `server`."""

    def own_user(number: int) -> dict[str, str]:
        return user_headers(SERVICE_KEY, number)

    def one_user(_number: int) -> dict[str, str]:
        return user_headers(SERVICE_KEY, 0)

    process = psutil.Process(server.pid)
    measured = {}
    for name, writers, each, headers in (
        (f"{users}_users", users, per_user, own_user),
        (str(users), users, per_user, one_user),
        ("1", 1, single, one_user),
    ):
        before = sum(process.cpu_times()[:2])
        row, latencies = await _measure(server.url, writers, each, 60, tag, headers)
        # The server's CPU time per write: unlike writes/s, other work on the machine
        # hardly changes it.
        row["cpu_s"] = sum(process.cpu_times()[:2]) - before
        measured[name] = (row, latencies)
    return measured


def pooled(rounds: list[tuple[dict[str, Any], list[float]]]) -> dict[str, Any]:
    """The rounds of one measure as one row: writes/s over their summed time, latencies pooled."""
    latencies = [value for _, values in rounds for value in values]
    seconds = sum(row["n"] / row["puts_per_s"] for row, _ in rounds if row["puts_per_s"])
    return {
        **summary_ms(latencies),
        "writes_per_s": round(len(latencies) / seconds, 1) if seconds else None,
        "server_cpu_ms_per_write": round(
            1000 * sum(row["cpu_s"] for row, _ in rounds) / len(latencies), 3
        )
        if latencies
        else None,
        "errors": sum(row["errors"] for row, _ in rounds),
        "error_samples": [sample for row, _ in rounds for sample in row["error_samples"]][:3],
    }


async def run(
    commands: list[str], users: int, per_user: int, single: int, rounds: int
) -> dict[str, dict[str, Any]]:
    """Start one server per command, measure `rounds` alternating rounds, pool them."""
    workdir = Path(tempfile.mkdtemp(prefix="kvmem-writes-"))
    with fleet(workdir) as servers:
        upstream = servers.upstream(0.001, 0.001, 1, 0.0)  # the chat section needs a URL
        started = []
        for index, command in enumerate(commands):
            name = f"kvmem_{index}"
            config, port = servers.kvmem_config(name, upstream, None, auth=KEYS_AUTH)
            started.append(servers.kvmem(name, config, port, command))
        upstream.wait_ready(30)
        for server in started:
            server.wait_ready(90)
        # A warm-up round, not counted: the first writes create users and rows.
        for server in started:
            await measure_round(server, users, max(1, per_user // 4), 10, " (warm-up)")
        results: dict[str, dict[str, list[Any]]] = {c: {} for c in commands}
        for number in range(rounds):
            order = list(zip(commands, started, strict=True))
            for command, server in order if number % 2 == 0 else order[::-1]:
                measured = await measure_round(
                    server, users, per_user, single, f" (round {number})"
                )
                for name, result in measured.items():
                    results[command].setdefault(name, []).append(result)
    return {
        command: {name: pooled(rows) for name, rows in measures.items()}
        for command, measures in results.items()
    }


def main() -> int:
    """Parse the arguments, measure, print a table (and JSON with `--json`)."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.bench.writes_users", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--kvmem",
        action="append",
        metavar="SCRIPT",
        help="a kvmem script to measure (repeat to compare; default: this installation's)",
    )
    parser.add_argument("--users", type=int, default=50)
    parser.add_argument("--per-user", type=int, default=10, help="PUTs per writer per round")
    parser.add_argument("--single", type=int, default=150, help="PUTs of the lone writer")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", action="store_true", help="also print the results as JSON")
    args = parser.parse_args()
    commands = args.kvmem or tool("kvmem")
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        results = runner.run(run(commands, args.users, args.per_user, args.single, args.rounds))
    print(
        "| kvmem | measure | writes/s | p50 ms | p99 ms | server CPU ms/write | n | errors |\n"
        "|---|---|---|---|---|---|---|---|"
    )
    for command, measures in results.items():
        for name, row in measures.items():
            print(
                f"| {command} | {name} | {row['writes_per_s']} | {row['p50_ms']} | "
                f"{row['p99_ms']} | {row['server_cpu_ms_per_write']} | {row['n']} | {row['errors']} |"
            )
    if args.json:
        print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
