"""The Ollama-front benchmark still runs: `python -m tests.bench.ollama_front --quick` once,
its numbers unchecked (benchmarks are not timed tests; this only keeps it from rotting)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# A quick benchmark with servers of its own.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]


def test_quick_ollama_front_benchmark_runs(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.bench.ollama_front", "--quick", "--out", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    results = json.loads((tmp_path / "ollama_front.json").read_text())
    assert set(results) == {
        "fronts",
        "added_ttfb_p50_ms",
        "added_ttlb_p50_ms",
        "added_server_cpu_ms_per_request",
        "over_v1_usage",
        "target",
        "result",
        "mode",
        "in_process",
    }
    assert {name: row["errors"] for name, row in results["fronts"].items()} == {
        "v1": 0,
        "v1_usage": 0,
        "ollama": 0,
    }
    assert {name: row["n"] for name, row in results["fronts"].items()} == {
        "v1": 100,
        "v1_usage": 100,
        "ollama": 100,
    }
    assert results["result"] in {"PASS", "MISS"}
    assert "| `/api/chat` |" in done.stdout
