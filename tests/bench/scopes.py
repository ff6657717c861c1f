"""`python -m tests.bench.scopes [--quick]`: what a scoped turn's memory read costs beside an
unscoped one's (issue 39: "a scoped turn costs at most one more indexed read").

In-process, on a migrated SQLite database holding `USERS` users, each with 20 entries of their
own and 10 in each of 3 scopes: for each user in turn, `MemoryStore.snapshot(user)` (an
unscoped turn: their own layer) and `snapshot(user, scope)` (a scoped turn: their own layer and
one scope's), in rounds whose order alternates. `cold`: each read follows a write that bumped
the user's memory version (the entries are read again); `warm`: nothing changed (only the
version row is read). Prints p50/p99 of each, the scoped/unscoped ratio and the statements
each read ran (the raw sqlite3 trace), which is the claim checked: the same number.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

USERS = 500
SCOPES = ("project:kitchen", "project:thesis", "model:llama3.1")
OWN_KEYS = 20
SCOPED_KEYS = 10


def _config(path: Path) -> Any:
    from kvmem.config import Config

    return Config.model_validate(
        {
            "database": {"url": f"sqlite:///{path}"},
            "memory": {"scopes": {"validKeys": [f"note_{n}" for n in range(SCOPED_KEYS)]}},
        }
    )


def _fill(store: Any, users: int) -> None:
    from kvmem.memory.imports import LayerImport

    for n in range(users):
        layers = {
            "": LayerImport([(f"fact_{k}", f"fact {k} of user {n}") for k in range(OWN_KEYS)])
        }
        for scope in SCOPES:
            layers[scope] = LayerImport(
                [(f"note_{k}", f"{scope} note {k} of user {n}") for k in range(SCOPED_KEYS)]
            )
        store.import_layers(f"user-{n}", layers)


def _percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered) * 1e3, ordered[int(0.99 * (len(ordered) - 1))] * 1e3


def _statements(store: Any, read: Callable[[], Any]) -> int:
    from tests.support.plans import sqlite_trace

    seen: list[str] = []
    with sqlite_trace(seen.append):
        read()
    return sum(s.lstrip().upper().startswith("SELECT") for s in seen)


def measure(workdir: Path, users: int, rounds: int) -> dict[str, Any]:
    """The reads' times (ms) and statement counts, unscoped against scoped."""
    from kvmem.db.engine import Database
    from kvmem.db.migrate import upgrade
    from kvmem.memory.rules import MemoryRules
    from kvmem.memory.store import MemoryStore
    from kvmem.tokens import TokenCounter

    config = _config(workdir / "scopes.db")
    database = Database.from_config(config.database)
    try:
        upgrade(database.engine)
        store = MemoryStore(database, MemoryRules.from_config(config.memory), TokenCounter())
        _fill(store, users)
        times: dict[str, list[float]] = {
            f"{kind} {heat}": [] for kind in ("unscoped", "scoped") for heat in ("cold", "warm")
        }
        for round_ in range(rounds):
            order = ("unscoped", "scoped") if round_ % 2 == 0 else ("scoped", "unscoped")
            for n in range(users):
                user, scope = f"user-{n}", SCOPES[n % len(SCOPES)]
                for kind in order:
                    layer = scope if kind == "scoped" else ""
                    # A write of another scope bumps the user's version: the next read is cold.
                    other = SCOPES[(n + 1) % len(SCOPES)]
                    store.set(user, "note_0", f"round {round_} {kind}", scope=other)
                    for heat in ("cold", "warm"):
                        start = time.perf_counter()
                        entries = store.snapshot(user, layer).entries
                        times[f"{kind} {heat}"].append(time.perf_counter() - start)
                    expected = OWN_KEYS + (SCOPED_KEYS if kind == "scoped" else 0)
                    if len(entries) != expected:
                        raise RuntimeError(f"{user} {kind}: {len(entries)} entries, not {expected}")
        store.set("user-0", "note_0", "count the statements", scope=SCOPES[1])
        counts = {
            "unscoped cold": _statements(store, lambda: store.snapshot("user-0")),
            "unscoped warm": _statements(store, lambda: store.snapshot("user-0")),
        }
        store.set("user-0", "note_0", "count the statements again", scope=SCOPES[1])
        counts["scoped cold"] = _statements(store, lambda: store.snapshot("user-0", SCOPES[0]))
        counts["scoped warm"] = _statements(store, lambda: store.snapshot("user-0", SCOPES[0]))
    finally:
        database.dispose()
    return {"times": {k: _percentiles(v) for k, v in times.items()}, "statements": counts}


def report(result: dict[str, Any], users: int, rounds: int) -> str:
    """The table: p50/p99 of each read, scoped/unscoped, and the statements per read."""
    times, counts = result["times"], result["statements"]
    lines = [
        f"Scoped against unscoped memory reads: {users} users x {rounds} rounds, "
        f"{OWN_KEYS} own entries and {len(SCOPES)} scopes of {SCOPED_KEYS} each per user",
        "",
        "| read | unscoped p50 / p99 (ms) | scoped p50 / p99 (ms) | scoped / unscoped p50 "
        "| SELECTs unscoped / scoped |",
        "|---|---|---|---|---|",
    ]
    for heat in ("cold", "warm"):
        plain, scoped = times[f"unscoped {heat}"], times[f"scoped {heat}"]
        lines.append(
            f"| {heat} | {plain[0]:.3f} / {plain[1]:.3f} | {scoped[0]:.3f} / {scoped[1]:.3f} "
            f"| {scoped[0] / plain[0]:.2f} | {counts[f'unscoped {heat}']} / "
            f"{counts[f'scoped {heat}']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.scopes", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="50 users, 2 rounds (a smoke run)")
    args = parser.parse_args(argv)
    users, rounds = (50, 2) if args.quick else (USERS, 6)
    with tempfile.TemporaryDirectory() as folder:
        result = measure(Path(folder), users, rounds)
    sys.stdout.write(report(result, users, rounds))
    counts = result["statements"]
    same = all(counts[f"scoped {h}"] == counts[f"unscoped {h}"] for h in ("cold", "warm"))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
