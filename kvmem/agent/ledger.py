"""What the agent's runs cost and may still spend: their usage records on the way to the
database, their price, and the daily token budget.

When a run ends, `Ledger.record_later` prices it (litellm's price map, read by
`model_client.token_prices`) and queues its `RunUsage`; `RecordBatches` writes the records
of runs that ended about then in one transaction, off the event loop, so that recording can
neither slow nor fail the chat. The budget counts the tokens the database holds for the user today (every
replica's runs, `UsageStore.tokens_today`) and those of this process not written yet. It knows
nothing of HTTP, models or the memory store; the database is `kvmem.agent.usage`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from datetime import datetime

import anyio.to_thread

from kvmem.agent.run import AgentRun
from kvmem.agent.usage import RunUsage, UsageStore, day_start
from kvmem.entries import utcnow
from kvmem.metrics import Metrics

# The logger of the agent whose runs these are: a lost record is the agent's warning.
log = logging.getLogger("kvmem.agent")


class Ledger:
    """The usage of one process's agent runs: recorded in batches, priced, and held to the
    daily token budget."""

    def __init__(
        self,
        usage: UsageStore | None,
        prices: tuple[float, float] | None,
        daily_token_budget: int | None,
        metrics: Metrics,
    ) -> None:
        self.usage = usage  # None: runs are not recorded and no budget is kept
        self.prices = prices  # USD per input and per output token; None: no price known
        self.daily_token_budget = daily_token_budget
        self.metrics = metrics
        self._records = RecordBatches(self._write_records, self._records_lost)

    @property
    def unwritten(self) -> int:
        """How many ended runs are still having their usage written."""
        return self._records.unwritten

    def record_later(
        self, run: AgentRun, user_id: str, conversation_id: str | None, duration: float
    ) -> None:
        """Queue the run's usage record, so the run (and a stream waiting for it) ends now,
        not after a database write."""
        if self.usage is None:
            return
        self._records.add(
            RunUsage(
                user_id=user_id,
                conversation_id=conversation_id,
                started_at=run.started_at,
                duration_seconds=duration,
                model_calls=run.model_calls,
                input_tokens=run.input_tokens,
                output_tokens=run.output_tokens,
                cost_usd=self.cost(run),
                state=run.state,
                writes=sum(not update.pending for update in run.updates),
            )
        )

    def cost(self, run: AgentRun) -> float | None:
        """The run's cost in USD from litellm's price map; None when the model has no price."""
        if self.prices is None:
            return None
        return run.input_tokens * self.prices[0] + run.output_tokens * self.prices[1]

    def tokens_today(self, user_id: str) -> int:
        """The tokens of the user's runs since midnight UTC: those recorded in the database
        (by every replica) and those of this process not written yet (from any thread)."""
        assert self.usage is not None
        now = utcnow()
        # The queue first: a batch committed and dequeued between the two reads is then in
        # the database's count (counted twice at worst), where the other order missed it.
        unwritten = self._records.unwritten_tokens(user_id, day_start(now))
        return unwritten + self.usage.tokens_today(user_id, now)

    def is_over_budget(self, user_id: str) -> bool:
        """Whether the user's runs of today reached `daily_token_budget`, so that they may not
        have another (never, without a budget or without usage records to count). Reads the
        database: call it off the event loop."""
        budget = self.daily_token_budget
        if budget is None or self.usage is None:
            return False
        return self.tokens_today(user_id) >= budget

    async def close(self) -> None:
        """Write every record still waiting, now (at shutdown, before the database closes)."""
        await self._records.close()

    def _write_records(self, runs: Sequence[RunUsage]) -> None:
        assert self.usage is not None
        self.usage.record(*runs)

    def _records_lost(self, runs: Sequence[RunUsage], exc: Exception) -> None:
        """A lost record is logged and counted, never the chat's problem."""
        for usage in runs:
            log.warning(
                "agent run usage not recorded: user=%s conversation=%s: %s",
                usage.user_id,
                usage.conversation_id,
                exc,
            )
            self.metrics.error("usage_record_failed")


# How long the first record of a batch waits for others to share its transaction, and how
# many records one transaction holds at most.
BATCH_SECONDS = 0.1
MAX_BATCH = 256


class RecordBatches:
    """Writes run records in batches, off the event loop: a batch is written `BATCH_SECONDS`
    after its first record arrived, or as soon as `MAX_BATCH` records wait; one batch is
    written at a time.

    A write per run cost about a fifth of kvmem's busy time at 32 chat requests in flight
    with the agent on (a transaction, the user's row, an ORM flush and a commit, on the GIL).

    `write` stores a batch (in a worker thread); a batch it raises for is lost, and handed to
    `on_lost` with the error. `close` (a clean shutdown) writes every record still waiting
    at once. A crash loses the records of the runs that ended in the last `BATCH_SECONDS` or
    so, where a write per run lost only those being written.
    """

    def __init__(
        self,
        write: Callable[[Sequence[RunUsage]], None],
        on_lost: Callable[[Sequence[RunUsage], Exception], None],
    ) -> None:
        self._write = write
        self._on_lost = on_lost
        self._waiting: list[RunUsage] = []
        self._writing: list[RunUsage] = []
        self._now = asyncio.Event()  # set: write what waits without waiting for more
        self._closing = False
        self._flusher: asyncio.Task[None] | None = None

    @property
    def unwritten(self) -> int:
        """How many records wait or are being written."""
        return len(self._waiting) + len(self._writing)

    def unwritten_tokens(self, user_id: str, since: datetime) -> int:
        """Input plus output tokens of the user's runs started since `since` whose records
        are not written yet, so that the daily budget counts them (from any thread)."""
        return sum(
            run.input_tokens + run.output_tokens
            for run in [*self._waiting, *self._writing]
            if run.user_id == user_id and run.started_at >= since
        )

    def add(self, run: RunUsage) -> None:
        """Queue a record (on the event loop)."""
        self._waiting.append(run)
        if len(self._waiting) >= MAX_BATCH:
            self._now.set()
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush())

    async def close(self) -> None:
        """Write every record still waiting, now (at shutdown)."""
        self._closing = True
        self._now.set()
        while self._flusher is not None and not self._flusher.done():
            await asyncio.shield(self._flusher)

    async def _flush(self) -> None:
        while self._waiting:
            if not self._now.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._now.wait(), BATCH_SECONDS)
            batch = self._writing = self._waiting[:MAX_BATCH]
            self._waiting = self._waiting[MAX_BATCH:]
            if len(self._waiting) < MAX_BATCH and not self._closing:
                self._now.clear()
            try:
                await anyio.to_thread.run_sync(self._write, batch)
            except Exception as exc:  # a lost record never fails anything else
                self._on_lost(batch, exc)
            finally:
                self._writing = []
