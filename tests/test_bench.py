"""The benchmark suite still runs: `python -m tests.bench --quick` once, its numbers unchecked.

Benchmarks are not timed tests; this only proves that every section runs and writes its
results, so that the suite cannot rot.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

# The quick benchmark: eight servers and the LiteLLM proxy.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SECTIONS = {
    "latency",
    "litellm_path",
    "streaming",
    "memory_path",
    "writes",
    "agent_bound",
    "footprint",
}


def test_quick_benchmark_runs_every_section(tmp_path: Path) -> None:
    out = tmp_path / "results"
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.bench", "--quick", "--out", str(out)],
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output, _ = process.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGTERM)  # the benchmark stops its servers on SIGTERM
        try:
            output, _ = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            output, _ = process.communicate()
        raise AssertionError(f"the quick benchmark ran over 300 s:\n{output[-4000:]}") from None

    assert process.returncode == 0, output[-4000:]
    results = json.loads((out / "results.json").read_text())
    assert set(results["sections"]) == SECTIONS
    assert all(results["sections"][name] for name in SECTIONS)
    users = results["sections"]["writes"]["sqlite"]["50_users"]
    assert (users["users"], users["errors"], users["n"] > 0) == (50, 0, True)
    assert {check["result"] for check in results["targets"]} <= {"PASS", "MISS"}
    assert (out / "latency.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert "## Targets" in output
