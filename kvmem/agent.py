"""The memory agent: a second model call beside each chat request that sets and deletes keys.

It knows nothing of HTTP. `MemoryAgent.start` launches one `AgentRun` as an asyncio task
that the app tracks; the run is cancelled `grace_seconds` after the main response ends, and a
guard run just before each commit makes sure no write lands after that deadline (a commit it
let through just before is waited for, so the reply reports every write). When a run
ends, its usage (model calls, tokens, cost, writes) is queued and recorded off the event loop
with the records of other runs that ended about then (`RecordBatches`), so that recording can
neither slow nor fail the chat.

The model writes through native tool calls (`mode: tools`) or, for models without tool
calling, through one JSON object (`mode: json`, parsed in kvmem/agent_json.py); both are
applied by the same code, with the same checks and result texts.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio.to_thread
from pydantic import ValidationError

from kvmem.agent_json import (
    JSON_MODE_INSTRUCTIONS,
    DeleteOperation,
    SetOperation,
    parse_answer,
    results_message,
)
from kvmem.agent_run import (
    AgentError,
    AgentRun,
    AgentState,
    DeadlinePassed,
    MemoryUpdate,
)
from kvmem.agent_tools import (
    DeleteMemoryArguments,
    SetMemoryArguments,
    refusal_message,
    tool_definitions,
)
from kvmem.config import AgentConfig, Config
from kvmem.entries import Entry, utcnow
from kvmem.errors import (
    KvmemError,
    UserErased,
    describe_problems,
)
from kvmem.intent import IntentGate
from kvmem.markers import Marker
from kvmem.metrics import Metrics
from kvmem.model_client import ModelClient, token_prices
from kvmem.prompts import DEFAULT_AGENT_INSTRUCTIONS, ChatLine, render_agent_input
from kvmem.proposals import ProposalStore
from kvmem.redaction import SecretScrubber
from kvmem.run_slots import RunSlot, RunSlots
from kvmem.store import MemoryStore
from kvmem.upstream import Target
from kvmem.usage import RecordBatches, RunUsage, UsageStore, day_start

log = logging.getLogger("kvmem.agent")

# States of a run that never called the model but is still recorded in `agent_runs`.
RECORDED_WITHOUT_RUN = frozenset({"over_budget"})
MAX_MODEL_CALLS = 2
MAX_TOOL_CALLS = 16


class MemoryAgent:
    """Decides whether the agent runs, runs it, and keeps track of every run in flight."""

    def __init__(
        self,
        config: Config,
        store: MemoryStore,
        client: ModelClient,
        target: Target | None,
        *,
        usage: UsageStore | None = None,
        metrics: Metrics | None = None,
        proposals: ProposalStore | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.proposals = proposals or ProposalStore(store)
        self.client = client
        self.target = target
        self.usage = usage
        self.metrics = metrics or Metrics()
        self.grace_seconds = config.memory.agent.grace_seconds if config.memory.agent else 0.0
        self.daily_token_budget = (
            config.memory.agent.daily_token_budget if config.memory.agent else None
        )
        self.outcomes: Counter[str] = Counter()
        self.last_error: AgentError | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._runs: set[AgentRun] = set()
        self._records = RecordBatches(self._write_records, self._records_lost)
        self._tools = tool_definitions(config.memory.valid_keys)
        self._scrubber = SecretScrubber.from_config(config)  # failures may quote a secret
        # Decided once from the config, not on every request.
        self._enabled = config.agent_status()[0] and target is not None
        self._prices = token_prices(target.model) if target is not None else None
        agent = config.memory.agent
        self.mode = agent.mode if agent else "tools"
        self._gate = (
            IntentGate(agent.trigger_phrases) if agent and agent.trigger == "intent" else None
        )
        bounds = agent or AgentConfig()
        self._slots = RunSlots(bounds.max_runs_per_user, bounds.max_concurrent_runs)

    @property
    def enabled(self) -> bool:
        """Whether the agent runs at all under this config."""
        return self._enabled

    def is_over_budget(self, tokens_today: int) -> bool:
        """Whether a user who used `tokens_today` today may not have another run."""
        budget = self.daily_token_budget
        return budget is not None and tokens_today >= budget

    def verdict(
        self,
        *,
        temporary: bool,
        store_failed: bool,
        memories_enabled: bool,
        has_window: bool,
        newest_message: str,
        over_budget: bool = False,
        busy: bool = False,
    ) -> AgentState | None:
        """Why the agent does not run for this request, as its state; None when it runs.

        The one place that decides: `disabled` (memory or the agent off), `skipped` (a
        temporary request, an opted-out user, no user message to read), `failed` (the store
        could not be read, so the agent would work blind), `gated` (`trigger: intent` and
        `newest_message`, the newest user message, is small talk: kvmem/intent.py), `over_budget`
        (the user's runs of today reached `daily_token_budget`), `busy` (no `RunSlot`: the
        user's runs in flight reached `max_runs_per_user`, or the process's
        `max_concurrent_runs`).
        """
        if self.config.memory.disabled:
            return "disabled"
        if temporary:
            return "skipped" if self._enabled else "disabled"
        if store_failed:
            return "failed"
        if not self._enabled:
            return "disabled"
        if not memories_enabled or not has_window:
            return "skipped"
        if self._gate is not None and not self._gate.matches(newest_message):
            return "gated"
        if over_budget:
            return "over_budget"
        if busy:
            return "busy"
        return None

    def reserve(self, user_id: str) -> RunSlot | None:
        """A place for one of the user's runs among those in flight, or None when the user's
        or the process's bound is reached. Taken before the budget is read, held until the run
        ends (`start`) or released by the caller when the agent does not run."""
        return self._slots.take(user_id)

    def not_run(
        self, state: AgentState, user_id: str, conversation_id: str | None
    ) -> AgentRun:
        """The run of a request the agent does not run for, counted (and, for `over_budget`,
        recorded, so that refused runs show in the usage)."""
        run = AgentRun.finished(state)
        self.metrics.agent_runs.labels(state=state).inc()
        if state in RECORDED_WITHOUT_RUN:
            self._record_later(run, user_id, conversation_id, duration=0.0)
        return run

    def start(
        self,
        user_id: str,
        conversation_id: str | None,
        entries: Sequence[Entry],
        window: Sequence[ChatLine],
        *,
        slot: RunSlot,
        deadline: float | None = None,
        review: bool = False,
    ) -> AgentRun:
        """Start a run as a tracked task; it works until done or cancelled at its deadline,
        and gives `slot` back when it ends.

        Without `deadline` (a `time.monotonic()` value) the deadline is set later, by
        `AgentRun.main_ended`; the sidecar hook, which has no main response, passes one.
        With `review` its writes become proposals (`kvmem.proposals`).
        """
        loop = asyncio.get_running_loop()
        run = AgentRun(
            state="running", user_id=user_id, conversation_id=conversation_id, review=review,
            _loop=loop,
        )
        started = time.monotonic()
        run.task = loop.create_task(
            self._run(run, user_id, conversation_id, entries, window, started)
        )
        self._tasks.add(run.task)
        self._runs.add(run)
        run.task.add_done_callback(self._tasks.discard)
        run.task.add_done_callback(lambda _: self._runs.discard(run))
        run.task.add_done_callback(lambda _: slot.release())
        if deadline is not None:
            run.expire_at(deadline)
        return run

    def apply_markers(
        self, run: AgentRun, user_id: str, markers: Sequence[Marker]
    ) -> None:
        """Apply an inline run's markers (`placement: inline`, collected from the main reply
        when it ended) as a tracked task, with every check of a tool call, before the run's
        deadline; a run without markers is `done` at once."""
        if not markers:
            run.state = "done"
            self.outcomes["done"] += 1
            self.metrics.agent_runs.labels(state="done").inc()
            return
        assert run._loop is not None
        run.task = run._loop.create_task(self._run_markers(run, user_id, markers))
        self._tasks.add(run.task)
        self._runs.add(run)
        run.task.add_done_callback(self._tasks.discard)
        run.task.add_done_callback(lambda _: self._runs.discard(run))

    async def _run_markers(
        self, run: AgentRun, user_id: str, markers: Sequence[Marker]
    ) -> None:
        try:
            await self._apply(run, user_id, markers[:MAX_TOOL_CALLS], self._apply_marker)
            for marker in markers[MAX_TOOL_CALLS:]:
                run.record(MemoryUpdate(marker.op, marker.key, marker.value,
                                        error=f"not applied: at most {MAX_TOOL_CALLS} markers per reply"))
            run.state = "done"
        except (asyncio.CancelledError, DeadlinePassed):
            run.state = "timeout"
            log.info("memory markers cut off at their deadline: user=%s conversation=%s",
                     user_id, run.conversation_id)
        except UserErased:  # not a failure: the user is gone, so nothing is written
            run.state = "timeout"
            log.info("memory markers cut off: their user was erased: user=%s conversation=%s",
                     user_id, run.conversation_id)
        except Exception as exc:  # the markers must never take the chat down with them
            run.state = "failed"
            log.warning("memory markers failed: user=%s conversation=%s: %s",
                        user_id, run.conversation_id, self._scrubber.scrub(str(exc)))
            self.last_error = AgentError.of(utcnow(), exc, self._scrubber.summary(exc))
            self.metrics.error("agent_failed")
        finally:
            self.outcomes[run.state] += 1
            if run._timer is not None:
                run._timer.cancel()
            self.metrics.agent_runs.labels(state=run.state).inc()

    async def _apply_marker(self, run: AgentRun, user_id: str, marker: Marker) -> tuple[str, bool]:
        """Apply one marker of the main reply as the matching tool call would be (the hook
        where a marker's write happens; a refused one is reported in `updates` with its error)."""
        result, ok = ((marker.error, False) if marker.error is not None
                      else await self._write(run, user_id, marker.key, marker.value))
        if not ok:
            run.record(MemoryUpdate(marker.op, marker.key, marker.value, error=result))
        return result, ok

    @property
    def in_flight(self) -> int:
        """How many runs are working now."""
        return len(self._tasks)

    @property
    def recording(self) -> int:
        """How many ended runs are still having their usage written."""
        return self._records.unwritten

    def tokens_today(self, user_id: str) -> int:
        """The tokens of the user's runs since midnight UTC: those recorded in the database
        (by every replica) and those of this process not written yet (from any thread)."""
        assert self.usage is not None
        now = utcnow()
        return (self.usage.tokens_today(user_id, now)
                + self._records.unwritten_tokens(user_id, day_start(now)))

    def stop_runs(self, user_id: str) -> int:
        """Stop the user's runs in flight in this process (before their erasure): none commits
        from now on. How many were stopped. (Runs of other processes are fenced by the erasure
        itself: see `kvmem.erasure`.)"""
        runs = [run for run in self._runs if run.user_id == user_id]
        for run in runs:
            run.stop()
        return len(runs)

    async def shutdown(self, drain_seconds: float = 0.0) -> None:
        """Let runs in flight end by their deadlines, waiting at most `drain_seconds`; then
        cancel the rest and wait for them to end."""
        for run in list(self._runs):
            run.main_ended(self.grace_seconds)  # a run whose reply never ended gets a deadline
        tasks = list(self._tasks)
        if tasks and drain_seconds > 0:
            await asyncio.wait(tasks, timeout=drain_seconds)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # The runs just ended queued their records: write them before the database closes.
        await self._records.close()

    async def _run(
        self,
        run: AgentRun,
        user_id: str,
        conversation_id: str | None,
        entries: Sequence[Entry],
        window: Sequence[ChatLine],
        started: float,
    ) -> None:
        try:
            await self._converse(run, user_id, entries, window)
            run.state = "done"
        except (asyncio.CancelledError, DeadlinePassed):
            run.state = "timeout"
            log.info("memory agent cut off at its deadline: user=%s conversation=%s",
                     user_id, conversation_id)
        except UserErased:
            run.state = "timeout"
            log.info("memory agent cut off: its user was erased: user=%s conversation=%s",
                     user_id, conversation_id)
        except Exception as exc:  # the agent must never take the chat down with it
            run.state = "failed"
            log.warning("memory agent failed: user=%s conversation=%s: %s",
                        user_id, conversation_id, self._scrubber.scrub(str(exc)))
            self.last_error = AgentError.of(utcnow(), exc, self._scrubber.summary(exc))
            self.metrics.error("agent_failed")
        finally:
            self.outcomes[run.state] += 1
            if run._timer is not None:
                run._timer.cancel()
            self.metrics.agent_runs.labels(state=run.state).inc()
            self.metrics.agent_tokens.labels(direction="input").inc(run.input_tokens)
            self.metrics.agent_tokens.labels(direction="output").inc(run.output_tokens)
            self._record_later(run, user_id, conversation_id, time.monotonic() - started)

    def _record_later(
        self, run: AgentRun, user_id: str, conversation_id: str | None, duration: float
    ) -> None:
        """Queue the run's usage record, so the run (and a stream waiting for it) ends now,
        not after a database write."""
        if self.usage is None:
            return
        self._records.add(RunUsage(
            user_id=user_id,
            conversation_id=conversation_id,
            started_at=run.started_at,
            duration_seconds=duration,
            model_calls=run.model_calls,
            input_tokens=run.input_tokens,
            output_tokens=run.output_tokens,
            cost_usd=self._cost(run),
            state=run.state,
            writes=sum(not update.pending for update in run.updates),
        ))

    def _write_records(self, runs: Sequence[RunUsage]) -> None:
        assert self.usage is not None
        self.usage.record(*runs)

    def _records_lost(self, runs: Sequence[RunUsage], exc: Exception) -> None:
        """A lost record is logged and counted, never the chat's problem."""
        for usage in runs:
            log.warning("agent run usage not recorded: user=%s conversation=%s: %s",
                        usage.user_id, usage.conversation_id, exc)
            self.metrics.error("usage_record_failed")

    def _cost(self, run: AgentRun) -> float | None:
        """The run's cost in USD from litellm's price map; None when the model has no price."""
        if self._prices is None:
            return None
        return run.input_tokens * self._prices[0] + run.output_tokens * self._prices[1]

    async def _converse(
        self, run: AgentRun, user_id: str, entries: Sequence[Entry], window: Sequence[ChatLine]
    ) -> None:
        assert self.target is not None
        memory = self.config.memory
        prompt = await anyio.to_thread.run_sync(
            self._agent_input, run, user_id, entries, window
        )
        instructions = (memory.agent and memory.agent.instructions) or DEFAULT_AGENT_INSTRUCTIONS
        if self.mode == "json":
            instructions = f"{instructions}\n\n{JSON_MODE_INSTRUCTIONS}"
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": instructions},
            {"role": "user", "content": prompt},
        ]
        if self.mode == "json":
            await self._converse_json(run, user_id, messages)
        else:
            await self._converse_tools(run, user_id, messages)

    def _agent_input(
        self, run: AgentRun, user_id: str, entries: Sequence[Entry], window: Sequence[ChatLine]
    ) -> str:
        """The run's input message (with the proposals pending review, under review)."""
        memory = self.config.memory
        pending = self.proposals.pending(user_id) if run.review else ()
        return render_agent_input(
            entries,
            memory.token_limit,
            memory.valid_keys,
            window,
            memory.max_input_tokens,
            self.store.tokens,
            pending,
        )

    async def _converse_tools(
        self, run: AgentRun, user_id: str, messages: list[dict[str, Any]]
    ) -> None:
        """Native tool calls: apply them; a second call carries the results if one failed."""
        assert self.target is not None
        for _ in range(MAX_MODEL_CALLS):
            response = await self._call_model(
                run, messages, user_id, tools=self._tools, tool_choice="auto"
            )
            message = response["choices"][0]["message"]
            calls = message.get("tool_calls") or []
            if not calls:
                return
            functions = [call.get("function") or {} for call in calls]
            results, failed = await self._apply(run, user_id, functions, self._call_tool)
            if not failed:
                return
            messages.append(
                {"role": "assistant", "content": message.get("content"), "tool_calls": calls}
            )
            messages += [
                {"role": "tool", "tool_call_id": call["id"], "content": result}
                for call, result in zip(calls, results, strict=True)
            ]

    async def _converse_json(
        self, run: AgentRun, user_id: str, messages: list[dict[str, Any]]
    ) -> None:
        """One JSON object of operations, no tools; a second call carries the results (as a
        user message) if one failed. An invalid answer raises `InvalidAnswer`: the run fails
        and nothing of that answer is applied."""
        assert self.target is not None
        for _ in range(MAX_MODEL_CALLS):
            response = await self._call_model(run, messages, user_id)
            answer = response["choices"][0]["message"].get("content")
            operations = parse_answer(answer)
            if not operations:
                return
            results, failed = await self._apply(run, user_id, operations, self._operate)
            if not failed:
                return
            messages.append({"role": "assistant", "content": answer})
            messages.append({"role": "user", "content": results_message(operations, results)})

    async def _call_model(
        self, run: AgentRun, messages: list[dict[str, Any]], user_id: str, **request: Any
    ) -> dict[str, Any]:
        """One model call of the run, counted with the tokens its `usage` reports (every
        call of the agent goes through here, so the usage records and the budget see it)."""
        assert self.target is not None
        run.model_calls += 1
        response = await self.client.complete(self.target, messages, user_id, **request)
        run.count_usage(response.get("usage"))
        return response

    async def _apply(
        self,
        run: AgentRun,
        user_id: str,
        requests: Sequence[Any],
        perform: Callable[[AgentRun, str, Any], Awaitable[tuple[str, bool]]],
    ) -> tuple[list[str], bool]:
        """Run `perform` on each write request (tool call or JSON operation) in order, at most
        `MAX_TOOL_CALLS`; the result strings and whether any failed."""
        results, failed = [], False
        if len(requests) > MAX_TOOL_CALLS:
            log.warning("memory agent asked for %d writes; applying the first %d",
                        len(requests), MAX_TOOL_CALLS)
            self.outcomes["tool_calls_capped"] += 1
        for index, request in enumerate(requests):
            if index >= MAX_TOOL_CALLS:
                results.append(f"Error: not applied; at most {MAX_TOOL_CALLS} tool calls per turn.")
                failed = True
                continue
            result, ok = await perform(run, user_id, request)
            results.append(result)
            failed = failed or not ok
        return results, failed

    async def _operate(
        self, run: AgentRun, user_id: str, operation: SetOperation | DeleteOperation
    ) -> tuple[str, bool]:
        """Apply one validated JSON-mode operation, as the matching tool call would be."""
        if isinstance(operation, SetOperation):
            return await self._write(run, user_id, operation.key, operation.value)
        return await self._write(run, user_id, operation.key, None)

    async def _call_tool(
        self, run: AgentRun, user_id: str, function: dict[str, Any]
    ) -> tuple[str, bool]:
        name = function.get("name")
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except json.JSONDecodeError as exc:
            return f"Error: the arguments of {name} are not valid JSON ({exc.msg}).", False
        try:
            if name == "set_memory":
                args = SetMemoryArguments.model_validate(arguments)
                return await self._write(run, user_id, args.key, args.value)
            if name == "delete_memory":
                delete = DeleteMemoryArguments.model_validate(arguments)
                return await self._write(run, user_id, delete.key, None)
        except ValidationError as exc:
            problems = describe_problems(exc, "arguments")
            return f"Error: invalid arguments for {name}: {problems}.", False
        return f'Error: tool "{name}" does not exist. Use set_memory or delete_memory.', False

    async def _write(
        self, run: AgentRun, user_id: str, key: str, value: str | None
    ) -> tuple[str, bool]:
        """Set `key` (or delete it when `value` is None) in a worker thread, or propose it
        under review; the result text the model sees and whether the write landed."""
        try:
            if run.review:
                return await anyio.to_thread.run_sync(
                    self._propose, run, user_id, key, value, abandon_on_cancel=True
                ), True
            if value is None:
                return await anyio.to_thread.run_sync(
                    self._delete, run, user_id, key, abandon_on_cancel=True
                ), True
            return await anyio.to_thread.run_sync(
                self._set, run, user_id, key, value, abandon_on_cancel=True
            ), True
        except UserErased:
            raise  # the run ends: nothing of an erased user is written
        except KvmemError as exc:
            return self._refusal(exc, key), False

    def _set(self, run: AgentRun, user_id: str, key: str, value: str) -> str:
        guard = run.commit_guard()
        try:
            written = self.store.set(
                user_id, key, value, "agent", conversation_id=run.conversation_id, guard=guard,
                since=run.started_at,
            )
            run.record(MemoryUpdate("set", written.entry.key, written.entry.value))
        finally:
            guard.release()
        self.metrics.memory_write("agent", "set")
        return f'Memory set for key "{written.entry.key}" ({written.entry.token_count} tokens)'

    def _delete(self, run: AgentRun, user_id: str, key: str) -> str:
        guard = run.commit_guard()
        try:
            self.store.delete(
                user_id, key, "agent", conversation_id=run.conversation_id, guard=guard,
                since=run.started_at,
            )
            run.record(MemoryUpdate("delete", key))
        finally:
            guard.release()
        self.metrics.memory_write("agent", "delete")
        return f'Memory deleted for key "{key}"'

    def _propose(self, run: AgentRun, user_id: str, key: str, value: str | None) -> str:
        guard = run.commit_guard()
        try:
            proposal = self.proposals.propose(
                user_id, key, value, conversation_id=run.conversation_id, guard=guard,
                since=run.started_at,
            )
            run.record(MemoryUpdate(proposal.op, proposal.key, proposal.value, pending=True))
        finally:
            guard.release()
        return (f'Proposed for review: {proposal.op} key "{proposal.key}". The user will keep '
                "or dismiss it; do not repeat it.")

    def _refusal(self, exc: KvmemError, key: str) -> str:
        """The result string the model sees for a refused write."""
        return refusal_message(exc, key, self.config.memory.valid_keys)
