"""One run of the memory agent: its state, the writes it made, its deadline and its events.

An `AgentRun` is what a chat request holds of its agent: the reply reads its state and
updates, a stream waits on its events, and the commit guard (`check_deadline`) stops a write
that would land after the deadline. It knows nothing of models, HTTP or the database.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from kvmem.store import iso
from kvmem.tables import utcnow

AgentState = Literal[
    "disabled", "skipped", "gated", "over_budget", "running", "done", "failed", "timeout"
]


class DeadlinePassed(Exception):
    """Raised by the commit guard once the agent's deadline has passed."""


@dataclass(frozen=True)
class MemoryUpdate:
    """One write the agent made."""

    op: Literal["set", "delete"]
    key: str
    value: str | None = None

    def as_json(self) -> dict[str, Any]:
        """The update as replies and `memory` events show it."""
        body: dict[str, Any] = {"op": self.op, "key": self.key}
        if self.value is not None:
            body["value"] = self.value
        return body


@dataclass(eq=False)
class AgentRun:
    """One run of the agent for one request: its state, its writes and its deadline."""

    state: AgentState
    updates: list[MemoryUpdate] = field(default_factory=list)
    # The conversation the run reads; its writes are recorded in the history with it.
    conversation_id: str | None = None
    task: asyncio.Task[None] | None = None
    deadline: float | None = None  # time.monotonic(); None until the main response ends
    started_at: datetime = field(default_factory=utcnow)
    model_calls: int = 0
    input_tokens: int = 0  # as the upstream's `usage` reported them
    output_tokens: int = 0
    _events: asyncio.Queue[MemoryUpdate] = field(default_factory=asyncio.Queue)
    _loop: asyncio.AbstractEventLoop | None = None
    _timer: asyncio.TimerHandle | None = None

    @classmethod
    def finished(cls, state: AgentState) -> AgentRun:
        """A run that never starts (`disabled`, `skipped` or `failed` before it began)."""
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

    def check_deadline(self) -> None:
        """The commit guard: raise if the deadline has passed (called from worker threads)."""
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise DeadlinePassed("the memory agent's deadline has passed")

    def count_usage(self, usage: dict[str, Any] | None) -> None:
        """Add one model call's `usage` (OpenAI's `prompt_tokens`/`completion_tokens`)."""
        usage = usage or {}
        self.input_tokens += int(usage.get("prompt_tokens") or 0)
        self.output_tokens += int(usage.get("completion_tokens") or 0)

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
        if self.task is not None and not self.task.done():
            self.task.cancel()


@dataclass(frozen=True)
class AgentError:
    """The last failure of a run, for /healthz: when, and what (secrets masked)."""

    at: datetime
    message: str

    def as_json(self) -> dict[str, str]:
        """The error as /healthz shows it."""
        return {"at": iso(self.at), "message": self.message}
