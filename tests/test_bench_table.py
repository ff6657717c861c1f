"""Issue 43's table still runs: `python -m tests.bench.table --quick` once, its numbers
unchecked (benchmarks are not timed tests; this only keeps it from rotting): every row is
there, every target answered without an error, and the bare pass-through forwarded."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# kvmem twice, the LiteLLM proxy, the pass-through, then 4 starts of two kvmem versions.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]


def test_quick_table_runs_with_every_row_and_no_errors(tmp_path: Path) -> None:
    out = tmp_path / "table.md"
    done = subprocess.run(
        [sys.executable, "-m", "tests.bench.table", "--quick", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert out.read_text() == done.stdout
    rows = [line.split(" | ")[0][2:] for line in done.stdout.splitlines() if line.startswith("| ")]
    assert rows[1:] == [
        "added p50, c=1 (ms)",
        "added p99, c=1 (ms)",
        "streamed TTFB p50, added (ms)",
        "c=32 req/s, agent off",
        "c=32 req/s, agent on",
        "start to ready (s, median)",
    ]
    assert "- Errors: kvmem 0, kvmem-agent-on 0, litellm-proxy 0, bare 0\n" in done.stdout
