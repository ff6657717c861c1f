"""`python -m tests.bench.inline [--quick]`: `placement: separate` against `placement: inline`.

Plays 100 chat turns (one in ten asks to remember something) through `POST /chat` of two
kvmem apps on the scripted upstream, and counts the upstream calls and the agent's tokens
per 100 turns: the agent's input (instructions, tool schemas, memory status and chat window,
as o200k_base counts what the upstream received) and output (its tool calls) for
`separate`; for `inline`, the marker instructions added to every main call and the markers
the main model writes. Then times streamed `/v1/chat/completions` replies of 200 chunks on
both apps taking turns (time to the first chunk and per chunk after it, in process) and the
filter alone (microseconds per chunk fed). Prints markdown tables; asserts nothing.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from starlette.testclient import TestClient  # noqa: E402

from kvmem.agent.markers import MarkerFilter, marker_limit  # noqa: E402
from kvmem.agent.prompts import render_marker_instructions  # noqa: E402
from kvmem.agent.tools import tool_definitions  # noqa: E402
from kvmem.config import Config  # noqa: E402
from kvmem.db.engine import Database  # noqa: E402
from kvmem.db.migrate import upgrade  # noqa: E402
from kvmem.server.app import create_app  # noqa: E402
from kvmem.tokens import TokenCounter  # noqa: E402
from tests.support.apps import (  # noqa: E402
    AGENT_MODEL,
    LOCAL_URL,
    MAIN_MODEL,
    set_memory,
    wait_agents_idle,
)
from tests.support.upstream import Reply, ScriptedUpstream  # noqa: E402

ANSWER = "Sure, here is what I would suggest for that: start small and keep notes."
FACTS = [
    ("city", "Berlin"),
    ("diet", "vegetarian"),
    ("language", "learning German, level A2"),
    ("name", "Ada"),
    ("code_style", "TypeScript for code answers"),
]


def turns(count: int) -> list[tuple[str, tuple[str, str] | None]]:
    """`count` user messages; every tenth asks to remember a fact."""
    out: list[tuple[str, tuple[str, str] | None]] = []
    for index in range(count):
        if index % 10 == 9:
            key, value = FACTS[(index // 10) % len(FACTS)]
            out.append((f"Please remember: my {key.replace('_', ' ')} is {value}.", (key, value)))
        else:
            out.append((f"Question {index}: how would you plan a small project?", None))
    return out


def app(
    name: str, upstream: ScriptedUpstream, folder: Path, tokens: TokenCounter, placement: str
) -> TestClient:
    config = Config.model_validate(
        {
            "database": {"url": f"sqlite:///{folder / f'{name}.db'}"},
            "chat": {"model": f"openai/{MAIN_MODEL}", "api_base": upstream.url, "api_key": "k"},
            "memory": {
                "agent": {
                    "provider": "openai",
                    "model": AGENT_MODEL,
                    "api_base": upstream.url,
                    "api_key": "k",
                    "placement": placement,
                }
            },
        }
    )
    database = Database.from_config(config.database)
    upgrade(database.engine)
    return TestClient(create_app(config, database=database, tokens=tokens), base_url=LOCAL_URL)


def play(
    placement: str, count: int, upstream: ScriptedUpstream, folder: Path, tokens: TokenCounter
) -> dict[str, Any]:
    """Play the turns on a fresh app; the upstream calls and tokens they cost."""
    main_before, agent_before = (
        len(upstream.received(MAIN_MODEL)),
        len(upstream.received(AGENT_MODEL)),
    )
    marker_tokens = agent_output = 0
    with app(placement, upstream, folder, tokens, placement) as client:
        conversation_id = None
        for message, fact in turns(count):
            reply = ANSWER
            if fact and placement == "inline":
                marker = f"\n[MEMORY: {fact[0]} = {fact[1]}]"
                marker_tokens += tokens.count(marker)
                reply += marker
            upstream.script(MAIN_MODEL, Reply(content=reply))
            if fact and placement == "separate":
                call = set_memory(*fact)
                agent_output += tokens.count(call["name"] + json.dumps(call["arguments"]))
                upstream.script(AGENT_MODEL, Reply(content=None, tool_calls=[call]))
            body: dict[str, Any] = {"message": message}
            if conversation_id:
                body["conversation_id"] = conversation_id
            conversation_id = client.post("/chat", json=body).json()["conversation_id"]
            wait_agents_idle(client)
        stored = len(client.get("/memory").json()["memories"])
    agent_requests = upstream.received(AGENT_MODEL)[agent_before:]
    tools = tokens.count(json.dumps(tool_definitions(None)))
    agent_input = sum(tokens.count(m["content"] or "") for r in agent_requests for m in r.messages)
    return {
        "main_calls": len(upstream.received(MAIN_MODEL)) - main_before,
        "agent_calls": len(agent_requests),
        "agent_input": agent_input + tools * len(agent_requests),
        "agent_output": agent_output,
        "marker_tokens": marker_tokens,
        "stored": stored,
    }


def stream_timing(
    upstream: ScriptedUpstream, folder: Path, tokens: TokenCounter, requests: int
) -> dict[str, tuple[float, float]]:
    """Per placement: median time to the first chunk (ms) and per chunk after it (µs) of
    streamed /v1 replies of 200 chunks, the two apps taking turns (so load hits both alike)."""
    pieces = [f"word{i} " for i in range(199)] + ["[MEMORY: city = Berlin]"]
    samples: dict[str, tuple[list[float], list[float]]] = {
        p: ([], []) for p in ("separate", "inline")
    }
    clients = {p: app(f"{p}-stream", upstream, folder, tokens, p) for p in samples}
    for client in clients.values():
        client.__enter__()
    try:
        for _ in range(requests):
            for placement, client in clients.items():
                upstream.script(MAIN_MODEL, Reply(chunks=pieces))
                started = time.perf_counter()
                ttfb = None
                with client.stream(
                    "POST",
                    "/v1/chat/completions",
                    json={
                        "model": f"openai/{MAIN_MODEL}",
                        "stream": True,
                        "messages": [{"role": "user", "content": "Tell me a story."}],
                    },
                ) as response:
                    for _line in response.iter_lines():
                        if ttfb is None:
                            ttfb = time.perf_counter() - started
                total = time.perf_counter() - started
                assert ttfb is not None
                samples[placement][0].append(ttfb * 1e3)
                samples[placement][1].append((total - ttfb) / len(pieces) * 1e6)
                wait_agents_idle(client)
    finally:
        for client in clients.values():
            client.__exit__(None, None, None)
    return {
        p: (statistics.median(first), statistics.median(chunk))
        for p, (first, chunk) in samples.items()
    }


def filter_cost(repeats: int) -> tuple[float, float]:
    """Microseconds per chunk fed to the filter: plain text, and a reply with markers."""
    plain = [f"word{i} " for i in range(200)]
    marked = plain[:190] + list("[MEMORY: city = Berlin]\n[FORGET: name]")
    out = []
    for chunks in (plain, marked):
        started = time.perf_counter()
        for _ in range(repeats):
            markers = MarkerFilter(marker_limit(10_000))
            for chunk in chunks:
                markers.feed(chunk)
            markers.finish()
        out.append((time.perf_counter() - started) / repeats / len(chunks) * 1e6)
    return out[0], out[1]


def main() -> int:
    quick = "--quick" in sys.argv
    count = 20 if quick else 100
    tokens = TokenCounter()
    upstream = ScriptedUpstream().start()
    upstream.default(AGENT_MODEL, Reply(content=None))  # the agent writes nothing
    try:
        with tempfile.TemporaryDirectory() as name:
            folder = Path(name)
            results = {p: play(p, count, upstream, folder, tokens) for p in ("separate", "inline")}
            timing = stream_timing(upstream, folder, tokens, 5 if quick else 50)
    finally:
        upstream.stop()
    scale = 100 / count
    instructions = tokens.count("\n\n" + render_marker_instructions(None, 10_000))
    print(f"\n## Inline memory: per 100 chat turns ({count} played, one in ten asks to remember)\n")
    print(
        "| placement | upstream calls | agent calls | agent input tokens | agent output tokens "
        "| instruction tokens added to main calls | marker tokens written | facts stored |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for placement, r in results.items():
        added = instructions * r["main_calls"] if placement == "inline" else 0
        print(
            f"| {placement} | {(r['main_calls'] + r['agent_calls']) * scale:.0f} "
            f"| {r['agent_calls'] * scale:.0f} | {r['agent_input'] * scale:,.0f} "
            f"| {r['agent_output'] * scale:,.0f} | {added * scale:,.0f} "
            f"| {r['marker_tokens'] * scale:,.0f} | {r['stored']} |"
        )
    print(
        f"\nInstruction tokens `inline` adds to every main call (no `validKeys`): {instructions}."
    )
    print("\n## Inline memory: streaming cost (`/v1/chat/completions`, 200 chunks, in process)\n")
    print("| placement | time to first chunk, median | per chunk after it, median |")
    print("|---|---:|---:|")
    for placement, (ttfb, chunk) in timing.items():
        print(f"| {placement} | {ttfb:.1f} ms | {chunk:.0f} µs |")
    plain, marked = filter_cost(20 if quick else 2000)
    print(
        f"\nThe filter alone: {plain:.2f} µs per chunk of plain text, "
        f"{marked:.2f} µs per chunk of a reply ending in markers."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
