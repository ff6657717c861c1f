"""`python -m tests.bench.startup_ab --floor`'s floor still runs: one process of each floor,
its numbers unchecked (benchmarks are not timed tests; this only keeps it from rotting)."""

from __future__ import annotations

import pytest

from tests.bench.startup_ab import FLOORS, measure_floor

pytestmark = pytest.mark.slow  # four fresh processes that each load the token encoding


def test_each_floor_runs_and_is_timed() -> None:
    results = measure_floor(1)
    assert list(results) == [label for label, _ in FLOORS]
    for series in results.values():
        assert [len(series[key]) for key in ("wall", "cpu", "load")] == [1, 1, 1]
        assert series["wall"][0] > 0 and series["cpu"][0] > 0
