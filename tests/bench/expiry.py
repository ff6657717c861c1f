"""`python -m tests.bench.expiry [--users N] [--batches N]`: how long one transaction of the
expiry sweep holds SQLite's writer, against one of the history sweep.

Fills a SQLite database (`tests.bench.scale_fill`) with N users, each with an entry due to
expire and ten changes past `keep_days`, then times, one after another, transactions of the
history sweep (`ChangeLog.prune_all`, `SWEEP_BATCH` changes) and of the expiry sweep
(`expire_due_any`, `EXPIRE_BATCH` entries, and other batch sizes for comparison), each from
taking the writer to its COMMIT: the time a request's write may wait behind it. Prints a
table of p50, p99 and max per transaction.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from kvmem.config import DatabaseConfig
from kvmem.db.engine import Database
from kvmem.memory.expirations import EXPIRE_BATCH, expire_due_any
from kvmem.memory.retention import SWEEP_BATCH
from kvmem.memory.rules import MemoryRules
from kvmem.memory.store import MemoryStore
from kvmem.tokens import TokenCounter
from tests.bench.report import table
from tests.bench.scale_fill import Shape, fill


def held_ms(
    store: MemoryStore, arms: list[Callable[[MemoryStore], int]], rounds: int
) -> list[list[float]]:
    """Milliseconds each transaction held the writer, per arm: the arms take turns, one
    transaction each a round, so that a shared machine's load falls on all of them alike."""
    times: list[list[float]] = [[] for _ in arms]
    for _ in range(rounds):
        for arm, step in enumerate(arms):
            started = time.perf_counter()
            step(store)
            times[arm].append((time.perf_counter() - started) * 1000)
    return times


def prune(store: MemoryStore) -> int:
    with store.database.writing(background=True) as session:
        return store.history_log.prune_all(session, SWEEP_BATCH)


def expire(batch: int) -> Callable[[MemoryStore], int]:
    def step(store: MemoryStore) -> int:
        with store.database.writing(background=True) as session:
            return expire_due_any(session.connection(), store.history_log, store.clock(), batch)

    return step


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.expiry", description=__doc__)
    parser.add_argument("--users", type=int, default=20_000)
    parser.add_argument("--batches", type=int, default=60, help="transactions per arm")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvmem-expiry-") as name:
        url = f"sqlite:///{Path(name) / 'kvmem.db'}"
        shape = Shape(
            entry_value="tea " * 20, entry_tokens=20, change_value="tea", expiring_every=1
        )
        fill(url, range(args.users), shape)
        database = Database.from_config(DatabaseConfig(url=url))
        store = MemoryStore(database, MemoryRules(), TokenCounter())
        arms: list[tuple[str, Callable[[MemoryStore], int]]] = [
            (f"history sweep, {SWEEP_BATCH} changes", prune),
            *[
                (
                    f"expiry sweep, {batch} entries"
                    + (" (EXPIRE_BATCH)" if batch == EXPIRE_BATCH else ""),
                    expire(batch),
                )
                for batch in sorted({10, EXPIRE_BATCH, 50, 100})
            ],
        ]
        measured = held_ms(store, [step for _, step in arms], args.batches)
        rows = []
        for (label, _), times in zip(arms, measured, strict=True):
            ordered = sorted(times)
            rows.append(
                [
                    label,
                    str(len(times)),
                    f"{statistics.median(times):.2f}",
                    f"{ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]:.2f}",
                    f"{ordered[-1]:.2f}",
                ]
            )
        database.dispose()
    print(f"{args.users:,} users, each with one entry due to expire and 10 expired changes")
    print(table(["transaction", "n", "p50 ms", "p99 ms", "max ms"], rows))


if __name__ == "__main__":
    main()
