"""`python -m tests.bench.profile`: where a kvmem server's CPU time goes, per request.

Starts the benchmark's scripted upstream and one `kvmem serve` (SQLite, a user with 20
entries, the direct path), puts a steady load on `/v1/chat/completions` and samples the
server with py-spy while it runs: non-streamed at c=32 with the agent off and with it on,
and streamed at c=1 with the agent off. For each, it prints the server's CPU milliseconds
per request (from the kernel's accounting) and splits them by where py-spy found the
process busy:

- **self time by package**: the innermost Python frame of each sample (`kvmem.memory.store`,
  `starlette`, `httpcore`, `sqlalchemy`, `asyncio`, ...); time in C code is charged to the
  Python frame that called it (a SQLite query to the SQLAlchemy frame that ran it);
- **by kvmem module**: each sample charged to the innermost kvmem frame in its stack, i.e.
  that module's own code and the library calls it makes (a sample in httpcore under
  `kvmem.upstream.direct_client` is the direct client's); samples with no kvmem frame are the server
  and the event loop (uvicorn's HTTP parsing, task scheduling);
- **threads**: the event loop against worker threads (database work, block rendering).

Writes `profile.md` and `profile.json` to the results folder. Needs py-spy (in the `bench`
extra) and permission to attach to a child process (root, or `ptrace_scope` 0).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvloop

from tests.bench.latency import Target
from tests.bench.load import chat_body, run_batch, seed, session
from tests.bench.memory_path import memory_items
from tests.bench.report import table
from tests.bench.servers import MAIN_MODEL, AgentSpec, Fleet, Server, fleet, tool

RESULTS = Path(__file__).parent / "results"
FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")
TOP = 14  # rows per table


@dataclass(frozen=True)
class Scenario:
    """One load, sampled while it runs."""

    name: str
    agent: bool
    concurrency: int
    stream: bool


SCENARIOS = (
    Scenario("c=32, non-streamed, agent off", agent=False, concurrency=32, stream=False),
    Scenario("c=32, non-streamed, agent on", agent=True, concurrency=32, stream=False),
    Scenario("c=1, streamed, agent off", agent=False, concurrency=1, stream=True),
)


def package(file: str) -> str:
    """What a frame's file belongs to: `kvmem.<module>`, a top-level package or a stdlib
    module (py-spy prints paths relative to the entry of `sys.path` they were found in)."""
    parts = file.replace("\\", "/").split("/")
    if parts[0] == "kvmem" and len(parts) > 1:
        return "kvmem." + "/".join(parts[1:]).removesuffix(".py").replace("/", ".")
    if file.startswith("<"):
        return file  # <frozen ...>, <string>
    return parts[0].removesuffix(".py")


def frames(stack: str) -> list[tuple[str, str]]:
    """(function, file) of each frame of a collapsed stack, outermost first."""
    found = []
    for frame in stack.split(";"):
        match = FRAME.match(frame)
        found.append((match["function"], match["file"]) if match else (frame, frame))
    return found


def summarize(raw: str) -> dict[str, Any]:
    """Shares of the samples in py-spy's raw (collapsed stack) output."""
    self_time: Counter[str] = Counter()
    owner: Counter[str] = Counter()
    functions: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        stack_frames = frames(stack)
        total += count
        function, file = stack_frames[-1]
        self_time[package(file)] += count
        functions[f"{package(file)}: {function}"] += count
        owners = [package(f) for _, f in stack_frames if package(f).startswith("kvmem.")]
        owner[owners[-1] if owners else "(no kvmem frame: server, event loop)"] += count
        worker = any(f == "threading.py" and fn.endswith("_bootstrap") for fn, f in stack_frames)
        threads["worker threads" if worker else "event loop"] += count

    def shares(counter: Counter[str]) -> list[tuple[str, float]]:
        return [(name, count / total) for name, count in counter.most_common()] if total else []

    kvmem_self = sum(c for name, c in self_time.items() if name.startswith("kvmem."))
    return {
        "samples": total,
        "kvmem_self_share": kvmem_self / total if total else 0.0,
        "self": shares(self_time),
        "kvmem_owner": shares(owner),
        "functions": shares(functions),
        "threads": shares(threads),
    }


async def profile_one(
    server: Server, scenario: Scenario, seconds: float, rate: int, workdir: Path
) -> dict[str, Any]:
    """Load `server` for `seconds` while py-spy samples it; the summary."""
    target = Target(scenario.name, f"{server.url}/v1/chat/completions", MAIN_MODEL, server.pid)
    body = chat_body(MAIN_MODEL, stream=scenario.stream)
    out = workdir / f"profile-{len(list(workdir.glob('profile-*')))}.txt"
    async with session(scenario.concurrency) as client:
        warm = await run_batch(
            client,
            target.url,
            body,
            requests=200,
            concurrency=scenario.concurrency,
            seconds=30,
            stream=scenario.stream,
        )
        if warm.errors:
            raise RuntimeError(f"{scenario.name}: warm-up failed: {warm.error_samples}")
        spy = subprocess.Popen(
            # --gil: only the thread holding the GIL, i.e. the Python work the process does
            # one piece at a time (waiting threads and the idle loop are not samples);
            # --nonblocking: the process is not paused for each sample.
            [
                *tool("py-spy"),
                "record",
                "--gil",
                "--nonblocking",
                "--format",
                "raw",
                "--output",
                str(out),
                "--pid",
                str(server.pid),
                "--rate",
                str(rate),
                "--duration",
                str(int(seconds)),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        await asyncio.sleep(0.5)  # py-spy attaches
        cpu_before = target.cpu_seconds()
        batch = await run_batch(
            client,
            target.url,
            body,
            requests=10**9,
            concurrency=scenario.concurrency,
            seconds=seconds - 1.0,
            stream=scenario.stream,
        )
        cpu = target.cpu_seconds() - cpu_before
    output, _ = await asyncio.to_thread(spy.communicate, timeout=seconds + 30)
    if spy.returncode != 0 or not out.exists():
        raise RuntimeError(f"py-spy failed ({spy.returncode}): {output.decode()[-2000:]}")
    summary = summarize(out.read_text())
    requests = len(batch.latencies)
    summary.update(
        scenario=scenario.name,
        requests=requests,
        errors=batch.errors,
        rps=round(requests / batch.wall, 1) if batch.wall else None,
        cpu_ms_per_request=round(1000 * cpu / requests, 3) if requests else None,
        # py-spy pauses the process for each sample; the CPU split is what matters here.
        note=f"py-spy at {rate} Hz",
    )
    return summary


def markdown(profiles: list[dict[str, Any]]) -> str:
    """A section per scenario: CPU ms per request split by package, kvmem module, thread."""
    out = [
        "# Where kvmem's CPU time goes per request (py-spy)",
        "",
        "One `kvmem serve` on SQLite (20 entries injected, direct path) in front of the "
        "benchmark's scripted upstream; `python -m tests.bench.profile`. ms/req = the "
        "server's CPU ms per request x the share of py-spy's samples; py-spy samples the "
        "thread holding the GIL (`--gil`), so the shares are of the Python work, which "
        "runs one piece at a time.",
    ]
    for one in profiles:
        per = one["cpu_ms_per_request"] or 0.0
        out += [
            "",
            f"## {one['scenario']}",
            "",
            f"{one['requests']} requests ({one['rps']} req/s, {one['errors']} errors); "
            f"server CPU {per:.3f} ms per request; {one['samples']} samples "
            f"({one['note']}); kvmem's own code (self time) "
            f"{100 * one['kvmem_self_share']:.1f}%.",
            "",
            "Self time by package:",
            "",
            table(["package", "share", "ms/req"], rows(one["self"], per)),
            "",
            "By the innermost kvmem frame (its code and the library calls it makes):",
            "",
            table(["module", "share", "ms/req"], rows(one["kvmem_owner"], per)),
            "",
            "Hottest functions (self time):",
            "",
            table(["function", "share", "ms/req"], rows(one["functions"], per, 10)),
            "",
            "Threads:",
            "",
            table(["thread", "share", "ms/req"], rows(one["threads"], per)),
        ]
    return "\n".join(out) + "\n"


def rows(
    pairs: list[tuple[str, float]], per_request_ms: float, limit: int = TOP
) -> list[list[Any]]:
    """Table rows: name, share of the samples, CPU ms per request."""
    return [
        [name, f"{100 * share:.1f}%", f"{per_request_ms * share:.3f}"]
        for name, share in pairs[:limit]
    ]


async def run(seconds: float, rate: int, workdir: Path) -> list[dict[str, Any]]:
    """Every scenario, each against a fresh server of its kind."""
    profiles = []
    with fleet(workdir) as servers:
        upstream = servers.upstream(0.020, 0.050, 10, 0.002)
        upstream.wait_ready(30)
        for scenario in SCENARIOS:
            server = start(servers, upstream, scenario)
            await seed(server.url, memory_items(20))
            profiles.append(await profile_one(server, scenario, seconds, rate, workdir))
            servers.stop(server)
            print(f"[profile] {scenario.name}: done", file=sys.stderr, flush=True)
    return profiles


def start(servers: Fleet, upstream: Server, scenario: Scenario) -> Server:
    """A ready kvmem with or without its agent."""
    name = "kvmem_profile_" + ("on" if scenario.agent else "off")
    agent = AgentSpec("bench-agent") if scenario.agent else None
    server = servers.kvmem(name, *servers.kvmem_config(name, upstream, agent))
    server.wait_ready(90)
    return server


def main() -> int:
    """Parse the arguments, profile, print and write the results."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.bench.profile", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--seconds", type=float, default=20.0, help="sampling per scenario")
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="kvmem-profile-"))
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            profiles = runner.run(run(args.seconds, args.rate, workdir))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    text = markdown(profiles)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "profile.md").write_text(text)
    (args.out / "profile.json").write_text(json.dumps(profiles, indent=2) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
