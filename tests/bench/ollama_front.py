"""`python -m tests.bench.ollama_front [--quick] [--out DIR]`: what Ollama's front costs.

One kvmem (agent off, a user with 20 entries, the benchmark's scripted upstream) answers the
same streamed chat on `/v1/chat/completions` (plain, and asking for usage as the Ollama front
does) and on `/api/chat`, requests taking turns one by one so that drifts of the machine hit
all alike. Time to the first body byte (the first text, on all: the upstream's first chunk
carries it) and to the last, at c=1; the target is that the Ollama front adds at most 0.5 ms
of TTFB over `/v1` (the median of the differences to the neighbouring /v1 request). Also each
front's own work in-process, without server or model. Prints a markdown table and writes
`ollama_front.json` to the results folder.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import uvloop

from tests.bench.load import (
    JSON_HEADERS,
    Batch,
    chat_body,
    ms,
    percentile,
    session,
    stream_once,
)
from tests.bench.memory_path import memory_items
from tests.bench.servers import MAIN_MODEL, Server, fleet

RESULTS = Path(__file__).parent / "results"
TARGET_MS = 0.5
SEEDED_ENTRIES = 20


@dataclass(frozen=True)
class Plan:
    """How much to run."""

    mode: str
    warmup_requests: int = 100
    rounds: int = 20
    requests: int = 100
    cpu_rounds: int = 5
    in_process_iterations: int = 20_000


FULL = Plan("full")
QUICK = Plan(
    "quick", warmup_requests=20, rounds=4, requests=25, cpu_rounds=2, in_process_iterations=2_000
)


async def ndjson_once(client: aiohttp.ClientSession, url: str, body: bytes, batch: Batch) -> None:
    """One streamed `/api/chat`: time to the first body byte and to the last line."""
    await stream_once(client, url, body, batch, end=b'"done":true')


def v1_usage_body() -> bytes:
    """The /v1 streamed chat with `stream_options.include_usage`."""
    return json.dumps(
        {
            **json.loads(chat_body(MAIN_MODEL, stream=True)),
            "stream_options": {"include_usage": True},
        }
    ).encode()


def ollama_body() -> bytes:
    """The same chat as `chat_body(stream=True)`, in Ollama's shape (streamed by default)."""
    messages = json.loads(chat_body(MAIN_MODEL))["messages"]
    return json.dumps({"model": MAIN_MODEL, "messages": messages}).encode()


async def one_batch(
    once: Any, client: aiohttp.ClientSession, url: str, body: bytes, requests: int
) -> Batch:
    """`requests` streamed requests one after another."""
    batch = Batch()
    started = time.perf_counter()
    for _ in range(requests):
        await once(client, url, body, batch)
    batch.wall = time.perf_counter() - started
    return batch


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the server process has used so far."""
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


async def measure(kvmem: Server, plan: Plan) -> dict[str, Any]:
    """Each front: TTFB/TTLB p50/p99 from requests taking turns one by one (so each Ollama
    request has /v1 neighbours that met the same machine), the median of the Ollama request's
    differences to its neighbours, and the server's CPU per request from whole batches."""
    v1 = f"{kvmem.url}/v1/chat/completions"
    fronts = {
        "v1": (stream_once, v1, chat_body(MAIN_MODEL, stream=True)),
        # The Ollama front asks the upstream for usage (for its counts): /v1 asking the same.
        "v1_usage": (stream_once, v1, v1_usage_body()),
        "ollama": (ndjson_once, f"{kvmem.url}/api/chat", ollama_body()),
    }
    batches = {name: Batch() for name in fronts}
    diffs: dict[str, list[float]] = {"ttfb": [], "ttlb": [], "ttfb_usage": [], "ttlb_usage": []}
    cpu = dict.fromkeys(fronts, 0.0)
    cpu_requests = dict.fromkeys(fronts, 0)
    async with session(1) as client:
        for once, url, body in fronts.values():
            warm = await one_batch(once, client, url, body, plan.warmup_requests)
            if warm.errors:
                raise RuntimeError(f"{url} failed during warm-up: {warm.error_samples}")
        for index in range(plan.rounds * plan.requests):
            pair = {name: Batch() for name in fronts}
            order = list(fronts)[index % 3 :] + list(fronts)[: index % 3]  # each goes first in turn
            for name in order:
                once, url, body = fronts[name]
                await once(client, url, body, pair[name])
            for name, one in pair.items():
                batches[name].first_bytes += one.first_bytes
                batches[name].latencies += one.latencies
                batches[name].errors += one.errors
            if all(one.first_bytes for one in pair.values()):
                for suffix, base in (("", "v1"), ("_usage", "v1_usage")):
                    diffs["ttfb" + suffix].append(
                        pair["ollama"].first_bytes[0] - pair[base].first_bytes[0]
                    )
                    diffs["ttlb" + suffix].append(
                        pair["ollama"].latencies[0] - pair[base].latencies[0]
                    )
        for _ in range(plan.cpu_rounds):
            for name, (once, url, body) in fronts.items():
                before = cpu_seconds(kvmem.pid)
                done = await one_batch(once, client, url, body, plan.requests)
                cpu[name] += cpu_seconds(kvmem.pid) - before
                cpu_requests[name] += len(done.latencies)
    table: dict[str, Any] = {}
    for name, batch in batches.items():
        table[name] = {
            "n": len(batch.first_bytes),
            "errors": batch.errors,
            "ttfb_p50_ms": ms(percentile(batch.first_bytes, 50)),
            "ttfb_p99_ms": ms(percentile(batch.first_bytes, 99)),
            "ttlb_p50_ms": ms(percentile(batch.latencies, 50)),
            "ttlb_p99_ms": ms(percentile(batch.latencies, 99)),
            "server_cpu_ms_per_request": (
                round(1000 * cpu[name] / cpu_requests[name], 3) if cpu_requests[name] else None
            ),
        }
    added = ms(percentile(diffs["ttfb"], 50))
    cpu_of = {name: row["server_cpu_ms_per_request"] for name, row in table.items()}
    return {
        "fronts": table,
        "added_ttfb_p50_ms": added,
        "added_ttlb_p50_ms": ms(percentile(diffs["ttlb"], 50)),
        "added_server_cpu_ms_per_request": round(cpu_of["ollama"] - cpu_of["v1"], 3),
        "over_v1_usage": {
            "added_ttfb_p50_ms": ms(percentile(diffs["ttfb_usage"], 50)),
            "added_ttlb_p50_ms": ms(percentile(diffs["ttlb_usage"], 50)),
            "added_server_cpu_ms_per_request": round(cpu_of["ollama"] - cpu_of["v1_usage"], 3),
        },
        "target": f"Ollama front adds at most {TARGET_MS} ms TTFB p50 over /v1",
        "result": "PASS" if added <= TARGET_MS else "MISS",
    }


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    """A `chat.completion.chunk` as litellm hands it to kvmem."""
    return {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "bench-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


STREAM = [
    chunk({"role": "assistant", "content": "word0 "}),
    *(chunk({"content": f"word{i} "}) for i in range(1, 10)),
    chunk({}, "stop"),
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "bench-model",
        "choices": [],
        "usage": {"prompt_tokens": 30, "completion_tokens": 10, "total_tokens": 40},
    },
]


async def front_work(iterations: int) -> dict[str, Any]:
    """What each front does on its own, in-process, without the server or the model: read the
    request (parse, validate, translate) and render the stream (first piece, then the rest).
    The model call, memory and the HTTP server are the same for both and left out."""
    from kvmem.chat.main_call import chat_lines
    from kvmem.server.bodies import parse_json, validate
    from kvmem.server.ollama_replies import Reply, has_output
    from kvmem.server.ollama_shapes import ChatBody
    from kvmem.server.routes import openai

    async def chunks() -> Any:
        for one in STREAM:
            yield one

    async def v1() -> tuple[float, float]:
        started = time.perf_counter()
        body = validate(openai.CompletionRequest, parse_json(chat_body(MAIN_MODEL, stream=True)))
        chat_lines(body.messages)
        body.params()
        rendered = openai._events(chunks())
        await anext(rendered)
        first = time.perf_counter()
        async for _ in rendered:
            pass
        return first - started, time.perf_counter() - started

    async def ollama() -> tuple[float, float]:
        started = time.perf_counter()
        body = validate(ChatBody, parse_json(ollama_body()))
        chat_lines(body.openai_messages())
        body.params()
        has_output(STREAM[0])
        rendered = Reply("chat", MAIN_MODEL, time.monotonic_ns()).lines(chunks())
        await anext(rendered)
        first = time.perf_counter()
        async for _ in rendered:
            pass
        return first - started, time.perf_counter() - started

    results: dict[str, Any] = {}
    for name, work in (("v1", v1), ("ollama", ollama)):
        for _ in range(iterations // 10):
            await work()
        timings = [await work() for _ in range(iterations)]
        results[name] = {
            "to_first_piece_us": round(1e6 * percentile([t[0] for t in timings], 50), 1),
            "whole_stream_us": round(1e6 * percentile([t[1] for t in timings], 50), 1),
        }
    results["added_to_first_piece_us"] = round(
        results["ollama"]["to_first_piece_us"] - results["v1"]["to_first_piece_us"], 1
    )
    results["added_whole_stream_us"] = round(
        results["ollama"]["whole_stream_us"] - results["v1"]["whole_stream_us"], 1
    )
    return results


async def seed(kvmem: Server) -> None:
    """The user's entries, injected into every request as in the main benchmark."""
    async with session(1) as client:
        for key, value in memory_items(SEEDED_ENTRIES):
            async with client.put(
                f"{kvmem.url}/memory/{key}", data=json.dumps({"value": value}), headers=JSON_HEADERS
            ) as response:
                if response.status not in (200, 201):
                    raise RuntimeError(f"PUT /memory/{key}: {response.status}")


async def run(plan: Plan, workdir: Path) -> dict[str, Any]:
    """Start the upstream and one kvmem, seed, measure."""
    with fleet(workdir) as servers:
        upstream = servers.upstream(0.020, 0.050, 10, 0.002)
        config, port = servers.kvmem_config("kvmem_off", upstream, None)
        kvmem = servers.kvmem("kvmem_off", config, port)
        upstream.wait_ready(30)
        kvmem.wait_ready(90)
        await seed(kvmem)
        results = await measure(kvmem, plan)
    results["in_process"] = await front_work(plan.in_process_iterations)
    return results


def table(results: dict[str, Any]) -> str:
    """The markdown table of one run."""
    lines = [
        "| front | n | TTFB p50 | TTFB p99 | TTLB p50 | TTLB p99 | server CPU/request | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, label in (
        ("v1", "`/v1/chat/completions`"),
        ("v1_usage", "`/v1/chat/completions`, `include_usage`"),
        ("ollama", "`/api/chat`"),
    ):
        row = results["fronts"][name]
        lines.append(
            f"| {label} | {row['n']} | {row['ttfb_p50_ms']:.2f} ms | "
            f"{row['ttfb_p99_ms']:.2f} ms | {row['ttlb_p50_ms']:.2f} ms | "
            f"{row['ttlb_p99_ms']:.2f} ms | {row['server_cpu_ms_per_request']:.2f} ms | "
            f"{row['errors']} |"
        )
    lines.append("")
    lines.append(
        f"Ollama front, added TTFB (median of paired differences): "
        f"{results['added_ttfb_p50_ms']:+.3f} ms "
        f"(TTLB {results['added_ttlb_p50_ms']:+.3f} ms, server CPU per request "
        f"{results['added_server_cpu_ms_per_request']:+.3f} ms); "
        f"{results['target']}: {results['result']}"
    )
    usage = results["over_v1_usage"]
    lines.append(
        f"Over /v1 asking for usage as the Ollama front does: TTFB "
        f"{usage['added_ttfb_p50_ms']:+.3f} ms, TTLB {usage['added_ttlb_p50_ms']:+.3f} ms, "
        f"server CPU per request {usage['added_server_cpu_ms_per_request']:+.3f} ms"
    )
    work = results["in_process"]
    lines.append("")
    lines.append(
        f"In-process, each front's own work (read the request, render the stream; p50): "
        f"/v1 {work['v1']['to_first_piece_us']:.0f} us to the first piece, "
        f"{work['v1']['whole_stream_us']:.0f} us in all; /api/chat "
        f"{work['ollama']['to_first_piece_us']:.0f} us and "
        f"{work['ollama']['whole_stream_us']:.0f} us (added "
        f"{work['added_to_first_piece_us']:+.0f} us and {work['added_whole_stream_us']:+.0f} us)"
    )
    return "\n".join(lines)


def main() -> int:
    """Parse the arguments, run, print and write the results."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.bench.ollama_front", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true", help="a few rounds, for a smoke run")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    plan = QUICK if args.quick else FULL
    workdir = Path(tempfile.mkdtemp(prefix="kvmem-bench-ollama-"))
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            results = runner.run(run(plan, workdir))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    results["mode"] = plan.mode
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ollama_front.json").write_text(json.dumps(results, indent=2) + "\n")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
