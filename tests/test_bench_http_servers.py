"""The HTTP-server comparison still runs: `python -m tests.bench.http_servers --quick` once,
its load numbers unchecked (benchmarks are not timed tests; this only keeps it from rotting).
Its framing probes are checked: `kvmem serve`'s own server meets every one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# Five servers and framing probes that wait on sockets.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]


def test_quick_http_servers_comparison_runs_and_kvmem_meets_every_probe() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.bench.http_servers", "--quick"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    rows = [line.split(" | ") for line in done.stdout.splitlines() if line.startswith("| ")]
    probes = {row[0][2:]: row[2] for row in rows if row[0][2:3].isdigit()}
    assert list(probes) == [
        "1 trailers (1 MiB)",
        "2 half a head",
        "2 idle socket",
        "3 chunk size zz",
        "4 413 after Expect (app)",
        "5 pipelined then NUL",
        "6 client gone mid-body (app)",
    ]
    assert {probe: cell.endswith("(yes)") for probe, cell in probes.items()} == dict.fromkeys(
        probes, True
    ), "\n".join(f"{probe}: {cell}" for probe, cell in probes.items())
    load = {
        row[0][2:]: row[-1].rstrip(" |")
        for row in rows
        if row[0][2:] in ("direct", "before", "kvmem", "h11", "granian")
    }
    zero = {"direct": "0", "before": "0", "kvmem": "0", "h11": "0", "granian": "0"}
    assert load == zero, done.stdout[done.stdout.index("## Load") :]
