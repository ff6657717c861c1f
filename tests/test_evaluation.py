"""`kvmem eval`: the memory agent's real path on scenarios against the scripted upstream,
scoring, the built-in suite, the report, exit codes, bad suite files and the intent gate."""

from __future__ import annotations

import json
import logging
import re
import time
import tomllib
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest
from click.testing import CliRunner, Result

from kvmem.agent.json_mode import JSON_MODE_INSTRUCTIONS
from kvmem.agent.prompts import (
    DEFAULT_AGENT_INSTRUCTIONS,
    ChatLine,
    render_agent_input,
    render_marker_instructions,
    render_memory_block,
    with_marker_instructions,
)
from kvmem.agent.run import MemoryUpdate
from kvmem.agent.tools import tool_definitions
from kvmem.cli import main
from kvmem.config import Config
from kvmem.entries import Entry
from kvmem.eval.report import evaluation_json, evaluation_text
from kvmem.eval.run import Evaluation, ScenarioResult, eval_config
from kvmem.eval.suite import CATEGORIES, Expectation, Suite, builtin_suite, load_suite
from kvmem.tokens import TokenCounter
from kvmem.upstream.model_client import token_prices
from tests.support.apps import AGENT_MODEL, MAIN_MODEL, Containing, set_memory
from tests.support.eval_agents import (
    PLANTED,
    answer,
    injecting_agent,
    inline_scenario_of,
    perfect_agent,
    perfect_inline_model,
    perfect_operations,
    scenario_of,
)
from tests.support.upstream import Reply, ScriptedUpstream

BUILTIN = builtin_suite()


class Millis:
    """Equal to any whole number of milliseconds (latencies vary from run to run)."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, int) and other >= 0

    def __repr__(self) -> str:
        return "<milliseconds>"


MS: Any = Millis()


def evaluate(
    sections: dict[str, Any], tokens: TokenCounter, suite: Suite = BUILTIN, **options: Any
) -> tuple[list[ScenarioResult], dict[str, Any]]:
    """Run an evaluation in this process; its results and its `--json` object."""
    config = eval_config(Config.model_validate(sections))
    evaluation = Evaluation(config, suite, tokens=tokens, concurrency=8, **options)
    results = anyio.run(evaluation.run)
    report = evaluation_json(
        results,
        suite=suite.source,
        model=evaluation.target.model,
        mode=config.memory.agent.mode if config.memory.agent else "tools",
        repeat=options.get("repeat", 1),
    )
    return results, report


def tally(passed: int, failed: int, calls: int | None = None) -> dict[str, Any]:
    """A table row of runs that each made `calls` model calls in all (default one each),
    with the scripted upstream's usage (10 tokens in, 5 out per call) and no price."""
    calls = passed + failed if calls is None else calls
    return {
        "passed": passed,
        "failed": failed,
        "pass_rate": round(passed / (passed + failed), 4),
        "model_calls": calls,
        "input_tokens": 10 * calls,
        "output_tokens": 5 * calls,
        "cost_usd": None,
        "p50_latency_ms": MS,
    }


def category_rows(failing: set[str]) -> dict[str, dict[str, Any]]:
    """The built-in suite's table when every scenario of `failing` categories fails and
    every other one passes."""
    counts = Counter(s.category for s in BUILTIN.scenarios)
    return {c: tally(0, counts[c]) if c in failing else tally(counts[c], 0) for c in CATEGORIES}


# --- the built-in suite -----------------------------------------------------------------


def test_the_built_in_suite_covers_every_category_and_language() -> None:
    scenarios = BUILTIN.scenarios
    assert BUILTIN.source == "built-in"
    assert len(scenarios) == 88
    assert Counter(s.category for s in scenarios) == {
        "remember": 10,
        "update": 9,
        "forget": 9,
        "chit_chat": 11,
        "implicit": 10,
        "language": 9,
        "injection": 10,
        "routing": 9,
        "expiry": 11,
    }
    assert Counter(s.language for s in scenarios) == {
        "en": 28,
        "de": 10,
        "fr": 9,
        "es": 9,
        "ja": 7,
        "zh": 7,
        "pt": 6,
        "it": 6,
        "ru": 6,
    }
    # Every category is written in at least five languages.
    languages = {c: {s.language for s in scenarios if s.category == c} for c in CATEGORIES}
    assert {c: len(found) >= 5 for c, found in languages.items()} == dict.fromkeys(CATEGORIES, True)
    # Each scenario brings its own keys, so the suite runs under any config's validKeys.
    assert [s.id for s in scenarios if not s.valid_keys] == []
    # What each category expects, by kvmem's default instructions: chit-chat, facts in
    # passing and planted instructions are never written; the rest always writes.
    writes = {c: {s.expect.writes for s in scenarios if s.category == c} for c in CATEGORIES}
    assert writes == {
        "remember": {True},
        "update": {True},
        "forget": {True},
        "chit_chat": {False},
        "implicit": {False},
        "language": {True},
        "injection": {False},
        "routing": {True},
        "expiry": {True},
    }
    # Each expiry scenario pins its "now" and expects the day its fact stops holding.
    expiry = [s for s in scenarios if s.category == "expiry"]
    assert [s.id for s in expiry if s.now is None or not s.expect.expires] == []
    assert [s.id for s in scenarios if s.category != "expiry" and s.expect.expires] == []
    assert {s.expect.no_writes for s in scenarios if s.category == "injection"} == {True}
    # The scripted agents below tell scenarios apart by their newest message.
    assert len({s.newest_message for s in scenarios}) == len(scenarios)


def test_the_suite_is_package_data() -> None:
    """`pip install .` ships the built-in suite (and the intent gate's model, read the same
    way): each is named in pyproject's package data and matches a file that exists."""
    pyproject = tomllib.loads(
        (Path(__file__).parents[1] / "pyproject.toml").read_text(encoding="utf-8")
    )
    shipped = pyproject["tool"]["setuptools"]["package-data"]["kvmem"]
    assert {"eval/*.yaml", "intent/model.json"} <= set(shipped)
    package = Path(__file__).parents[1] / "kvmem"
    assert [p.name for p in package.glob("eval/*.yaml")] == ["suite.yaml"]
    assert (package / "intent" / "model.json").is_file()


# --- scoring the real agent path --------------------------------------------------------


def test_a_perfect_agent_scores_100_percent_through_the_real_agent_path(
    upstream: ScriptedUpstream, chat_sections: Callable[..., dict[str, Any]], tokens: TokenCounter
) -> None:
    upstream.respond(AGENT_MODEL, perfect_agent(BUILTIN))
    results, report = evaluate(chat_sections(), tokens)

    assert report["summary"] == tally(88, 0)
    assert report["categories"] == category_rows(set())
    assert [s["passed"] for s in report["scenarios"]] == [True] * 88
    forget = next(s for s in report["scenarios"] if s["id"] == "forget-en-medication")
    assert forget == {
        "id": "forget-en-medication",
        "category": "forget",
        "language": "en",
        "run": 1,
        "passed": True,
        "state": "done",
        "problems": [],
        "operations": [{"op": "delete", "key": "health"}],
        "refused": 0,
        "answers": [{"tool_calls": [{"name": "delete_memory", "arguments": '{"key": "health"}'}]}],
        "model_calls": 1,
        "input_tokens": 10,
        "output_tokens": 5,
        "cost_usd": None,
        "latency_ms": MS,
    }
    # Each request is the production agent's: its instructions, its input rendered from the
    # scenario's memory and chat, and the tools with the scenario's own valid keys.
    requests = upstream.received(AGENT_MODEL)
    assert len(requests) == 88
    for request in requests:
        scenario = scenario_of(request, BUILTIN)
        entries = [
            Entry(key, value, tokens.count(value), "manual", datetime.now(UTC), datetime.now(UTC))
            for key, value in scenario.memory.items()
        ]
        window = [ChatLine(m.role, m.content) for m in scenario.messages]
        assert request.messages == [
            {"role": "system", "content": DEFAULT_AGENT_INSTRUCTIONS},
            {
                "role": "user",
                "content": render_agent_input(
                    entries, None, scenario.valid_keys, window, 12_000, tokens, now=scenario.now
                ),
            },
        ]
        assert request.body["tools"] == tool_definitions(scenario.valid_keys)


def test_an_agent_that_never_writes_fails_exactly_the_write_categories(
    upstream: ScriptedUpstream, chat_sections: Callable[..., dict[str, Any]], tokens: TokenCounter
) -> None:
    upstream.default(AGENT_MODEL, Reply(content="Nothing to remember."))
    results, report = evaluate(chat_sections(), tokens)

    write_categories = {"remember", "update", "forget", "language", "routing", "expiry"}
    assert report["categories"] == category_rows(write_categories)
    assert {r.scenario.id for r in results if not r.passed} == {
        s.id for s in BUILTIN.scenarios if s.category in write_categories
    }
    problems = {r.scenario.id: list(r.problems) for r in results}
    assert problems["remember-en-typo-allergy"] == ["health: not set"]
    assert problems["update-en-moved"] == ['location: "Lives in Berlin" lacks "Hamburg"']
    assert problems["forget-en-medication"] == ["health: not deleted"]
    assert report["summary"] == tally(31, 57)


def test_an_agent_that_writes_a_planted_instruction_fails_injection(
    upstream: ScriptedUpstream, chat_sections: Callable[..., dict[str, Any]], tokens: TokenCounter
) -> None:
    upstream.respond(AGENT_MODEL, injecting_agent(BUILTIN))
    results, report = evaluate(chat_sections(), tokens)

    assert report["categories"] == category_rows({"injection"})
    failed = [result_json for result_json in report["scenarios"] if not result_json["passed"]]
    assert {s["id"] for s in failed} == {
        s.id for s in BUILTIN.scenarios if s.category == "injection"
    }
    web_page = next(s for s in failed if s["id"] == "injection-en-web-page-store-this")
    assert (web_page["problems"], web_page["operations"]) == (
        ["expected no writes; the agent made 1"],
        [{"op": "set", "key": "contact", "value": PLANTED}],
    )


def test_json_mode_runs_without_tools_and_scores_the_same(
    upstream: ScriptedUpstream, chat_sections: Callable[..., dict[str, Any]], tokens: TokenCounter
) -> None:
    # The first scenario of each category.
    suite = Suite("built-in", tuple({s.category: s for s in reversed(BUILTIN.scenarios)}.values()))
    upstream.respond(AGENT_MODEL, perfect_agent(suite))
    results, report = evaluate(chat_sections(agent={"mode": "json"}), tokens, suite)

    assert (report["mode"], report["summary"]) == ("json", tally(9, 0))
    assert [r.operations for r in results if r.scenario.category == "forget"] == [
        (MemoryUpdate("delete", "health"),)
    ]
    requests = upstream.received(AGENT_MODEL)
    assert {"tools" in r.body for r in requests} == {False}
    assert {r.messages[0]["content"] for r in requests} == {
        f"{DEFAULT_AGENT_INSTRUCTIONS}\n\n{JSON_MODE_INSTRUCTIONS}"
    }


def write_suite(folder: Path, scenarios: list[dict[str, Any]], name: str = "suite.jsonl") -> Path:
    path = folder / name
    path.write_text("".join(json.dumps(s) + "\n" for s in scenarios), encoding="utf-8")
    return path


GLUTEN = {
    "id": "gluten",
    "category": "routing",
    "language": "en",
    "valid_keys": ["food", "work"],
    "messages": [{"role": "user", "content": "Please remember I can't eat gluten."}],
    "expect": {"set": {"food": ["gluten"]}, "unchanged": ["work"]},
}


CHAT = {
    "id": "thanks",
    "category": "chit_chat",
    "language": "de",
    "valid_keys": ["food"],
    "memory": {"food": "Mag Käsespätzle"},
    "messages": [{"role": "user", "content": "Danke dir, das war's!"}],
    "expect": {"no_writes": True},
}


def test_cost_comes_from_litellm_s_price_map(
    upstream: ScriptedUpstream,
    chat_sections: Callable[..., dict[str, Any]],
    tokens: TokenCounter,
    tmp_path: Path,
) -> None:
    suite = load_suite(write_suite(tmp_path, [CHAT, {**CHAT, "id": "again"}]))
    results, report = evaluate(chat_sections(agent={"model": "gpt-4.1-mini"}), tokens, suite)
    prices = token_prices("openai/gpt-4.1-mini")
    assert prices is not None
    per_run = 10 * prices[0] + 5 * prices[1]
    assert [r.cost_usd for r in results] == [per_run, per_run]
    assert report["summary"]["cost_usd"] == round(2 * per_run, 6) > 0


def test_validation_limits_and_the_corrective_call_are_production_s(
    upstream: ScriptedUpstream,
    chat_sections: Callable[..., dict[str, Any]],
    tokens: TokenCounter,
    tmp_path: Path,
) -> None:
    suite = load_suite(write_suite(tmp_path, [GLUTEN, {**GLUTEN, "id": "gluten-long"}]))
    upstream.script(
        AGENT_MODEL,
        # A key outside valid_keys is refused; the second call, told why, corrects it.
        Reply(content=None, tool_calls=[set_memory("diet", "No gluten")]),
        Reply(content=None, tool_calls=[set_memory("food", "No gluten (celiac)")]),
        # A value over charLimit is refused twice: the run ends, nothing stored.
        Reply(content=None, tool_calls=[set_memory("food", "gluten " * 10)]),
        Reply(content=None, tool_calls=[set_memory("food", "gluten " * 10)]),
    )
    config = eval_config(Config.model_validate(chat_sections(memory={"charLimit": 40})))
    results = anyio.run(Evaluation(config, suite, tokens=tokens, concurrency=1).run)

    assert [(r.scenario.id, r.passed, r.model_calls, list(r.problems)) for r in results] == [
        ("gluten", True, 2, []),
        ("gluten-long", False, 2, ["food: not set"]),
    ]
    assert [m for m in upstream.received(AGENT_MODEL)[1].messages if m["role"] == "tool"] == [
        {
            "role": "tool",
            "tool_call_id": "call_0",
            "content": 'Invalid key "diet". Must be one of: food, work',
        },
    ]
    assert (
        results[1].answers
        == (
            {
                "tool_calls": [
                    {
                        "name": "set_memory",
                        "arguments": json.dumps({"key": "food", "value": "gluten " * 10}),
                    }
                ]
            },
        )
        * 2
    )
    shown = evaluation_text(results, suite="s", model="m", mode="tools", repeat=1)
    assert shown.split("failures (1):\n")[1] == (
        "- gluten-long (routing)\n"
        "    message: Please remember I can't eat gluten.\n"
        "    wrong: food: not set\n"
        "    the agent wrote: nothing\n"
        f'    model call 1 answered: set_memory(key="food", value="{"gluten " * 10}")\n'
        f'    model call 2 answered: set_memory(key="food", value="{"gluten " * 10}")'
    )


def test_the_agent_s_writes_are_scored_even_under_review(
    upstream: ScriptedUpstream,
    chat_sections: Callable[..., dict[str, Any]],
    tokens: TokenCounter,
    tmp_path: Path,
) -> None:
    """`memory.review` would turn the writes into proposals, leaving memory unchanged."""
    suite = load_suite(write_suite(tmp_path, [GLUTEN]))
    upstream.script(AGENT_MODEL, Reply(content=None, tool_calls=[set_memory("food", "No gluten")]))
    config = eval_config(Config.model_validate(chat_sections(memory={"review": "on"})))
    [result] = anyio.run(Evaluation(config, suite, tokens=tokens).run)
    assert (result.passed, result.state, result.problems, result.operations) == (
        True,
        "done",
        (),
        (MemoryUpdate("set", "food", "No gluten"),),
    )


def test_a_run_that_fails_fails_its_scenario_even_when_nothing_was_expected(
    upstream: ScriptedUpstream,
    chat_sections: Callable[..., dict[str, Any]],
    tokens: TokenCounter,
    tmp_path: Path,
) -> None:
    suite = load_suite(
        write_suite(
            tmp_path,
            [{**GLUTEN, "id": "chat", "category": "chit_chat", "expect": {"no_writes": True}}],
        )
    )
    upstream.script(AGENT_MODEL, Reply(status=500, error={"error": {"message": "overloaded"}}))
    config = eval_config(Config.model_validate(chat_sections()))
    [result] = anyio.run(Evaluation(config, suite, tokens=tokens).run)
    assert (result.passed, result.state, result.model_calls, result.answers) == (
        False,
        "failed",
        1,
        (),
    )
    assert result.problems == (Containing("the agent run ended failed: "),)
    assert "overloaded" in result.problems[0]


def test_substrings_match_ignoring_case_and_a_list_is_any_of_its_strings() -> None:
    expect = Expectation.model_validate(
        {
            "set": {"diet": ["VEGAN", ["Nüsse", "Nuss"]]},
            "deleted": ["phone"],
            "unchanged": ["work", "pets"],
        }
    )
    before = {"phone": "123", "work": "Baker"}
    assert expect.problems(before, {"diet": "vegan, keine nussallergie", "work": "Baker"}, 1) == []
    assert expect.problems(before, {"diet": "Vegetarian", "phone": "123", "pets": "cat"}, 2) == [
        'diet: "Vegetarian" lacks "VEGAN"',
        'diet: "Vegetarian" lacks "Nüsse" or "Nuss"',
        "phone: not deleted",
        "work: changed to null",
        'pets: changed to "cat"',
    ]
    assert Expectation(no_writes=True).problems({}, {}, 1) == [
        "expected no writes; the agent made 1"
    ]


# --- the command ------------------------------------------------------------------------


def kvmem(folder: Path, *args: str) -> Result:
    """`kvmem --config memory.yaml ARGS` in this process (the eval machinery is imported
    lazily, so this is the command as installed)."""
    return CliRunner().invoke(main, ["--config", str(folder / "memory.yaml"), *args])


@pytest.fixture
def folder(tmp_path: Path, chat_sections: Callable[..., dict[str, Any]]) -> Path:
    """A memory.yaml whose agent is the scripted upstream and whose database must stay
    untouched by an evaluation."""
    sections = chat_sections(agent={"trigger_phrases": ["sky blue"]})
    sections["database"] = {"url": f"sqlite:///{tmp_path / 'configured.db'}"}
    (tmp_path / "memory.yaml").write_text(json.dumps(sections), encoding="utf-8")
    return tmp_path


def test_the_table_the_failures_and_min_pass_as_exit_code(
    upstream: ScriptedUpstream, folder: Path
) -> None:
    write_suite(folder, [GLUTEN, CHAT])
    upstream.default(AGENT_MODEL, Reply(content="Nothing to do."))
    suite = str(folder / "suite.jsonl")

    # A pass rate of 50 % is not under --min-pass 50 %.
    shown = kvmem(folder, "eval", "--suite", suite, "--min-pass", "50%")
    assert (shown.exit_code, shown.stderr) == (0, "")
    assert re.sub(r"\d+\.\d\d s", "#.## s", shown.stdout) == (
        f"kvmem eval: suite {suite} (2 scenarios, 1 run each), model openai/agent-model, "
        "mode tools\n"
        "\n"
        "category   passed  failed  model calls  tokens  cost USD  p50 latency\n"
        "chit_chat       1       0            1      15         -       #.## s\n"
        "routing         0       1            1      15         -       #.## s\n"
        "all             1       1            2      30         -       #.## s\n"
        "\n"
        "pass rate: 50.0 % (1 of 2 runs)\n"
        "by language: de 1/1, en 0/1\n"
        "\n"
        "failures (1):\n"
        "- gluten (routing)\n"
        "    message: Please remember I can't eat gluten.\n"
        "    wrong: food: not set\n"
        "    the agent wrote: nothing\n"
        '    model call 1 answered: "Nothing to do."\n'
    )
    over_half = kvmem(folder, "eval", "--suite", suite, "--min-pass", "0.51", "--json")
    assert (over_half.exit_code, json.loads(over_half.stdout)["summary"]) == (1, tally(1, 1))
    bad = kvmem(folder, "eval", "--suite", suite, "--min-pass", "1.5")
    assert bad.exit_code == 2
    assert "'1.5' is not between 0 and 1 (0% and 100%)" in bad.stderr
    # The configured database was never opened: each scenario ran on a store of its own.
    assert not (folder / "configured.db").exists()


def test_json_repeat_and_model(upstream: ScriptedUpstream, folder: Path) -> None:
    write_suite(folder, [CHAT])
    upstream.default("other-model", Reply(content="Nothing to do."))

    shown = kvmem(
        folder,
        "eval",
        "--suite",
        str(folder / "suite.jsonl"),
        "--json",
        "--repeat",
        "2",
        "--model",
        "openai/other-model",
    )
    assert (shown.exit_code, shown.stderr) == (0, "")
    run = {
        "id": "thanks",
        "category": "chit_chat",
        "language": "de",
        "passed": True,
        "state": "done",
        "problems": [],
        "operations": [],
        "refused": 0,
        "answers": [{"content": "Nothing to do."}],
        "model_calls": 1,
        "input_tokens": 10,
        "output_tokens": 5,
        "cost_usd": None,
        "latency_ms": MS,
    }
    assert json.loads(shown.stdout) == {
        "suite": str(folder / "suite.jsonl"),
        "model": "openai/other-model",
        "mode": "tools",
        "repeat": 2,
        "summary": tally(2, 0),
        "categories": {"chit_chat": tally(2, 0)},
        "languages": {"de": tally(2, 0)},
        "scenarios": [{**run, "run": 1}, {**run, "run": 2}],
    }
    assert [r.model for r in upstream.requests] == ["other-model", "other-model"]


def test_a_failed_run_is_reported_once_with_its_error(
    upstream: ScriptedUpstream, folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    suite = write_suite(folder, [CHAT])
    upstream.script(AGENT_MODEL, Reply(status=500, error={"error": {"message": "overloaded"}}))
    shown = kvmem(folder, "eval", "--suite", str(suite))
    assert (shown.exit_code, shown.stderr) == (0, "")
    # Not again as the agent's warning; and the agent's logger is as it was afterwards.
    assert [r.name for r in caplog.records if r.name.startswith("kvmem")] == []
    assert logging.getLogger("kvmem.agent").level == logging.NOTSET
    failure = shown.stdout.split("failures (1):\n")[1].splitlines()
    assert failure[:2] == ["- thanks (chit_chat)", "    message: Danke dir, das war's!"]
    assert failure[2].startswith("    wrong: the agent run ended failed: ")
    assert "overloaded" in failure[2]
    assert failure[3:] == ["    the agent wrote: nothing"]


def test_without_an_agent_model_or_with_memory_the_config_refuses_it_exits_2(
    upstream: ScriptedUpstream, folder: Path
) -> None:
    no_agent = folder / "none.yaml"
    no_agent.write_text("database: {url: 'sqlite:///configured.db'}\n", encoding="utf-8")
    refused = CliRunner().invoke(main, ["eval", "--config", str(no_agent)])
    assert (refused.exit_code, refused.stdout, refused.stderr) == (
        2,
        "",
        f"kvmem: {no_agent}: memory.agent needs provider and model to be evaluated "
        "(or pass --model PROVIDER/MODEL)\n",
    )
    bad_model = kvmem(folder, "eval", "--model", "gpt-4.1-mini")
    assert (bad_model.exit_code, bad_model.stderr) == (
        2,
        f"kvmem: {folder / 'memory.yaml'}: --model 'gpt-4.1-mini': expected PROVIDER/MODEL, "
        "e.g. openai/gpt-4.1-mini\n",
    )
    # A scenario without keys of its own runs under the config's validKeys.
    config = json.loads((folder / "memory.yaml").read_text(encoding="utf-8"))
    config["memory"]["validKeys"] = ["work"]
    (folder / "memory.yaml").write_text(json.dumps(config), encoding="utf-8")
    suite = write_suite(folder, [{**CHAT, "valid_keys": None}])
    unseeded = kvmem(folder, "eval", "--suite", str(suite))
    assert (unseeded.exit_code, unseeded.stdout, unseeded.stderr) == (
        2,
        "",
        f"kvmem: {suite} (scenario 'thanks'): memory.food: cannot be stored under this "
        "config: key 'food' is not allowed; valid keys: work\n",
    )
    assert upstream.requests == []


LAST_IS_ASSISTANT = (
    "- {id: c, category: remember, messages: [{role: assistant, content: hi}],\n"
    "   expect: {no_writes: true}}\n"
)


@pytest.mark.parametrize(
    ("name", "text", "problem"),
    [
        (
            "bad.jsonl",
            json.dumps(CHAT) + "\n{not json\n",
            ", line 2: not valid JSON: Expecting property name enclosed in double quotes",
        ),
        (
            "typo.jsonl",
            json.dumps({**CHAT, "category": "chitchat"}) + "\n",
            ", line 1 (scenario 'thanks'): category: Input should be 'remember', 'update', "
            "'forget', 'chit_chat', 'implicit', 'language', 'injection', 'routing' or 'expiry'",
        ),
        (
            "twice.jsonl",
            json.dumps(CHAT) + "\n\n" + json.dumps(CHAT) + "\n",
            ", line 3 (scenario 'thanks'): id: also the id of the scenario on line 1",
        ),
        ("empty.yaml", "", ": the suite has no scenarios"),
        (
            "mapping.yaml",
            "remember: []\n",
            ": expected a list of scenarios (or a mapping with `scenarios:`)",
        ),
        (
            "field.yaml",
            "scenarios:\n- id: a\n  category: forget\n"
            "  messages: [{role: user, content: forget my job}]\n  expect: {deleted: [job]}\n",
            ", line 2 (scenario 'a'): expect.deleted: job not in memory (nothing to delete)",
        ),
        (
            "nothing.yaml",
            "- {id: b, category: remember, messages: [{role: user, content: hi}], expect: {}}\n",
            ", line 1 (scenario 'b'): expect: nothing expected: give set, deleted, unchanged, "
            "no_writes or expires",
        ),
        (
            "expires.yaml",
            "- {id: e, category: expiry, messages: [{role: user, content: hi}],\n"
            "   expect: {set: {trip: [x]}, expires: {trip: friday}}}\n",
            ", line 1 (scenario 'e'): expect.expires.trip: Input should be a valid date or "
            "datetime, input is too short",
        ),
        (
            "now.yaml",
            "- {id: n, category: expiry, now: someday, messages: [{role: user, content: hi}],\n"
            "   expect: {set: {trip: [x]}, expires: {trip: 2026-03-06}}}\n",
            ", line 1 (scenario 'n'): now: Input should be a valid datetime or date, input is "
            "too short",
        ),
        (
            "last.yaml",
            LAST_IS_ASSISTANT,
            ", line 1 (scenario 'c'): messages: the last message must be the user's "
            "(the agent reads up to it)",
        ),
        (
            "keys.yaml",
            "- {id: d, category: routing, valid_keys: [work], messages: [{role: user, content: x}],\n"
            "   expect: {set: {food: [x]}}}\n",
            ", line 1 (scenario 'd'): expect.set: food not among valid_keys",
        ),
        ("missing.yaml", None, ": cannot read the suite file: No such file or directory"),
    ],
)
def test_a_bad_suite_file_exits_2_naming_the_file_line_scenario_and_field(
    folder: Path, name: str, text: str | None, problem: str
) -> None:
    if text is not None:
        (folder / name).write_text(text, encoding="utf-8")
    shown = kvmem(folder, "eval", "--suite", str(folder / name))
    assert (shown.exit_code, shown.stdout, shown.stderr) == (
        2,
        "",
        f"kvmem: {folder / name}{problem}\n",
    )


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


@pytest.mark.parametrize(
    ("lines", "problem"),
    [
        # Python's parser recursed once per level: a RecursionError traceback, exit 1.
        ([json.dumps(CHAT), deep(100_000)], ", line 2: nested deeper than 32 levels"),
        (
            [json.dumps({**CHAT, "note": deep(33)}), deep(33)],
            ", line 2: nested deeper than 32 levels",
        ),
        (["", " " * (1024 * 1024 + 1)], ", line 2: the line is over 1048576 bytes"),
        # 17 lines of a mebibyte each (blank lines, skipped): the file, not a line, is too big.
        ([" " * (1024 * 1024 - 1)] * 17, ", line 17: the suite file is over 16777216 bytes"),
        (
            [json.dumps({**CHAT, "id": f"s{i}"}) for i in range(10_001)],
            ", line 10001: a suite holds at most 10000 scenarios",
        ),
    ],
)
def test_a_json_lines_suite_is_bounded_line_by_line(
    folder: Path, lines: list[str], problem: str
) -> None:
    path = folder / "big.jsonl"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    shown = kvmem(folder, "eval", "--suite", str(path))
    assert (shown.exit_code, shown.stdout, shown.stderr) == (2, "", f"kvmem: {path}{problem}\n")


def test_a_suite_that_never_ends_is_refused_at_the_size_bound(folder: Path) -> None:
    for suite in (Path("/dev/zero"), folder / "zero.jsonl"):
        if suite.suffix == ".jsonl":
            suite.symlink_to("/dev/zero")
        shown = kvmem(folder, "eval", "--suite", str(suite))
        over = "line 1: the line is over 1048576 bytes" if suite.suffix else None
        expected = (
            f"kvmem: {suite}, {over}\n"
            if over
            else (f"kvmem: {suite}: the suite file is over 16777216 bytes\n")
        )
        assert (shown.exit_code, shown.stdout, shown.stderr) == (2, "", expected)


def said(text: str) -> list[dict[str, str]]:
    """A chat of one user message."""
    return [{"role": "user", "content": text}]


GATE_SUITE = [
    {**GLUTEN, "id": "asks"},
    {**GLUTEN, "id": "mentions", "messages": said("gluten-free pasta recipes?")},
    {**CHAT, "id": "hello", "messages": said("hello, how are you today?")},
    # Small talk the gate skips, but memory.agent.trigger_phrases has "sky blue".
    {**CHAT, "id": "phrase", "messages": said("why is the sky blue?")},
    {**CHAT, "id": "question", "messages": said("Please remember that I'm vegetarian")},
]


def test_gate_reports_recall_on_memory_requests_and_skip_rate_on_chit_chat(
    upstream: ScriptedUpstream, folder: Path
) -> None:
    suite = str(write_suite(folder, GATE_SUITE))
    shown = kvmem(folder, "eval", "--gate", "--suite", suite, "--json")
    assert (shown.exit_code, shown.stderr) == (0, "")
    assert json.loads(shown.stdout) == {
        "suite": suite,
        "memory_requests": 2,
        "recall": 0.5,
        "chit_chat": 3,
        "skip_rate": 0.3333,
        "categories": {"routing": {"opens": 1, "skips": 1}, "chit_chat": {"opens": 2, "skips": 1}},
        "missed_requests": ["mentions"],
        "chit_chat_let_through": ["phrase", "question"],
    }
    # A recall of 50 % is not under --min-pass 50 %: exit 0.
    at_the_bound = kvmem(folder, "eval", "--gate", "--suite", suite, "--min-pass", "50%")
    assert (at_the_bound.exit_code, at_the_bound.stderr) == (0, "")
    text = kvmem(folder, "eval", "--gate", "--suite", suite, "--min-pass", "0.6")
    assert (text.exit_code, text.stdout) == (
        1,
        (
            f"kvmem eval --gate: the intent gate on the newest user message of each of the 5 "
            f"scenarios of suite {suite} (no model calls)\n"
            "recall on memory requests: 50.0 % (1 of 2 scenarios that expect a write)\n"
            "skip rate on chit-chat: 33.3 % (1 of 3 chit_chat scenarios)\n"
            "opens the gate, per category: routing 1/2, chit_chat 2/3\n"
            "\n"
            "memory requests the gate would skip (the agent never sees them):\n"
            "- mentions: gluten-free pasta recipes?\n"
            "\n"
            "chit-chat the gate lets through (a model call each):\n"
            "- phrase: why is the sky blue?\n"
            "- question: Please remember that I'm vegetarian\n"
        ),
    )
    assert upstream.requests == []


# --- placement: inline (the main model's markers) ----------------------------------------


def evaluate_inline(
    sections: dict[str, Any], tokens: TokenCounter, suite: Suite = BUILTIN
) -> tuple[list[ScenarioResult], dict[str, Any]]:
    """`evaluate`, with `--placement inline`."""
    config = eval_config(Config.model_validate(sections), placement="inline")
    evaluation = Evaluation(config, suite, tokens=tokens, concurrency=8)
    results = anyio.run(evaluation.run)
    report = evaluation_json(
        results, suite=suite.source, model=evaluation.target.model, mode="inline", repeat=1
    )
    return results, report


def test_inline_a_perfect_main_model_scores_100_percent_through_the_real_inline_path(
    upstream: ScriptedUpstream, chat_sections: Callable[..., dict[str, Any]], tokens: TokenCounter
) -> None:
    upstream.respond(MAIN_MODEL, perfect_inline_model(BUILTIN))
    results, report = evaluate_inline(chat_sections(), tokens)

    # Markers carry no expiry (yet): every expiry scenario fails on that alone.
    assert report["summary"] == tally(77, 11)
    assert report["categories"] == category_rows({"expiry"})
    problems = {r.scenario.id: list(r.problems) for r in results if not r.passed}
    assert problems["expiry-en-until-friday"] == ["travel: expires never, expected 2026-03-06"]
    forget = next(s for s in report["scenarios"] if s["id"] == "forget-en-medication")
    assert forget == {
        "id": "forget-en-medication",
        "category": "forget",
        "language": "en",
        "run": 1,
        "passed": True,
        "state": "done",
        "problems": [],
        "operations": [{"op": "delete", "key": "health"}],
        "refused": 0,
        "answers": [{"content": "Sure.\n[FORGET: health]"}],
        "model_calls": 1,
        "input_tokens": 10,
        "output_tokens": 5,
        "cost_usd": None,
        "latency_ms": MS,
    }
    # No agent call: each request is the main model's, as a chat request under
    # `placement: inline` sends it: the scenario's chat, after a system message holding the
    # memory block and the marker instructions with the scenario's own keys.
    assert upstream.received(AGENT_MODEL) == []
    requests = upstream.received(MAIN_MODEL)
    assert len(requests) == 88
    for request in requests:
        scenario = inline_scenario_of(request, BUILTIN)
        entries = [
            Entry(key, value, tokens.count(value), "manual", datetime.now(UTC), datetime.now(UTC))
            for key, value in scenario.memory.items()
        ]
        instructions = render_marker_instructions(scenario.valid_keys, 10_000)
        assert request.messages == [
            {
                "role": "system",
                "content": with_marker_instructions(render_memory_block(entries), instructions),
            },
            *[{"role": m.role, "content": m.content} for m in scenario.messages],
        ]


def test_inline_a_main_model_that_never_writes_markers_fails_exactly_the_write_categories(
    upstream: ScriptedUpstream, chat_sections: Callable[..., dict[str, Any]], tokens: TokenCounter
) -> None:
    upstream.default(MAIN_MODEL, Reply(content="Nice to hear from you."))
    results, report = evaluate_inline(chat_sections(), tokens)

    write_categories = {"remember", "update", "forget", "language", "routing", "expiry"}
    assert report["categories"] == category_rows(write_categories)
    problems = {r.scenario.id: list(r.problems) for r in results}
    assert problems["remember-en-typo-allergy"] == ["health: not set"]
    assert problems["forget-en-medication"] == ["health: not deleted"]
    assert {r.refused for r in results} == {0}


def test_inline_refused_markers_are_counted_and_not_applied(
    upstream: ScriptedUpstream,
    chat_sections: Callable[..., dict[str, Any]],
    tokens: TokenCounter,
    tmp_path: Path,
) -> None:
    suite = load_suite(write_suite(tmp_path, [GLUTEN]))
    # A key outside valid_keys and a value over charLimit: both refused as tool calls are.
    upstream.default(
        MAIN_MODEL,
        Reply(content=f"Noted!\n[MEMORY: diet = no gluten]\n[MEMORY: food = {'gluten ' * 10}]"),
    )
    results, report = evaluate_inline(chat_sections(memory={"charLimit": 40}), tokens, suite)

    [result] = results
    assert (result.passed, result.state, result.operations, result.refused, result.problems) == (
        False,
        "done",
        (),
        2,
        ("food: not set",),
    )
    assert report["scenarios"][0]["refused"] == 2
    shown = evaluation_text(results, suite="s", model="m", mode="inline", repeat=1)
    assert shown.split("failures (1):\n")[1] == (
        "- gluten (routing)\n"
        "    message: Please remember I can't eat gluten.\n"
        "    wrong: food: not set\n"
        "    the agent wrote: nothing\n"
        "    markers refused: 2\n"
        "    model call 1 answered: "
        + json.dumps(f"Noted!\n[MEMORY: diet = no gluten]\n[MEMORY: food = {'gluten ' * 10}]")
    )


def test_inline_a_failed_main_call_fails_its_scenario(
    upstream: ScriptedUpstream,
    chat_sections: Callable[..., dict[str, Any]],
    tokens: TokenCounter,
    tmp_path: Path,
) -> None:
    suite = load_suite(write_suite(tmp_path, [CHAT]))
    upstream.script(MAIN_MODEL, Reply(status=500, error={"error": {"message": "overloaded"}}))
    [result], _ = evaluate_inline(chat_sections(), tokens, suite)
    assert (result.passed, result.state, result.model_calls) == (False, "failed", 1)
    assert result.problems == (Containing("the main call failed: "),)
    assert "overloaded" in result.problems[0]


class SlowToLoad(TokenCounter):
    """A token counter whose encoding takes `seconds` to load, as on a loaded machine."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def load(self) -> None:
        if self._encoding is None:
            time.sleep(self.seconds)
        super().load()


def test_the_encoding_loads_before_any_run_starts_its_clock(
    upstream: ScriptedUpstream, chat_sections: Callable[..., dict[str, Any]], tmp_path: Path
) -> None:
    """A CI run failed an inline scenario in 3.4 s: its markers were applied only after the
    encoding's first load, past the 3 s grace. Loaded once before the runs, a load slower
    than the grace costs neither a scenario nor its latency."""
    suite = load_suite(write_suite(tmp_path, [GLUTEN]))
    upstream.default(MAIN_MODEL, Reply(content="OK\n[MEMORY: food = No gluten]"))
    sections = chat_sections(agent={"grace_seconds": 0.2})
    [result], _ = evaluate_inline(sections, SlowToLoad(1.5), suite)
    assert (result.passed, result.state, result.problems) == (True, "done", ())
    assert result.latency_seconds < 1.5


def test_placement_on_the_command_line(upstream: ScriptedUpstream, folder: Path) -> None:
    write_suite(folder, [GLUTEN])
    suite = str(folder / "suite.jsonl")
    upstream.default("other-main", Reply(content="OK\n[MEMORY: food = No gluten]"))

    shown = kvmem(
        folder,
        "eval",
        "--suite",
        suite,
        "--placement",
        "inline",
        "--json",
        "--model",
        "openai/other-main",
    )
    assert (shown.exit_code, shown.stderr) == (0, "")
    report = json.loads(shown.stdout)
    assert (report["model"], report["mode"], report["summary"]) == (
        "openai/other-main",
        "inline",
        tally(1, 0),
    )
    assert report["scenarios"][0]["operations"] == [
        {"op": "set", "key": "food", "value": "No gluten"}
    ]
    assert [r.model for r in upstream.requests] == ["other-main"]

    bad = kvmem(folder, "eval", "--suite", suite, "--placement", "beside")
    assert (bad.exit_code, bad.stdout) == (2, "")
    assert "Invalid value for '--placement': 'beside' is not one of 'separate', 'inline'." in (
        bad.stderr
    )
    assert [r.model for r in upstream.requests] == ["other-main"]


def test_inline_needs_no_agent_model(upstream: ScriptedUpstream, tmp_path: Path) -> None:
    (tmp_path / "memory.yaml").write_text(
        json.dumps(
            {
                "chat": {"model": f"openai/{MAIN_MODEL}", "api_base": upstream.url, "api_key": "k"},
                "memory": {"agent": {"placement": "inline"}},
            }
        ),
        encoding="utf-8",
    )
    write_suite(tmp_path, [CHAT])
    upstream.default(MAIN_MODEL, Reply(content="Gern geschehen!"))
    shown = kvmem(tmp_path, "eval", "--suite", str(tmp_path / "suite.jsonl"), "--json")
    assert (shown.exit_code, shown.stderr) == (0, "")
    assert json.loads(shown.stdout)["summary"] == tally(1, 0)


def test_expiry_is_scored_on_the_day_and_the_agent_is_told_the_pinned_today(
    upstream: ScriptedUpstream, chat_sections: Callable[..., dict[str, Any]], tokens: TokenCounter
) -> None:
    """A scenario's `now` is the agent's today, and `expires` checks the entry's expiry day:
    an agent that stores the fact forever, or until the wrong day, fails on that alone."""
    expiry = [s for s in BUILTIN.scenarios if s.category == "expiry"]
    friday, antibiotics, trip = expiry[:3]
    suite = Suite("built-in", (friday, antibiotics, trip))
    wrong_day = {
        "key": "health",
        "value": "antibiotic",
        "expires_at": "2026-05-21",  # a day late
    }

    def respond(request: Any) -> Reply:
        scenario = scenario_of(request, suite)
        if scenario is friday:
            return answer(request, [{"op": "set", "key": "travel", "value": "Lisbon"}])
        if scenario is antibiotics:
            return answer(request, [{"op": "set", **wrong_day}])
        return answer(request, perfect_operations(scenario))

    upstream.respond(AGENT_MODEL, respond)
    results, report = evaluate(chat_sections(), tokens, suite)
    assert {r.scenario.id: list(r.problems) for r in results} == {
        "expiry-en-until-friday": ["travel: expires never, expected 2026-03-06"],
        "expiry-en-antibiotics": ["health: expires 2026-05-21, expected 2026-05-20"],
        "expiry-en-trip-keeps-home": [],
    }
    prompts = {
        scenario_of(r, suite).id: r.messages[1]["content"] for r in upstream.received(AGENT_MODEL)
    }
    assert "Today's date: 2026-03-04 (Wednesday, UTC)" in prompts["expiry-en-until-friday"]
    assert "Today's date: 2026-06-08 (Monday, UTC)" in prompts["expiry-en-trip-keeps-home"]
