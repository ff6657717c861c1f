"""Section 3: the memory path alone, in-process: load a user's entries and render the block.

This is what kvmem does for every chat request before the upstream call:
`MemoryStore.snapshot` (one read transaction) + `entries_within` + `render_memory_block`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.bench.load import summary_ms

SIZES = (0, 20, 200)


def memory_value(index: int) -> str:
    """A realistic stored value (~90 characters, ~20 tokens), different for each index.

    Every tenth value holds characters the block must escape (angle brackets, a newline).
    """
    food = "<b>spicy</b> food.\nReally." if index % 10 == 9 else "spicy food."
    return (
        f"Fact {index}: prefers metric units, works night shifts as a nurse, "
        f"has {index % 5 + 1} cats; likes {food}"
    )


def memory_items(count: int) -> list[tuple[str, str]]:
    """`count` (key, value) pairs: fact_000, fact_001, ..."""
    return [(f"fact_{index:03d}", memory_value(index)) for index in range(count)]


def measure(workdir: Path, iterations: int, seconds: float) -> dict[str, Any]:
    """p50/p99 of load + render for users with 0, 20 and 200 entries on a migrated SQLite db.

    `warm`: the same store reads the same unchanged user again and again (every chat request
    of a user whose memory did not change). `cold`: a new `MemoryStore` for each read, so
    nothing read before is reused (the first request after a change, or after a restart).
    """
    from kvmem.config import Config
    from kvmem.db.engine import Database
    from kvmem.db.migrate import upgrade
    from kvmem.memory.rules import MemoryRules
    from kvmem.memory.store import MemoryStore
    from kvmem.tokens import TokenCounter

    config = Config.model_validate(
        {
            "database": {"url": f"sqlite:///{workdir / 'memory-path.db'}"},
            "memory": {"tokenLimit": 20000},
        }
    )
    database = Database.from_config(config.database)
    try:
        upgrade(database.engine)
        rules, tokens = MemoryRules.from_config(config.memory), TokenCounter()
        store = MemoryStore(database, rules, tokens)
        results: dict[str, Any] = {}
        for size in SIZES:
            user = f"user_{size}"
            if size:
                store.import_document(user, memory_items(size))
            warm = _timed_reads(lambda: store, user, config, iterations, seconds / 2)
            cold = _timed_reads(
                lambda: MemoryStore(database, rules, tokens), user, config, iterations, seconds / 2
            )
            if warm["block"].count("\n[") != size or cold["block"] != warm["block"]:
                raise RuntimeError(f"the block of {user} does not hold its {size} entries")
            row = summary_ms(warm["totals"])
            row.update(
                snapshot_p50_ms=summary_ms(warm["loads"])["p50_ms"],
                render_p50_ms=summary_ms(warm["renders"])["p50_ms"],
                cold_p50_ms=summary_ms(cold["totals"])["p50_ms"],
                cold_p99_ms=summary_ms(cold["totals"])["p99_ms"],
                cold_snapshot_p50_ms=summary_ms(cold["loads"])["p50_ms"],
                block_chars=len(warm["block"]),
            )
            results[str(size)] = row
        return results
    finally:
        database.dispose()


def _timed_reads(
    store_for_read: Callable[[], Any], user: str, config: Any, iterations: int, seconds: float
) -> dict[str, Any]:
    """Time snapshot + entries_within + render_memory_block; the first 20 reads warm up."""
    from kvmem.agent.prompts import entries_within, render_memory_block

    limit = config.memory.token_limit
    totals: list[float] = []
    loads: list[float] = []
    renders: list[float] = []
    block = ""
    deadline = time.perf_counter() + seconds
    for index in range(iterations + 20):
        if time.perf_counter() > deadline:
            break
        store = store_for_read()
        started = time.perf_counter()
        snapshot = store.snapshot(user)
        loaded = time.perf_counter()
        block = render_memory_block(entries_within(snapshot.entries, limit))
        ended = time.perf_counter()
        if index >= 20:
            totals.append(ended - started)
            loads.append(loaded - started)
            renders.append(ended - loaded)
    return {"totals": totals, "loads": loads, "renders": renders, "block": block}
