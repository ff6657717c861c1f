"""`python -m tests.bench.foreign_import`: `kvmem import --from` over 100,000 memories of
10,000 users, for each source, in a real `kvmem` process on a fresh SQLite database.

Makes the inputs first (not timed): an Open WebUI `webui.db` with 0.12.4's `memory` table (its
`CREATE TABLE` and indexes copied from the fixture that Open WebUI's own migrations made), a
LibreChat `mongoexport` in JSON lines (ten keys per user) and a mem0 `{"results": [...]}` file,
each in shuffled order as a real database or export would be. Then times each import, and the
same import again (nothing left to change), and prints the wall time, the imported memories per
second and the process's peak resident memory (its own `ru_maxrss`, from `wait4`). `--quick`
runs 2,000 memories of 200 users, to prove it still works.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

FIXTURE = Path(__file__).parent.parent / "data" / "importers" / "webui-0.12.4.db"
BASE = 1_760_000_000
WORDS = [
    "likes",
    "hiking",
    "prefers",
    "tea",
    "lives",
    "works",
    "as",
    "a",
    "nurse",
    "teacher",
    "engineer",
    "in",
    "Lisbon",
    "Leeds",
    "Porto",
    "has",
    "two",
    "cats",
    "a",
    "labrador",
    "allergic",
    "to",
    "peanuts",
    "vegetarian",
    "learning",
    "Rust",
    "Spanish",
    "piano",
    "and",
    "runs",
    "every",
    "morning",
    "reads",
    "science",
    "fiction",
    "plays",
    "chess",
    "on",
    "weekends",
]


def sentence(rng: random.Random, number: int) -> str:
    """A memory of about 12 words, unique by its number."""
    return f"{' '.join(rng.choices(WORDS, k=11)).capitalize()} (note {number})."


def make_inputs(folder: Path, users: int, per_user: int) -> dict[str, Path]:
    """The three sources' files, each holding `users * per_user` memories in random order."""
    rng = random.Random(41)
    owners = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(users)]
    # (the user's id, the memory's number, its text); memory n is the user's n % per_user-th.
    rows = [(owners[n // per_user], n, sentence(rng, n)) for n in range(users * per_user)]
    rng.shuffle(rows)

    webui = folder / "webui.db"
    schema = sqlite3.connect(FIXTURE).execute(
        "SELECT sql FROM sqlite_master WHERE tbl_name = 'memory' AND sql IS NOT NULL"
    )
    db = sqlite3.connect(webui)
    for (statement,) in schema:
        db.execute(statement)
    db.executemany(
        "INSERT INTO memory (id, user_id, content, created_at, updated_at) VALUES (?, ?, ?, ?, ?)",
        [(str(uuid.uuid4()), user, text, BASE + n, BASE + n) for user, n, text in rows],
    )
    db.commit()
    db.close()

    librechat = folder / "memoryentries.jsonl"
    with librechat.open("w") as file:
        for user, n, text in rows:
            oid = uuid.UUID(user).hex[:24]  # a 24-hex ObjectId per user
            file.write(
                json.dumps(
                    {
                        "_id": {"$oid": f"{n:024x}"},
                        "userId": {"$oid": oid},
                        "key": f"note_{'abcdefghij'[n % per_user % 10]}{n % per_user // 10}",
                        "__v": 0,
                        "tokenCount": 15,
                        "updated_at": {"$date": f"2026-06-{1 + n % 28:02d}T10:00:00.000Z"},
                        "value": text,
                    }
                )
                + "\n"
            )

    mem0 = folder / "mem0.json"
    with mem0.open("w") as file:
        file.write('{"results": [')
        for index, (user, n, text) in enumerate(rows):
            record = {
                "id": str(uuid.uuid4()),
                "memory": text,
                "hash": f"{n:032x}",
                "metadata": None,
                "created_at": f"2026-09-{1 + n % 28:02d}T07:31:02.118345+00:00",
                "updated_at": None,
                "user_id": user,
            }
            file.write(("," if index else "") + json.dumps(record))
        file.write("]}")
    return {"openwebui": webui, "librechat": librechat, "mem0": mem0}


def run_import(folder: Path, source: str, path: Path) -> tuple[float, float, float, dict]:
    """One `kvmem import --from SOURCE PATH --json`: seconds, CPU seconds, peak RSS in MiB,
    its JSON."""
    command = [sys.executable, "-m", "kvmem", "import", "--from", source, str(path), "--json"]
    out = folder / "out.json"
    started = time.perf_counter()
    with out.open("wb") as stdout:
        process = subprocess.Popen(command, cwd=folder, stdout=stdout, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"{source}: exit {process.returncode}: {process.stderr.read().decode()}")
    cpu = usage.ru_utime + usage.ru_stime
    return seconds, cpu, usage.ru_maxrss / 1024, json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2,000 memories of 200 users")
    parser.add_argument("--sources", default="openwebui,librechat,mem0")
    args = parser.parse_args()
    users, per_user = (200, 10) if args.quick else (10_000, 10)
    print(f"kvmem import --from: {users * per_user:,} memories of {users:,} users")
    print(
        f"{'source':<10} {'run':<7} {'input MB':>8} {'seconds':>8} {'CPU s':>6} "
        f"{'memories/s':>10} {'peak MiB':>8}  result"
    )
    with tempfile.TemporaryDirectory(prefix="kvmem-bench-import-") as name:
        folder = Path(name)
        inputs = make_inputs(folder, users, per_user)
        for source in args.sources.split(","):
            config = folder / "memory.yaml"
            (folder / "kv.db").unlink(missing_ok=True)
            config.write_text("database: {url: 'sqlite:///kv.db'}\nmemory: {charLimit: 10000}\n")
            size = inputs[source].stat().st_size / 1e6
            for run in ("first", "again"):
                seconds, cpu, peak, document = run_import(folder, source, inputs[source])
                counts = [sum(u[k] for u in document["users"]) for k in ("added", "unchanged")]
                refused = sum(bool(u["refused"]) for u in document["users"])
                print(
                    f"{source:<10} {run:<7} {size:>8.1f} {seconds:>8.1f} {cpu:>6.1f} "
                    f"{users * per_user / seconds:>10,.0f} {peak:>8.0f}  "
                    f"{len(document['users']):,} users, {counts[0]:,} added, "
                    f"{counts[1]:,} unchanged, {refused} refused"
                )


if __name__ == "__main__":
    main()
