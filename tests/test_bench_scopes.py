"""`python -m tests.bench.scopes --quick` still runs (its numbers unchecked: benchmarks are not
timed tests): both reads are in its table, and a scoped read runs as many statements as an
unscoped one, cold and warm (the bench exits 1 otherwise)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_quick_scopes_bench_runs_and_counts_the_same_statements() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.bench.scopes", "--quick"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={"LITELLM_LOCAL_MODEL_COST_MAP": "True", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    rows = {line.split(" | ")[0][2:]: line for line in done.stdout.splitlines() if line[:2] == "| "}
    assert rows["cold"].endswith("| 2 / 2 |") and rows["warm"].endswith("| 1 / 1 |")
