"""One run of the memory agent: its state, the writes it made, its deadline and its events.

An `AgentRun` is what a chat request holds of its agent: the reply reads its state and
updates, a stream waits on its events, and the commit guard (`CommitGuard`) stops a write
that would land after the deadline. It knows nothing of models, HTTP or the database (the
store calls its guard inside the write's transaction); of the store it takes only the time
helpers `iso` and `utcnow`, from the ground-floor kvmem/entries.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from kvmem.entries import iso, utcnow
from kvmem.errors import KvmemError, UpstreamRateLimited, UpstreamRejected
from kvmem.upstream.completion_shapes import malformed

# `task`: a front end's own call (a title, tags, ...), which the agent never runs for.
AgentState = Literal[
    "disabled",
    "skipped",
    "gated",
    "over_budget",
    "busy",
    "running",
    "done",
    "failed",
    "timeout",
    "task",
]


class DeadlinePassed(Exception):
    """Raised by the commit guard once the agent's deadline has passed."""


@dataclass(frozen=True)
class MemoryUpdate:
    """One write the agent made, or (with `error`) an inline marker that was refused."""

    op: Literal["set", "delete"]
    key: str
    value: str | None = None
    # A proposal held for the person's review (`kvmem.memory.proposals`), not a write.
    pending: bool = False
    error: str | None = None
    # The scope the write went to ("": the person's own layer, shown as before scopes).
    scope: str = ""

    def as_json(self) -> dict[str, Any]:
        """The update as replies and `memory` events show it."""
        body: dict[str, Any] = {"op": self.op, "key": self.key}
        if self.value is not None:
            body["value"] = self.value
        if self.pending:
            body["pending"] = True
        if self.error is not None:
            body["error"] = self.error
        if self.scope:
            body["scope"] = self.scope
        return body


@dataclass(eq=False)
class AgentRun:
    """One run of the agent for one request: its state, its writes and its deadline."""

    state: AgentState
    updates: list[MemoryUpdate] = field(default_factory=list)
    user_id: str | None = None  # whose memory the run writes (None for a run never started)
    # The conversation the run reads; its writes are recorded in the history with it.
    conversation_id: str | None = None
    # Whether its writes become proposals for the person's review (`kvmem.memory.proposals`).
    review: bool = False
    # The turn's scope ("": none): a scoped key is written there (`MemoryRules.scope_of_write`).
    scope: str = ""
    task: asyncio.Task[None] | None = None
    deadline: float | None = None  # time.monotonic(); None until the main response ends
    started_at: datetime = field(default_factory=utcnow)
    model_calls: int = 0
    input_tokens: int = 0  # as the upstream's `usage` reported them
    output_tokens: int = 0
    _events: asyncio.Queue[MemoryUpdate] = field(default_factory=asyncio.Queue)
    _loop: asyncio.AbstractEventLoop | None = None
    _timer: asyncio.TimerHandle | None = None
    # Commits let through by a guard and not yet over, and whether the deadline has come:
    # the run ends at its deadline, or once those commits are over if some are in flight.
    _commits: int = 0
    _closed: bool = False
    _commit_lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def pending(
        cls,
        user_id: str,
        conversation_id: str | None,
        *,
        review: bool = False,
        scope: str = "",
    ) -> AgentRun:
        """An inline run: `running` from the start of the request, its task started only
        when the main response ends (kvmem/agent/memory_agent.py `MemoryAgent.apply_markers`)."""
        return cls(
            state="running",
            user_id=user_id,
            conversation_id=conversation_id,
            review=review,
            scope=scope,
            _loop=asyncio.get_running_loop(),
        )

    @classmethod
    def finished(cls, state: AgentState) -> AgentRun:
        """A run that never starts (`disabled`, `skipped`, `task` or `failed` before it began)."""
        return cls(state=state)

    def main_ended(self, grace_seconds: float) -> None:
        """The main response is complete: cancel the run `grace_seconds` from now."""
        self.expire_at(time.monotonic() + grace_seconds)

    def expire_at(self, deadline: float) -> None:
        """Cancel the run at `deadline` (a `time.monotonic()` value) unless one is already set."""
        if self.task is None or self.task.done() or self.deadline is not None:
            return
        self.deadline = deadline
        assert self._loop is not None
        self._timer = self._loop.call_later(deadline - time.monotonic(), self._expire)

    def stop(self) -> None:
        """End the run now, as its deadline would (its user is being erased): no commit is
        let through from here on, and one let through just before is waited for."""
        if self.task is not None and not self.task.done():
            self._expire()

    def check_deadline(self) -> None:
        """Raise if the deadline has passed (called from worker threads)."""
        if self._closed or (self.deadline is not None and time.monotonic() >= self.deadline):
            raise DeadlinePassed("the memory agent's deadline has passed")

    def commit_guard(self) -> CommitGuard:
        """A guard for one write, run just before its commit (see `CommitGuard`)."""
        return CommitGuard(self)

    def _admit_commit(self) -> None:
        with self._commit_lock:
            self.check_deadline()
            self._commits += 1

    def _commit_over(self) -> None:
        with self._commit_lock:
            self._commits -= 1
            end_now = self._closed and self._commits == 0
        if end_now and self._loop is not None:
            self._loop.call_soon_threadsafe(self._cancel)

    def count_usage(self, usage: dict[str, Any] | None) -> None:
        """Add one model call's `usage` (OpenAI's `prompt_tokens`/`completion_tokens`); a
        count that is no number is the upstream's malformed answer (`UpstreamError`)."""
        usage = usage or {}
        self.input_tokens += _token_count(usage, "prompt_tokens")
        self.output_tokens += _token_count(usage, "completion_tokens")

    def record(self, update: MemoryUpdate) -> None:
        """Note a committed write (called from the worker thread that committed it)."""
        self.updates.append(update)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._events.put_nowait, update)

    def landed(self) -> list[MemoryUpdate]:
        """Writes that landed since they were last taken, without waiting (for a stream)."""
        updates = []
        while not self._events.empty():
            updates.append(self._events.get_nowait())
        return updates

    async def events(self) -> Any:
        """Writes as they land, until the run ends (for a streamed reply)."""
        assert self.task is not None
        while True:
            getter = asyncio.ensure_future(self._events.get())
            try:
                await asyncio.wait({getter, self.task}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                # Also when the stream's reader went away: never leave the getter pending.
                got = getter.done()
                if not got:
                    getter.cancel()
            if got:
                yield getter.result()
                continue
            while not self._events.empty():
                yield self._events.get_nowait()
            return

    def _expire(self) -> None:
        # A commit that its guard let through just before the deadline is waited for (a few
        # ms: it already holds the database's write lock), so that the run has recorded the
        # write before it ends and its reply's `done` event reports every write that landed.
        with self._commit_lock:
            self._closed = True
            waiting = self._commits > 0
        if not waiting:
            self._cancel()

    def _cancel(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()


def _token_count(usage: dict[str, Any], name: str) -> int:
    try:
        return int(usage.get(name) or 0)
    except (TypeError, ValueError) as exc:
        raise malformed(f"usage.{name} is not a number") from exc


class CommitGuard:
    """One write's commit guard: refuses the commit once the run's deadline has passed, and
    otherwise keeps the run from ending until `release` says the write is over."""

    def __init__(self, run: AgentRun) -> None:
        self.run = run
        self.admitted = False

    def __call__(self) -> None:
        """Called by the store just before the commit; raises `DeadlinePassed` to refuse it."""
        self.run._admit_commit()
        self.admitted = True

    def release(self) -> None:
        """The write is over, committed or not (called once, after the store returned)."""
        if self.admitted:
            self.admitted = False
            self.run._commit_over()


@dataclass(frozen=True)
class AgentError:
    """The last failure of a run, for /healthz: when, kvmem's error code, the upstream's
    status (None when no answer came) and the message (secrets masked)."""

    at: datetime
    code: str
    upstream_status: int | None
    message: str

    @classmethod
    def of(cls, at: datetime, exc: BaseException, message: str) -> AgentError:
        """The failure `exc`, described by `message` (already scrubbed)."""
        code = exc.code if isinstance(exc, KvmemError) else KvmemError.code
        status = None
        if isinstance(exc, KvmemError):
            status = exc.details.get("upstream_status")
            if isinstance(exc, (UpstreamRejected, UpstreamRateLimited)):
                status = exc.status
        return cls(at, code, status if isinstance(status, int) else None, message)

    def as_json(self, *, with_message: bool) -> dict[str, Any]:
        """The error as /healthz shows it. The message may quote an upstream's reply about
        some user's request, so only a caller holding a service key sees it."""
        shown: dict[str, Any] = {
            "at": iso(self.at),
            "code": self.code,
            "upstream_status": self.upstream_status,
        }
        if with_message:
            shown["message"] = self.message
        return shown
