"""The scale benchmark still runs: `python -m tests.bench.scale --quick` (20,000 users) once,
every per-user route answered without error on the filled and the empty database. Its
numbers are not checked: benchmarks are not timed tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Fills 20,000 users and starts two servers.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
ROUTES = {
    "GET /memory",
    "GET /memory/{key}",
    "PUT /memory/{key}",
    "GET /memory/history",
    "GET /memory/{key}/history",
    "GET /memory/export",
    "POST /memory/context",
    "GET /preferences",
    "GET /conversations",
    "GET /conversations/{id}",
    "POST /v1/chat/completions",
    "DELETE /me",
}


def test_quick_scale_benchmark_answers_every_route_without_error(tmp_path: Path) -> None:
    out = tmp_path / "results"
    process = subprocess.run(
        # A tenth of the users with an entry due to expire at start: the start's sweep
        # expires them while the routes are measured.
        [
            sys.executable,
            "-m",
            "tests.bench.scale",
            "--quick",
            "--expiring",
            "0.1",
            "--out",
            str(out),
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert process.returncode == 0, (process.stdout + process.stderr)[-4000:]
    results = json.loads((out / "scale.json").read_text())
    assert results["errors"] == []
    assert (results["conditions"]["users"], results["conditions"]["quick"]) == (20_000, True)
    assert results["conditions"]["shape"].endswith(
        "every 10th user has an entry due to expire at start and one expiring in a day"
    )
    counts = {
        name: {label: row["n"] for label, row in by.items()}
        for name, by in results["routes"].items()
    }
    assert counts == {
        name: {
            "empty": 4 if name == "DELETE /me" else 3,
            "filled": 4 if name == "DELETE /me" else 3,
        }
        for name in ROUTES
    }
    assert results["sweep"]["n"] > 0
    assert {label: row["errors"] for label, row in results["writers"].items()} == {
        "empty": 0,
        "filled": 0,
    }
    assert {row["result"] for row in results["targets"]} == {"not judged (quick)"}
    assert (out / "scale.md").read_text() == process.stdout.rstrip("\n") + "\n"
    assert (out / "scale.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_the_expiry_benchmark_prints_both_sweeps_transactions() -> None:
    process = subprocess.run(
        [sys.executable, "-m", "tests.bench.expiry", "--users", "2000", "--batches", "5"],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert process.returncode == 0, (process.stdout + process.stderr)[-4000:]
    lines = process.stdout.splitlines()
    assert lines[0] == "2,000 users, each with one entry due to expire and 10 expired changes"
    assert [line.split(" | ")[0] for line in lines[3:]] == [
        "| history sweep, 200 changes",
        "| expiry sweep, 10 entries",
        "| expiry sweep, 20 entries (EXPIRE_BATCH)",
        "| expiry sweep, 50 entries",
        "| expiry sweep, 100 entries",
    ]
