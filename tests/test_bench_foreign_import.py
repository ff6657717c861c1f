"""The import benchmark still runs: `python -m tests.bench.foreign_import --quick` (2,000
memories of 200 users) imports every memory from each source, then finds nothing left to
change. Its numbers are not checked: benchmarks are not timed tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# Six real kvmem processes.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]


def test_quick_import_benchmark_imports_everything_then_nothing() -> None:
    process = subprocess.run(
        [sys.executable, "-m", "tests.bench.foreign_import", "--quick"],
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert process.returncode == 0, (process.stdout + process.stderr)[-4000:]
    rows = [line.split() for line in process.stdout.splitlines()[2:]]
    assert [(row[0], row[1]) for row in rows] == [
        (source, run) for source in ("openwebui", "librechat", "mem0") for run in ("first", "again")
    ]
    results = [" ".join(row[7:]) for row in rows]
    assert (
        results
        == [
            "200 users, 2,000 added, 0 unchanged, 0 refused",
            "200 users, 0 added, 2,000 unchanged, 0 refused",
        ]
        * 3
    )
