"""What `kvmem eval` prints: the per-category table and the failures, or the same as one JSON
object; and the intent gate's recall and skip rate. It runs nothing (kvmem/eval/run.py
does) and knows nothing of the command line.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvmem.eval.run import GateResult, ScenarioResult
from kvmem.eval.suite import CATEGORIES

MESSAGE_CHARS = 160  # of a failed scenario's newest message, in the text report


@dataclass
class Tally:
    """Runs summed up: one category, one language, or all."""

    passed: int = 0
    failed: int = 0
    model_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = 0.0  # None once a run had no price
    latencies: list[float] = field(default_factory=list)

    def add(self, result: ScenarioResult) -> None:
        """Count one run."""
        if result.passed:
            self.passed += 1
        else:
            self.failed += 1
        self.model_calls += result.model_calls
        self.input_tokens += result.input_tokens
        self.output_tokens += result.output_tokens
        if self.cost_usd is not None and result.cost_usd is not None:
            self.cost_usd += result.cost_usd
        else:
            self.cost_usd = None
        self.latencies.append(result.latency_seconds)

    @property
    def pass_rate(self) -> float:
        """Passed runs over all runs (1.0 when there were none)."""
        runs = self.passed + self.failed
        return self.passed / runs if runs else 1.0

    @property
    def p50_latency_ms(self) -> int | None:
        """The median run's wall time in milliseconds, both model calls included."""
        return round(statistics.median(self.latencies) * 1000) if self.latencies else None

    def as_json(self) -> dict[str, Any]:
        """The tally as `--json` shows it."""
        return {
            "passed": self.passed,
            "failed": self.failed,
            "pass_rate": round(self.pass_rate, 4),
            "model_calls": self.model_calls,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cost_usd": None if self.cost_usd is None else round(self.cost_usd, 6),
            "p50_latency_ms": self.p50_latency_ms,
        }


def tally(
    results: Sequence[ScenarioResult], by: Callable[[ScenarioResult], str]
) -> dict[str, Tally]:
    """The runs summed up per value of `by`, in order of first appearance."""
    tallies: dict[str, Tally] = {}
    for result in results:
        tallies.setdefault(by(result), Tally()).add(result)
    return tallies


def _by_category(results: Sequence[ScenarioResult]) -> dict[str, Tally]:
    tallies = tally(results, lambda r: r.scenario.category)
    return {name: tallies[name] for name in sorted(tallies, key=CATEGORIES.index)}


def _total(results: Sequence[ScenarioResult]) -> Tally:
    total = Tally()
    for result in results:
        total.add(result)
    return total


def result_json(result: ScenarioResult) -> dict[str, Any]:
    """One run as `--json`'s `scenarios` list shows it."""
    return {
        "id": result.scenario.id,
        "category": result.scenario.category,
        "language": result.scenario.language,
        "run": result.run,
        "passed": result.passed,
        "state": result.state,
        "problems": list(result.problems),
        "operations": [update.as_json() for update in result.operations],
        "refused": result.refused,
        "answers": list(result.answers),
        "model_calls": result.model_calls,
        "input_tokens": result.input_tokens,
        "output_tokens": result.output_tokens,
        "cost_usd": None if result.cost_usd is None else round(result.cost_usd, 8),
        "latency_ms": round(result.latency_seconds * 1000),
    }


def evaluation_json(
    results: Sequence[ScenarioResult], *, suite: str, model: str, mode: str, repeat: int
) -> dict[str, Any]:
    """The whole evaluation as one JSON object."""
    return {
        "suite": suite,
        "model": model,
        "mode": mode,
        "repeat": repeat,
        "summary": _total(results).as_json(),
        "categories": {name: t.as_json() for name, t in _by_category(results).items()},
        "languages": {
            name: t.as_json()
            for name, t in sorted(tally(results, lambda r: r.scenario.language or "-").items())
        },
        "scenarios": [result_json(result) for result in results],
    }


def _cost_text(cost: float | None) -> str:
    return "-" if cost is None else f"{cost:.6f}"


def _latency_text(ms: int | None) -> str:
    return "-" if ms is None else f"{ms / 1000:.2f} s"


def evaluation_text(
    results: Sequence[ScenarioResult], *, suite: str, model: str, mode: str, repeat: int
) -> str:
    """The table per category, the pass rate, the languages and the failures."""
    scenarios = len({r.scenario.id for r in results})
    lines = [
        f"kvmem eval: suite {suite} ({scenarios} scenarios, {repeat} run{'s' * (repeat > 1)} "
        f"each), model {model}, mode {mode}",
        "",
    ]
    header = ("category", "passed", "failed", "model calls", "tokens", "cost USD", "p50 latency")
    rows = [
        (
            name,
            str(t.passed),
            str(t.failed),
            str(t.model_calls),
            str(t.input_tokens + t.output_tokens),
            _cost_text(t.cost_usd),
            _latency_text(t.p50_latency_ms),
        )
        for name, t in [*_by_category(results).items(), ("all", _total(results))]
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        lines.append(
            "  ".join(
                cell.ljust(width) if i == 0 else cell.rjust(width)
                for i, (cell, width) in enumerate(zip(row, widths, strict=True))
            ).rstrip()
        )
    total = _total(results)
    runs = total.passed + total.failed
    lines += ["", f"pass rate: {total.pass_rate * 100:.1f} % ({total.passed} of {runs} runs)"]
    languages = sorted(tally(results, lambda r: r.scenario.language or "-").items())
    lines.append(
        "by language: "
        + ", ".join(f"{name} {t.passed}/{t.passed + t.failed}" for name, t in languages)
    )
    if repeat > 1:
        outcomes: dict[str, set[bool]] = {}
        for result in results:
            outcomes.setdefault(result.scenario.id, set()).add(result.passed)
        flaky = sorted(sid for sid, seen in outcomes.items() if len(seen) == 2)
        lines.append(f"flaky (passed some runs, failed others): {', '.join(flaky) or 'none'}")
    failures = [result for result in results if not result.passed]
    if failures:
        lines += ["", f"failures ({len(failures)}):"]
        for result in failures:
            lines += _failure_lines(result, repeat)
    return "\n".join(lines)


def _failure_lines(result: ScenarioResult, repeat: int) -> list[str]:
    scenario = result.scenario
    run = f", run {result.run}" if repeat > 1 else ""
    message = " ".join(scenario.newest_message.split())
    if len(message) > MESSAGE_CHARS:
        message = message[: MESSAGE_CHARS - 1] + "…"
    lines = [
        f"- {scenario.id} ({scenario.category}{run})",
        f"    message: {message}",
        *[f"    wrong: {problem}" for problem in result.problems],
    ]
    done = [
        f"set {u.key} = {json.dumps(u.value, ensure_ascii=False)}"
        if u.op == "set"
        else f"delete {u.key}"
        for u in result.operations
    ]
    lines.append(f"    the agent wrote: {'; '.join(done) or 'nothing'}")
    if result.refused:
        lines.append(f"    markers refused: {result.refused}")
    for number, answer in enumerate(result.answers, 1):
        if "tool_calls" in answer:
            asked = "; ".join(_call_text(c["name"], c["arguments"]) for c in answer["tool_calls"])
        else:
            asked = json.dumps(answer.get("content") or "", ensure_ascii=False)
        lines.append(f"    model call {number} answered: {asked}")
    return lines


def _call_text(name: str | None, arguments: str | None) -> str:
    """A tool call as `set_memory(key="k", value="v")`, or with its arguments as sent when
    they are not a JSON object."""
    try:
        parsed = json.loads(arguments or "")
    except json.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict):
        return f"{name}({arguments})"
    shown = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in parsed.items())
    return f"{name}({shown})"


@dataclass(frozen=True)
class GateSummary:
    """What the intent gate would cost: the memory requests it would skip, and the chit-chat
    it would save a model call on."""

    results: tuple[GateResult, ...]

    @property
    def requests(self) -> list[GateResult]:
        """Scenarios that expect a write (a set or a delete): the gate should open."""
        return [r for r in self.results if r.scenario.expect.writes]

    @property
    def chit_chat(self) -> list[GateResult]:
        """Scenarios of category `chit_chat`: the gate should stay shut."""
        return [r for r in self.results if r.scenario.category == "chit_chat"]

    @property
    def recall(self) -> float:
        """The share of memory requests the gate lets through (1.0 when there are none)."""
        requests = self.requests
        return sum(r.opens for r in requests) / len(requests) if requests else 1.0

    @property
    def skip_rate(self) -> float:
        """The share of chit-chat the gate skips (1.0 when there is none)."""
        chat = self.chit_chat
        return sum(not r.opens for r in chat) / len(chat) if chat else 1.0

    def as_json(self) -> dict[str, Any]:
        """The gate's measures as `--gate --json` shows them."""
        categories: dict[str, dict[str, int]] = {}
        for result in self.results:
            counts = categories.setdefault(result.scenario.category, {"opens": 0, "skips": 0})
            counts["opens" if result.opens else "skips"] += 1
        return {
            "memory_requests": len(self.requests),
            "recall": round(self.recall, 4),
            "chit_chat": len(self.chit_chat),
            "skip_rate": round(self.skip_rate, 4),
            "categories": categories,
            "missed_requests": [r.scenario.id for r in self.requests if not r.opens],
            "chit_chat_let_through": [r.scenario.id for r in self.chit_chat if r.opens],
        }

    def text(self, suite: str) -> str:
        """The gate's measures as a few lines, then the scenarios it gets wrong."""
        requests, chat = self.requests, self.chit_chat
        lines = [
            f"kvmem eval --gate: the intent gate on the newest user message of each of the "
            f"{len(self.results)} scenarios of suite {suite} (no model calls)",
            f"recall on memory requests: {self.recall * 100:.1f} % "
            f"({sum(r.opens for r in requests)} of {len(requests)} scenarios that expect a write)",
            f"skip rate on chit-chat: {self.skip_rate * 100:.1f} % "
            f"({sum(not r.opens for r in chat)} of {len(chat)} chit_chat scenarios)",
            "opens the gate, per category: "
            + ", ".join(
                f"{name} {counts['opens']}/{counts['opens'] + counts['skips']}"
                for name, counts in self.as_json()["categories"].items()
            ),
        ]
        missed = [r for r in requests if not r.opens]
        if missed:
            lines += ["", "memory requests the gate would skip (the agent never sees them):"]
            lines += [f"- {r.scenario.id}: {_short(r.scenario.newest_message)}" for r in missed]
        through = [r for r in chat if r.opens]
        if through:
            lines += ["", "chit-chat the gate lets through (a model call each):"]
            lines += [f"- {r.scenario.id}: {_short(r.scenario.newest_message)}" for r in through]
        return "\n".join(lines)


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 1] + "…"
