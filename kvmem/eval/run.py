"""Running `kvmem eval`: the memory agent, as in production, on each scenario of a suite, and
the intent gate on the suite's messages.

The agent is the app's own: `MemoryAgent` (instructions, tools or JSON mode, validation,
`validKeys`, `charLimit`, `tokenLimit`, the corrective second call) started through
`MemoryService.start_agent` (the window of `messageWindowSize` messages, cut to
`maxInputTokens`), calling the model through `ModelClient`. What differs from a chat
request is only what an evaluation needs: the agent runs whatever `enabled`, `trigger` and
`daily_token_budget` say (the gate is measured apart, by `measure_gate`), its writes land
whatever `memory.review` says (they are what is scored), a scenario's
`valid_keys` replace the config's, and each scenario runs on a fresh copy of one migrated
SQLite file in a temporary folder, never on the configured database. Scoring is the
scenario's own (`Expectation.problems`); rendering is kvmem/eval/report.py's.

With `placement: inline` (or `--placement inline`) there is no agent call: the scenario's
chat goes to the main model (`chat:`) as a chat request would, through `MemoryService.begin`
(the memory block and the marker instructions) and `MainCall` (the reply's markers cut out
and applied by `MemoryAgent.apply_markers`, with every check of a tool call). The markers the
model wrote that were refused are counted, not scored.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio.to_thread

from kvmem.agent.conversation import MAX_MODEL_CALLS
from kvmem.agent.memory_agent import MemoryAgent
from kvmem.agent.prompts import ChatLine
from kvmem.agent.run import AgentRun, MemoryUpdate
from kvmem.agent.turn_memory import MemoryService
from kvmem.chat.main_call import MainCall
from kvmem.config import AgentConfig, Config, DatabaseConfig
from kvmem.db.engine import Database
from kvmem.db.migrate import upgrade
from kvmem.entries import utcnow
from kvmem.errors import ConfigError, KvmemError, SuiteError
from kvmem.eval.suite import Scenario, Suite
from kvmem.intent.gate import IntentGate
from kvmem.memory.rules import MemoryRules
from kvmem.memory.store import MemoryStore
from kvmem.metrics import Metrics
from kvmem.tokens import TokenCounter
from kvmem.upstream.base import Target
from kvmem.upstream.model_client import ModelClient, agent_target, chat_target, token_prices
from kvmem.upstream.redaction import SecretScrubber

MAX_ANSWER_CHARS = 2000  # of a model's text answer, kept for the report
# Beyond both model calls' timeouts: a backstop, not a limit a working upstream meets.
DEADLINE_MARGIN_SECONDS = 5.0


def eval_config(config: Config, model: str | None = None, placement: str | None = None) -> Config:
    """The config an evaluation runs the agent with: the operator's, with the agent on for
    every message, `placement` (`separate` or `inline`) instead of `memory.agent`'s when
    given, and `model` (`PROVIDER/MODEL`) instead of the agent's (inline: the main model's,
    `chat.model`) when given, its writes not held for review; `ConfigError` when no agent model is named for `separate`."""
    agent = config.memory.agent or AgentConfig()
    update: dict[str, Any] = {"enabled": True, "trigger": "always", "daily_token_budget": None}
    if placement is not None:
        update["placement"] = placement
    inline = update.get("placement", agent.placement) == "inline"
    chat = config.chat
    if model is not None:
        provider, _, name = model.partition("/")
        if not provider or not name:
            raise ConfigError(
                f"--model {model!r}: expected PROVIDER/MODEL, e.g. openai/gpt-4.1-mini"
            )
        if inline:
            chat = chat.model_copy(update={"model": model})
        else:
            update |= {"provider": provider, "model": name}
    agent = agent.model_copy(update=update)
    if not inline and (not agent.provider or not agent.model):
        raise ConfigError(
            "memory.agent needs provider and model to be evaluated (or pass --model PROVIDER/MODEL)"
        )
    # Under `memory.review` the writes would be proposals, and every scenario would see none.
    memory = config.memory.model_copy(update={"disabled": False, "agent": agent, "review": "off"})
    return config.model_copy(update={"memory": memory, "chat": chat})


def scenario_config(config: Config, scenario: Scenario) -> Config:
    """`config` with the scenario's `valid_keys`, when it has its own."""
    if scenario.valid_keys is None:
        return config
    memory = config.memory.model_copy(update={"valid_keys": list(scenario.valid_keys)})
    return config.model_copy(update={"memory": memory})


class AnswerLog(ModelClient):
    """The model client, keeping what the model answered each user (each run of an
    evaluation has a user of its own), so a failure can show what the model asked for,
    refused writes included."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.answers: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)

    async def complete(
        self, target: Target, messages: list[dict[str, Any]], user_id: str, **request: Any
    ) -> dict[str, Any]:
        """One completion, as `ModelClient.complete`, its answer kept."""
        response = await super().complete(target, messages, user_id, **request)
        message = ((response.get("choices") or [{}])[0]).get("message") or {}
        calls = message.get("tool_calls") or []
        if calls:
            answer: dict[str, Any] = {
                "tool_calls": [
                    {
                        "name": (c.get("function") or {}).get("name"),
                        "arguments": (c.get("function") or {}).get("arguments"),
                    }
                    for c in calls
                ]
            }
        else:
            answer = {"content": (message.get("content") or "")[:MAX_ANSWER_CHARS]}
        self.answers[user_id].append(answer)
        return response


@dataclass(frozen=True)
class ScenarioResult:
    """One run of one scenario: how the agent's run ended, what it did, what it cost."""

    scenario: Scenario
    run: int  # 1 .. --repeat
    state: str  # the agent run's state: done, failed, timeout
    problems: tuple[str, ...]
    operations: tuple[MemoryUpdate, ...]  # the writes that landed, in order
    refused: int  # inline: the markers the model wrote that were not applied
    answers: tuple[dict[str, Any], ...]  # what the model answered, call by call
    model_calls: int
    input_tokens: int
    output_tokens: int
    cost_usd: float | None
    latency_seconds: float

    @property
    def passed(self) -> bool:
        """Whether the run ended normally and the memory is as the scenario expects."""
        return not self.problems


class Evaluation:
    """Runs every scenario of a suite `repeat` times, `concurrency` runs at a time."""

    def __init__(
        self,
        config: Config,
        suite: Suite,
        *,
        repeat: int = 1,
        concurrency: int = 4,
        tokens: TokenCounter | None = None,
    ) -> None:
        self.config = config
        self.suite = suite
        self.repeat = repeat
        self.concurrency = concurrency
        self.tokens = tokens or TokenCounter()
        self.inline = config.inline_memory()
        target = chat_target(config.chat) if self.inline else agent_target(config)
        if target is None:
            raise ConfigError("memory.agent needs provider and model to be evaluated")
        self.target = target
        self.prices = token_prices(target.model)
        self.metrics = Metrics()

    async def run(self) -> list[ScenarioResult]:
        """Every run's result, in suite order (each scenario's runs together)."""
        jobs = [(s, r) for s in self.suite.scenarios for r in range(1, self.repeat + 1)]
        limit = asyncio.Semaphore(self.concurrency)
        client = AnswerLog(
            SecretScrubber.from_config(self.config),
            max_connections=self.config.chat.max_connections,
        )
        with tempfile.TemporaryDirectory(prefix="kvmem-eval-") as name:
            folder = Path(name)
            await anyio.to_thread.run_sync(_migrate, folder / "template.db")
            # Before any run's clock starts: a run's writes count tokens, and the first to
            # do so would otherwise wait for the encoding's load (seconds on a loaded
            # machine) inside its deadline and its latency.
            await anyio.to_thread.run_sync(self.tokens.load)

            async def one(number: int, scenario: Scenario, run: int) -> ScenarioResult:
                async with limit:
                    return await self._run_one(folder, client, number, scenario, run)

            try:
                async with asyncio.TaskGroup() as group:
                    tasks = [group.create_task(one(n, s, r)) for n, (s, r) in enumerate(jobs)]
            except* SuiteError as errors:
                raise errors.exceptions[0] from None
            finally:
                await client.aclose()
        return [task.result() for task in tasks]

    async def _run_one(
        self, folder: Path, client: AnswerLog, number: int, scenario: Scenario, run: int
    ) -> ScenarioResult:
        path = folder / f"run{number}.db"
        shutil.copyfile(folder / "template.db", path)
        database = Database.from_config(DatabaseConfig(url=f"sqlite:///{path}"))
        try:
            config = scenario_config(self.config, scenario)
            now = scenario.now
            store = MemoryStore(
                database,
                MemoryRules.from_config(config.memory),
                self.tokens,
                keep_days=config.memory.history.keep_days,
                # A pinned "now" is the run's today: told to the agent, judged by expiry.
                clock=(lambda: now) if now is not None else utcnow,
            )
            user_id = f"eval-{number}"
            await anyio.to_thread.run_sync(self._seed, store, user_id, scenario)
            agent = MemoryAgent(config, store, client, self.target, metrics=self.metrics)
            service = MemoryService(config, store, agent)
            window = [ChatLine(m.role, m.content) for m in scenario.messages]
            started = time.monotonic()
            if self.inline:
                agent_run, usage, failure = await self._main_call(
                    service, client, user_id, scenario
                )
            else:
                deadline = started + self.target.timeout * MAX_MODEL_CALLS + DEADLINE_MARGIN_SECONDS
                agent_run = await service.start_agent(user_id, user_id, window, deadline)
                if agent_run.task is not None:
                    await asyncio.wait({agent_run.task})
                usage = (agent_run.model_calls, agent_run.input_tokens, agent_run.output_tokens)
                failure = None
            latency = time.monotonic() - started
            await agent.shutdown()
            snapshot = await anyio.to_thread.run_sync(store.snapshot, user_id)
        finally:
            await anyio.to_thread.run_sync(database.dispose)
            for leftover in folder.glob(f"{path.name}*"):  # with its -wal and -shm files
                leftover.unlink()
        after = {entry.key: entry.value for entry in snapshot.entries}
        expiries = {entry.key: entry.expires_at for entry in snapshot.entries}
        problems = []
        if failure is not None:
            problems.append(f"the main call failed: {failure}")
        elif agent_run.state != "done":
            error = agent.last_error.message if agent.last_error else None
            ended = f"the agent run ended {agent_run.state}"
            problems.append(f"{ended}: {error}" if error else ended)
        writes = [update for update in agent_run.updates if update.error is None]
        problems += scenario.expect.problems(scenario.memory, after, len(writes), expiries)
        model_calls, input_tokens, output_tokens = usage
        return ScenarioResult(
            scenario=scenario,
            run=run,
            state="failed" if failure is not None else agent_run.state,
            problems=tuple(problems),
            operations=tuple(writes),
            refused=len(agent_run.updates) - len(writes),
            answers=tuple(client.answers.pop(user_id, [])),
            model_calls=model_calls,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cost_usd=self._cost(input_tokens, output_tokens),
            latency_seconds=latency,
        )

    async def _main_call(
        self, service: MemoryService, client: AnswerLog, user_id: str, scenario: Scenario
    ) -> tuple[AgentRun, tuple[int, int, int], str | None]:
        """The scenario's chat as an inline chat request (`placement: inline`): the main
        model's call with the memory block and the marker instructions, its markers applied
        when it ends. The run, the call's usage (calls, tokens in, tokens out), and why the
        call failed (None when it answered)."""
        call = await MainCall.start(
            service,
            client,
            user_id,
            [{"role": m.role, "content": m.content} for m in scenario.messages],
            conversation_id=user_id,
        )
        try:
            response = await call.complete()
        except KvmemError as exc:
            return call.memory.run, (1, 0, 0), exc.message
        usage = response.get("usage") or {}
        return (
            call.memory.run,
            (1, int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)),
            None,
        )

    def _seed(self, store: MemoryStore, user_id: str, scenario: Scenario) -> None:
        """Write the scenario's memory before the run, under the run's rules."""
        for key, value in scenario.memory.items():
            try:
                store.set(user_id, key, value, "manual")
            except KvmemError as exc:
                raise SuiteError(
                    f"{self.suite.source} (scenario {scenario.id!r}): memory.{key}: cannot be "
                    f"stored under this config: {exc.message}"
                ) from exc

    def _cost(self, input_tokens: int, output_tokens: int) -> float | None:
        if self.prices is None:
            return None
        return input_tokens * self.prices[0] + output_tokens * self.prices[1]


def _migrate(path: Path) -> None:
    """A migrated SQLite file at `path`, closed, for each run to copy."""
    database = Database.from_config(DatabaseConfig(url=f"sqlite:///{path}"))
    try:
        upgrade(database.engine)
    finally:
        database.dispose()


@dataclass(frozen=True)
class GateResult:
    """Whether the intent gate would let the agent run for a scenario's newest message."""

    scenario: Scenario
    opens: bool


def measure_gate(scenarios: Sequence[Scenario], phrases: Sequence[str] = ()) -> list[GateResult]:
    """The intent gate (with the operator's `trigger_phrases`) on each scenario's newest
    user message; no model is called."""
    gate = IntentGate(phrases)
    return [GateResult(scenario, gate.matches(scenario.newest_message)) for scenario in scenarios]
