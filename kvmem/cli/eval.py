"""`kvmem eval`: measure the memory agent's model (or the intent gate) on a suite of
scenarios.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from kvmem.cli.command import config_option, fail, loaded_config
from kvmem.cli.output import print_json
from kvmem.errors import ConfigError


class PassRate(click.ParamType):
    """A share of runs: `0.9` or `90%`."""

    name = "rate"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        """`value` as a number from 0 to 1."""
        if isinstance(value, float):
            return value
        text = str(value).strip()
        try:
            rate = float(text.removesuffix("%")) / (100 if text.endswith("%") else 1)
        except ValueError:
            self.fail(f"{value!r} is not a pass rate: write 0.9 or 90%", param, ctx)
        if not 0 <= rate <= 1:
            self.fail(f"{value!r} is not between 0 and 1 (0% and 100%)", param, ctx)
        return rate


@click.command("eval")
@config_option
@click.option(
    "--suite",
    "suite_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Scenarios to run (YAML, or JSON lines ending in .jsonl); default: the built-in suite.",
)
@click.option(
    "--model",
    default=None,
    help="PROVIDER/MODEL to evaluate instead of memory.agent's (its endpoint and key stay).",
)
@click.option(
    "--repeat",
    type=click.IntRange(1, 100),
    default=1,
    show_default=True,
    help="Runs of each scenario (for models that vary).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
@click.option(
    "--min-pass",
    type=PassRate(),
    default=0.0,
    show_default=True,
    help="Exit 1 when the pass rate (with --gate: the recall) is under this: 0.9 or 90%.",
)
@click.option(
    "--gate",
    is_flag=True,
    help="Measure the intent gate on the suite's messages instead (no model calls).",
)
@click.option(
    "--concurrency",
    type=click.IntRange(1, 64),
    default=4,
    show_default=True,
    help="Scenario runs in flight at once.",
)
@click.option(
    "--placement",
    type=click.Choice(["separate", "inline"]),
    default=None,
    help="Score the memory agent (separate) or the main model's markers (inline); "
    "default: memory.agent.placement.",
)
def evaluate(
    suite_path: str | None,
    model: str | None,
    repeat: int,
    as_json: bool,
    min_pass: float,
    gate: bool,
    concurrency: int,
    placement: str | None,
) -> None:
    """Measure the memory agent's model on scenarios, each on a fresh temporary store."""
    from kvmem.errors import SuiteError
    from kvmem.eval.suite import builtin_suite, load_suite

    loaded = loaded_config()
    try:
        suite = load_suite(Path(suite_path)) if suite_path else builtin_suite()
    except SuiteError as exc:
        fail(str(exc), 2)
    if gate:
        from kvmem.eval.report import GateSummary
        from kvmem.eval.run import measure_gate

        agent = loaded.config.memory.agent
        summary = GateSummary(
            tuple(measure_gate(suite.scenarios, agent.trigger_phrases if agent else ()))
        )
        if as_json:
            print_json({"suite": suite.source, **summary.as_json()})
        else:
            click.echo(summary.text(suite.source))
        if summary.recall < min_pass:
            sys.exit(1)
        return

    import logging

    import anyio

    from kvmem.eval.report import evaluation_json, evaluation_text
    from kvmem.eval.run import Evaluation, eval_config

    # A failed run's error is in the report; the agent's own warning would say it again.
    agent_log = logging.getLogger("kvmem.agent")
    level = agent_log.level
    agent_log.setLevel(logging.ERROR)
    try:
        config = eval_config(loaded.config, model, placement)
        evaluation = Evaluation(config, suite, repeat=repeat, concurrency=concurrency)
        results = anyio.run(evaluation.run)
    except (ConfigError, SuiteError) as exc:
        fail(f"{loaded.path}: {exc}" if isinstance(exc, ConfigError) else str(exc), 2)
    finally:
        agent_log.setLevel(level)  # as it was (for a caller that runs the command in-process)
    mode = (
        "inline"
        if evaluation.inline
        else (config.memory.agent.mode if config.memory.agent else "tools")
    )
    facts = {"suite": suite.source, "model": evaluation.target.model, "mode": mode}
    if as_json:
        print_json(evaluation_json(results, **facts, repeat=repeat))
    else:
        click.echo(evaluation_text(results, **facts, repeat=repeat))
    passed = sum(result.passed for result in results)
    if passed < min_pass * len(results):
        sys.exit(1)
