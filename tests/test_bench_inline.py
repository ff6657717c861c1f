"""The inline-memory benchmark still runs: `python -m tests.bench.inline --quick` once, its
numbers unchecked (benchmarks are not timed tests; this only keeps it from rotting)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

# A quick benchmark.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]


def test_quick_inline_benchmark_runs() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.bench.inline", "--quick"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    # The separate agent's calls are what the upstream received (one may be cut off at its
    # deadline on a loaded machine); inline makes none, whatever the load.
    assert re.search(r"^\| separate \| \d+ \| \d+ \| [\d,]+ \|", done.stdout, re.M)
    assert "| inline | 100 | 0 | 0 | 0 |" in done.stdout
    assert "The filter alone:" in done.stdout
