"""The memory agent: a second model call beside each chat request that sets and deletes keys.

It knows nothing of HTTP. `MemoryAgent.start` launches one `AgentRun` as an asyncio task
that the app tracks, its work the `AgentConversation` with the model
(kvmem/agent/conversation.py); the run is cancelled `grace_seconds` after the main response
ends, and a guard run just before each commit makes sure no write lands after that deadline
(a commit it let through just before is waited for, so the reply reports every write). When a run
ends, its usage (model calls, tokens, cost, writes) goes to the `Ledger` (kvmem/agent/ledger.py),
which records it off the event loop and keeps the daily token budget.

The model writes through native tool calls (`mode: tools`) or one JSON object (`mode:
json`), both applied by the `MemoryWriter` (kvmem/agent/writer.py); what a run is shown and
how it talks with the model is the conversation's, not this module's. Under `placement:
inline` there is no agent call: the run's task applies the main reply's markers
(kvmem/agent/inline_writes.py). Every run ends the same way (`_end`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from kvmem.agent.conversation import AgentConversation
from kvmem.agent.inline_writes import write_markers
from kvmem.agent.ledger import Ledger
from kvmem.agent.markers import Marker
from kvmem.agent.prompts import ChatLine
from kvmem.agent.run import AgentError, AgentRun, AgentState, DeadlinePassed
from kvmem.agent.run_slots import RunSlot, RunSlots
from kvmem.agent.usage import UsageStore
from kvmem.agent.writer import MemoryWriter
from kvmem.config import AgentConfig, Config
from kvmem.entries import Entry, utcnow
from kvmem.errors import UserErased
from kvmem.memory.proposals import ProposalStore
from kvmem.memory.rules import OWN
from kvmem.memory.store import MemoryStore
from kvmem.metrics import Metrics
from kvmem.upstream.base import Target
from kvmem.upstream.model_client import ModelClient, token_prices
from kvmem.upstream.redaction import SecretScrubber

if TYPE_CHECKING:  # imported when `trigger: intent` asks for it (~45 ms of CPU at start-up)
    from kvmem.intent.gate import IntentGate

log = logging.getLogger("kvmem.agent")

# States of a run that never called the model but is still recorded in `agent_runs`.
RECORDED_WITHOUT_RUN = frozenset({"over_budget"})
# How the log names what worked in a run, and whose deadline or user it was.
AGENT_CALL = ("memory agent", "its")
INLINE_MARKERS = ("memory markers", "their")


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
        self.metrics = metrics or Metrics()
        agent = config.memory.agent
        self.grace_seconds = agent.grace_seconds if agent else 0.0
        self.ledger = Ledger(
            usage,
            token_prices(target.model) if target is not None else None,
            agent.daily_token_budget if agent else None,
            self.metrics,
        )
        self.outcomes: Counter[str] = Counter()
        self.last_error: AgentError | None = None
        self.writer = MemoryWriter(store, self.proposals, self.metrics, self.outcomes)
        self._tasks: set[asyncio.Task[None]] = set()
        self._runs: set[AgentRun] = set()
        self._scrubber = SecretScrubber.from_config(config)  # failures may quote a secret
        # Decided once from the config, not on every request.
        self._enabled = config.agent_status()[0] and target is not None
        self.mode = agent.mode if agent else "tools"
        self.conversation = AgentConversation(
            config, store, self.proposals, client, target, self.writer, self.mode
        )
        self._gate = intent_gate(agent)
        bounds = agent or AgentConfig()
        self._slots = RunSlots(bounds.max_runs_per_user, bounds.max_concurrent_runs)

    @property
    def enabled(self) -> bool:
        """Whether the agent runs at all under this config."""
        return self._enabled

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
        `newest_message`, the newest user message, is small talk: kvmem/intent/gate.py), `over_budget`
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

    def not_run(self, state: AgentState, user_id: str, conversation_id: str | None) -> AgentRun:
        """The run of a request the agent does not run for, counted (and, for `over_budget`,
        recorded, so that refused runs show in the usage)."""
        run = AgentRun.finished(state)
        self.metrics.agent_runs.labels(state=state).inc()
        if state in RECORDED_WITHOUT_RUN:
            self.ledger.record_later(run, user_id, conversation_id, duration=0.0)
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
        scope: str = OWN,
    ) -> AgentRun:
        """Start a run as a tracked task; it works until done or cancelled at its deadline,
        and gives `slot` back when it ends.

        Without `deadline` (a `time.monotonic()` value) the deadline is set later, by
        `AgentRun.main_ended`; the sidecar hook, which has no main response, passes one.
        With `review` its writes become proposals (`kvmem.memory.proposals`). A scoped turn
        passes its `scope`, with `entries` holding the scope's beside the person's own (each
        `Entry` says which; an `isolated` scope's run is shown its scope's only).
        """
        run = AgentRun(
            state="running",
            user_id=user_id,
            conversation_id=conversation_id,
            review=review,
            scope=scope,
            _loop=asyncio.get_running_loop(),
        )
        task = self._track(run, self._run(run, user_id, entries, window, time.monotonic()))
        task.add_done_callback(lambda _: slot.release())
        if deadline is not None:
            run.expire_at(deadline)
        return run

    def apply_markers(self, run: AgentRun, user_id: str, markers: Sequence[Marker]) -> None:
        """Apply an inline run's markers (`placement: inline`, collected from the main reply
        when it ended) as a tracked task, with every check of a tool call, before the run's
        deadline; a run without markers is `done` at once."""
        if not markers:
            run.state = "done"
            self.outcomes["done"] += 1
            self.metrics.agent_runs.labels(state="done").inc()
            return
        self._track(
            run,
            self._end(
                run,
                user_id,
                functools.partial(write_markers, self.writer, run, user_id, markers),
                INLINE_MARKERS,
            ),
        )

    def _track(self, run: AgentRun, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run `work` as the run's task, tracked (`in_flight`, `stop_runs`, `shutdown`)
        until it ends."""
        assert run._loop is not None
        task = run.task = run._loop.create_task(work)
        self._tasks.add(task)
        self._runs.add(run)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda _: self._runs.discard(run))
        return task

    @property
    def in_flight(self) -> int:
        """How many runs are working now."""
        return len(self._tasks)

    @property
    def recording(self) -> int:
        """How many ended runs are still having their usage written."""
        return self.ledger.unwritten

    def stop_runs(self, user_id: str) -> int:
        """Stop the user's runs in flight in this process (before their erasure): none commits
        from now on. How many were stopped. (Runs of other processes are fenced by the erasure
        itself: see `kvmem.db.erasure`.)"""
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
        await self.ledger.close()

    async def _run(
        self,
        run: AgentRun,
        user_id: str,
        entries: Sequence[Entry],
        window: Sequence[ChatLine],
        started: float,
    ) -> None:
        """An agent run's task: the conversation with the model, then its tokens counted and
        its usage handed to the ledger, however it ended."""
        try:
            await self._end(
                run,
                user_id,
                functools.partial(self.conversation.converse, run, user_id, entries, window),
                AGENT_CALL,
            )
        finally:
            self.metrics.agent_tokens.labels(direction="input").inc(run.input_tokens)
            self.metrics.agent_tokens.labels(direction="output").inc(run.output_tokens)
            self.ledger.record_later(run, user_id, run.conversation_id, time.monotonic() - started)

    async def _end(
        self,
        run: AgentRun,
        user_id: str,
        work: Callable[[], Awaitable[None]],
        who: tuple[str, str],
    ) -> None:
        """Do the run's `work` and end the run, whatever happened: `done`; `timeout` at its
        deadline or when its user is erased; `failed` on any other error (logged, secrets
        masked, and kept for /healthz). `who` names the worker in the log."""
        subject, its = who
        try:
            await work()
            run.state = "done"
        except (asyncio.CancelledError, DeadlinePassed):
            run.state = "timeout"
            log.info(
                "%s cut off at %s deadline: user=%s conversation=%s",
                subject,
                its,
                user_id,
                run.conversation_id,
            )
        except UserErased:  # not a failure: the user is gone, so nothing is written
            run.state = "timeout"
            log.info(
                "%s cut off: %s user was erased: user=%s conversation=%s",
                subject,
                its,
                user_id,
                run.conversation_id,
            )
        except Exception as exc:  # the agent must never take the chat down with it
            run.state = "failed"
            log.warning(
                "%s failed: user=%s conversation=%s: %s",
                subject,
                user_id,
                run.conversation_id,
                self._scrubber.scrub(str(exc)),
            )
            self.last_error = AgentError.of(utcnow(), exc, self._scrubber.summary(exc))
            self.metrics.error("agent_failed")
        finally:
            self.outcomes[run.state] += 1
            if run._timer is not None:
                run._timer.cancel()
            self.metrics.agent_runs.labels(state=run.state).inc()


def intent_gate(agent: AgentConfig | None) -> IntentGate | None:
    """The intent gate when `trigger: intent` asks for one, made (its model read) now, while
    the server starts, so that the first chat does not wait for it. The gate's module is
    imported only then: its patterns cost ~45 ms of CPU, which `trigger: always` (the
    default) never uses."""
    if agent is None or agent.trigger != "intent":
        return None
    from kvmem.intent.gate import IntentGate

    return IntentGate(agent.trigger_phrases)
