"""Where the suite's CPU goes: `python -m pytest -p tests.support.cpu_per_file`, then
`python -m tests.support.cpu_per_file` prints the table.

Each pytest process (every xdist worker, or the one process with `-n 0`) adds up, per test
file, its own CPU time and that of its children reaped meanwhile (servers a test started and
stopped), wall time, test count and which workers ran the file, and writes them to
`$KVMEM_CPU_DIR` (default: a `kvmem-cpu` folder in the temp directory) when it ends. A file
seen on every worker although its module carries an `xdist_group` is a broken grouping; a
file with much child CPU starts processes. CPU, unlike wall time, hardly depends on what else
the machine runs. A timeline follows: per 30 s of the run, the workers in a test and the CPU
their tests used (the run's idle stretches and its tail), and each worker's last tests. Not loaded by default: the suite runs without it.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

OUT = Path(os.environ.get("KVMEM_CPU_DIR", Path(tempfile.gettempdir()) / "kvmem-cpu"))

_files: dict[str, list[float]] = {}  # file: [own CPU s, children CPU s, wall s, tests]
_tests: list[tuple[str, float, float, float]] = []  # nodeid, start and end (epoch s), CPU s
_started: tuple[str, float, float, float] | None = None  # file, own, children, wall


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def _file(nodeid: str) -> str:
    return nodeid.split("::")[0]


def pytest_configure(config: Any) -> None:
    # The run's first process (xdist's controller, or the only one) clears the last run's.
    if "PYTEST_XDIST_WORKER" not in os.environ:
        for stale in [*OUT.glob("*.json"), *OUT.glob("*.tests")]:
            stale.unlink()


def pytest_runtest_protocol(item: Any, nextitem: Any) -> None:
    global _started
    _started = (item.nodeid, *_cpu(), time.time())


def pytest_runtest_logfinish(nodeid: str, location: Any) -> None:
    # xdist's controller sees this hook for every worker's tests: only the process that ran
    # the test has a start for it.
    if _started is None or _started[0] != nodeid:
        return
    _, own, children, wall = _started
    now_own, now_children = _cpu()
    now = time.time()
    row = _files.setdefault(_file(nodeid), [0.0, 0.0, 0.0, 0])
    row[0] += now_own - own
    row[1] += now_children - children
    row[2] += now - wall
    row[3] += 1
    _tests.append((nodeid, wall, now, now_own - own + now_children - children))


def pytest_sessionfinish(session: Any) -> None:
    if not _files:
        return
    OUT.mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    (OUT / f"{worker}.json").write_text(json.dumps(_files), encoding="utf-8")
    (OUT / f"{worker}.tests").write_text(json.dumps(_tests), encoding="utf-8")


def timeline(bucket: float = 30.0) -> None:
    """Per `bucket` seconds of the run: how many workers were in a test, and the CPU their
    tests used (spread evenly over each test's wall time); then each worker's last tests."""
    runs = {path.stem: json.loads(path.read_text()) for path in sorted(OUT.glob("*.tests"))}
    if not runs:
        return
    start = min(t[1] for tests in runs.values() for t in tests)
    end = max(t[2] for tests in runs.values() for t in tests)
    print(f"\nrun {end - start:.0f} s: | from s | busy workers | CPU s (of {2 * bucket:g}) |")
    at = start
    while at < end:
        busy = cpu = 0.0
        for tests in runs.values():
            for _, begun, ended, used in tests:
                overlap = min(ended, at + bucket) - max(begun, at)
                if overlap > 0:
                    busy += overlap / bucket
                    cpu += used * overlap / max(ended - begun, 1e-9)
        print(f"| {at - start:.0f} | {busy:.1f} | {cpu:.0f} |")
        at += bucket
    for worker, tests in runs.items():
        last = sorted(tests, key=lambda t: t[2])[-3:]
        print(
            f"{worker} ends at {last[-1][2] - start:.0f} s: "
            + "; ".join(f"{t[0]} ({t[2] - t[1]:.0f} s)" for t in last)
        )


def main() -> int:
    """Print the files by CPU, most first, from what the last run wrote."""
    totals: dict[str, list[Any]] = {}
    for path in sorted(OUT.glob("*.json")):
        for name, row in json.loads(path.read_text(encoding="utf-8")).items():
            total = totals.setdefault(name, [0.0, 0.0, 0.0, 0, set()])
            for index in range(4):
                total[index] += row[index]
            total[4].add(path.stem)
    if not totals:
        print(f"nothing in {OUT}: run python -m pytest -p tests.support.cpu_per_file first")
        return 1
    print(f"total CPU {sum(t[0] + t[1] for t in totals.values()):.0f} s")
    print(
        "| file | CPU s | own | children | wall s | tests | workers |\n|---|---|---|---|---|---|---|"
    )
    for name, (own, children, wall, tests, workers) in sorted(
        totals.items(), key=lambda item: -(item[1][0] + item[1][1])
    ):
        print(
            f"| {name} | {own + children:.1f} | {own:.1f} | {children:.1f} | {wall:.1f} | "
            f"{tests} | {len(workers)} |"
        )
    timeline()
    return 0


if __name__ == "__main__":
    sys.exit(main())
