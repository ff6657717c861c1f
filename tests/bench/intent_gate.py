"""`python -m tests.bench.intent_gate`: the agent calls the intent gate saves on a conversation.

Plays one scripted 50-message conversation (mostly chit-chat, some memory requests and
implicit updates, some talk about memory, in several languages) through `POST /chat` of
two kvmem apps on a scripted upstream: `trigger: always` and `trigger: intent`. Counts the
agent's model calls and the tokens of their input, checks which memory messages reached
the agent, and times the gate alone. Then measures the gate on the held-out round
(tests/data/intent_heldout.jsonl, never used to tune it): explicit requests and implicit
updates passed, chit-chat skipped, per language; and the second round
(intent_heldout2.jsonl) in all. Prints markdown tables; asserts nothing.
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

from kvmem.config import Config  # noqa: E402
from kvmem.db.engine import Database  # noqa: E402
from kvmem.db.migrate import upgrade  # noqa: E402
from kvmem.intent.gate import IntentGate  # noqa: E402
from kvmem.server.app import create_app  # noqa: E402
from kvmem.tokens import TokenCounter  # noqa: E402
from tests.support.apps import AGENT_MODEL, MAIN_MODEL, wait_agents_idle  # noqa: E402
from tests.support.upstream import Reply, ScriptedUpstream  # noqa: E402

# (message, what it is): "memory" messages ask to remember/update/forget (or state a change);
# the rest should not need the agent.
CONVERSATION: list[tuple[str, str]] = [
    ("Hi! Can you help me plan a week of dinners?", "chat"),
    ("Remember that I'm vegetarian.", "memory"),
    ("Great, what about something with lentils?", "chat"),
    ("How long do I cook red lentils?", "chat"),
    ("Thanks! Do you remember what I said about my diet?", "about memory"),
    ("Can you convert 200 g to cups?", "chat"),
    ("I have a memory leak in my Node app, how do I find it?", "about memory"),
    ("Here's the code: const cache = {}; setInterval(() => cache[Date.now()] = 1, 10)", "chat"),
    ("Ah, so the cache grows forever. How do I bound it?", "chat"),
    ("From now on, answer code questions in TypeScript.", "memory"),
    ("Show me an LRU cache then.", "chat"),
    ("What's the time complexity of that?", "chat"),
    ("lol ok", "chat"),
    ("Actually I moved to Berlin last month.", "memory"),
    ("What are some good neighbourhoods for families there?", "chat"),
    ("Is Kreuzberg expensive?", "chat"),
    ("How do I register my address in Germany?", "chat"),
    ("Wie sage ich höflich, dass ich kein Deutsch spreche?", "chat"),
    ("Merk dir bitte, dass ich Deutsch lerne, Niveau A2.", "memory"),
    ("Kannst du mir drei einfache Sätze zum Üben geben?", "chat"),
    ("Danke!", "chat"),
    ("Write a short birthday message for my sister.", "chat"),
    ("Make it funnier.", "chat"),
    ("I can't remember her exact age, maybe 34?", "about memory"),
    ("Please note my sister's birthday is on May 12.", "memory"),
    ("What gift ideas do you have for someone who likes hiking?", "chat"),
    ("Under 50 euros please.", "chat"),
    ("Explain the difference between a Roth IRA and a 401k.", "chat"),
    ("Wait, I'm in Germany now, what's the equivalent here?", "chat"),
    ("My new email is sam.rivera@example.com, update it.", "memory"),
    ("How do I write a formal email to my landlord?", "chat"),
    ("The heating is broken since Monday.", "chat"),
    ("Translate that into German.", "chat"),
    ("Forget my old address in Chicago.", "memory"),
    ("What's the weather usually like in Berlin in November?", "chat"),
    ("Recommend a warm winter jacket.", "chat"),
    ("帮我把这段话翻译成英文：我很喜欢这个城市。", "chat"),
    ("请记住我也会说中文。", "memory"),
    ("谢谢！", "chat"),
    ("Remember when we talked about lentils? Give me another recipe.", "about memory"),
    ("Something with chickpeas this time.", "chat"),
    ("I'm no longer doing keto, by the way.", "memory"),
    ("Can I freeze hummus?", "chat"),
    ("How many calories in a tablespoon of tahini?", "chat"),
    ("What's a good podcast about history?", "chat"),
    ("Summarize the fall of Rome in three sentences.", "chat"),
    ("Which emperor was the last one?", "chat"),
    ("What do you remember about me?", "about memory"),
    ("Call me Sam from now on.", "memory"),
    ("Good night!", "chat"),
]


def play(
    trigger: str,
    conversation: list[tuple[str, str]],
    upstream: ScriptedUpstream,
    workdir: Path,
    tokens: TokenCounter,
) -> dict[str, Any]:
    """Play `conversation` on a fresh app with `trigger`; what the agent was sent."""
    config = Config.model_validate(
        {
            "database": {"url": f"sqlite:///{workdir / f'{trigger}.db'}"},
            "chat": {"model": f"openai/{MAIN_MODEL}", "api_base": upstream.url, "api_key": "k"},
            "memory": {
                "agent": {
                    "provider": "openai",
                    "model": AGENT_MODEL,
                    "api_base": upstream.url,
                    "api_key": "k",
                    "trigger": trigger,
                }
            },
        }
    )
    database = Database.from_config(config.database)
    upgrade(database.engine)
    before = len(upstream.received(AGENT_MODEL))
    states = []
    app = create_app(config, database=database, tokens=tokens)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        conversation_id = None
        for message, _ in conversation:
            body = {"message": message}
            if conversation_id:
                body["conversation_id"] = conversation_id
            reply = client.post("/chat", json=body).json()
            conversation_id = reply["conversation_id"]
            states.append(reply["memory"]["agent"])
            wait_agents_idle(client)  # one turn at a time, as a person types
    database.dispose()
    requests = upstream.received(AGENT_MODEL)[before:]
    sent = [r.messages[-1]["content"] for r in requests]
    reached = {
        message
        for message, kind in conversation
        if kind == "memory" and any(text.endswith(f"Human: {message}") for text in sent)
    }
    return {
        "calls": len(requests),
        "input_tokens": sum(tokens.count(m["content"] or "") for r in requests for m in r.messages),
        "gated": states.count("gated"),
        "memory_reached": len(reached),
    }


def gate_timing(conversation: list[tuple[str, str]], repeats: int) -> tuple[float, float]:
    """Median and max microseconds the gate takes per conversation message."""
    gate = IntentGate()
    samples = []
    for message, _ in conversation:
        started = time.perf_counter()
        for _ in range(repeats):
            gate.matches(message)
        samples.append((time.perf_counter() - started) / repeats * 1e6)
    return statistics.median(samples), max(samples)


DATA = Path(__file__).resolve().parents[1] / "data"
HELDOUT_ROUNDS = (DATA / "intent_heldout.jsonl", DATA / "intent_heldout2.jsonl")
HELDOUT_LANGUAGES = ("en", "zh", "ru", "it", "es", "fr", "de", "pt", "ja", "mixed")


def heldout_table() -> list[str]:
    """Markdown rows: the gate's decisions on the held-out rounds: the first per language and
    in all, the second in all."""
    gate = IntentGate()
    first, second = (
        [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
        for path in HELDOUT_ROUNDS
    )

    def cells(selected: list[dict[str, str]]) -> str:
        out = []
        for label, wanted in (("explicit", True), ("implicit", True), ("chitchat", False)):
            of = [m for m in selected if m["label"] == label]
            hits = sum(gate.matches(m["text"]) == wanted for m in of)
            out.append(f"{100 * hits / len(of):.1f} % ({hits}/{len(of)})" if of else "-")
        return " | ".join(out)

    rows = [
        "| messages | explicit requests passed | implicit updates passed | chit-chat skipped |",
        "|---|---:|---:|---:|",
        f"| round 1, all ({len(first)}) | {cells(first)} |",
    ]
    for lang in HELDOUT_LANGUAGES:
        selected = [m for m in first if m["lang"] == lang]
        rows.append(f"| round 1, {lang} ({len(selected)}) | {cells(selected)} |")
    rows.append(f"| round 2, all ({len(second)}) | {cells(second)} |")
    return rows


def main() -> int:
    """Run both plays and print the tables (`--quick`: the first 12 messages, to prove it runs)."""
    quick = "--quick" in sys.argv
    conversation = CONVERSATION[:12] if quick else CONVERSATION
    tokens = TokenCounter()
    upstream = ScriptedUpstream().start()
    upstream.default(AGENT_MODEL, Reply(content=None))  # the agent writes nothing
    try:
        with tempfile.TemporaryDirectory() as folder:
            results = {
                trigger: play(trigger, conversation, upstream, Path(folder), tokens)
                for trigger in ("always", "intent")
            }
    finally:
        upstream.stop()
    kinds = [kind for _, kind in conversation]
    memory_messages = kinds.count("memory")
    print(f"\n## Intent gate: agent calls on a {len(conversation)}-message conversation\n")
    print(
        f"{memory_messages} memory requests or updates, {kinds.count('about memory')} "
        f"messages about memory, {kinds.count('chat')} chit-chat.\n"
    )
    print(
        "| trigger | agent calls | agent input tokens | gated | memory messages that reached the agent |"
    )
    print("|---|---:|---:|---:|---:|")
    for trigger, r in results.items():
        print(
            f"| {trigger} | {r['calls']} | {r['input_tokens']:,} | {r['gated']} | "
            f"{r['memory_reached']}/{memory_messages} |"
        )
    always, intent = results["always"], results["intent"]
    print(
        f"\nSaved by `trigger: intent`: {always['calls'] - intent['calls']} of "
        f"{always['calls']} agent calls ({1 - intent['calls'] / always['calls']:.0%}), "
        f"{always['input_tokens'] - intent['input_tokens']:,} of {always['input_tokens']:,} "
        f"agent input tokens ({1 - intent['input_tokens'] / always['input_tokens']:.0%})."
    )
    median, worst = gate_timing(conversation, 20 if quick else 2000)
    print(f"Gate time per message: median {median:.0f} µs, max {worst:.0f} µs.")
    print("\n## Intent gate: the held-out rounds\n")
    print(*heldout_table(), sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
