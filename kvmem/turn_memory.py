"""A chat turn's memory side: what to inject into the main request and the agent beside it.

Shared by /chat and /v1/chat/completions. Memory degrades, chat does not: when the store
cannot be read the request goes on without memory and the agent state is `failed`. The
daily token budget is read in the same trip off the event loop as the memory itself.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from starlette.concurrency import run_in_threadpool

from kvmem.agent import AgentRun, MemoryAgent
from kvmem.config import Config
from kvmem.errors import StoreUnavailable
from kvmem.prompts import ChatLine, entries_within, render_memory_block
from kvmem.store import Entry, MemoryStore, Snapshot
from kvmem.tables import utcnow

log = logging.getLogger("kvmem.turn_memory")


@dataclass(frozen=True)
class TurnMemory:
    """What memory contributes to one request: the block, the injected keys, the agent run."""

    block: str
    injected: list[str]
    run: AgentRun

    def as_json(self) -> dict[str, Any]:
        """The `memory` object of a /chat reply, as things stand now."""
        return {
            "injected": self.injected,
            "agent": self.run.state,
            "updates": [update.as_json() for update in self.run.updates],
        }


class MemoryService:
    """Prepares each request's memory and starts its agent run."""

    def __init__(self, config: Config, store: MemoryStore, agent: MemoryAgent) -> None:
        self.config = config
        self.store = store
        self.agent = agent

    def window(self, messages: Sequence[ChatLine]) -> list[ChatLine]:
        """The last `messageWindowSize` user/assistant messages, ending at the newest user one."""
        lines = [m for m in messages if m.role in ("user", "assistant") and m.content]
        while lines and lines[-1].role != "user":
            lines.pop()
        return lines[-self.config.memory.message_window_size :]

    async def begin(
        self,
        user_id: str,
        conversation_id: str | None,
        messages: Sequence[ChatLine],
        *,
        temporary: bool,
    ) -> TurnMemory:
        """Read the user's memory, render the block and start the agent (before the main call)."""
        entries: list[Entry] = []
        snapshot, block, store_failed, over_budget = None, "", False, False
        if not self.config.memory.disabled and not temporary:
            try:
                snapshot, entries, block, over_budget = await run_in_threadpool(
                    self._read, user_id
                )
            except StoreUnavailable as exc:
                log.warning("memory unavailable, chatting without it: user=%s: %s", user_id, exc)
                store_failed = True
        window = self.window(messages)
        state = self.agent.verdict(
            temporary=temporary,
            store_failed=store_failed,
            memories_enabled=snapshot.memories_enabled if snapshot else True,
            has_window=bool(window),
            over_budget=over_budget,
        )
        if state is not None:
            run = self.agent.not_run(state, user_id, conversation_id)
            return TurnMemory(block, [e.key for e in entries], run)
        assert snapshot is not None  # read whenever the agent may run
        run = self.agent.start(user_id, conversation_id, snapshot.entries, window)
        return TurnMemory(block, [e.key for e in entries], run)

    def _read(self, user_id: str) -> tuple[Snapshot, list[Entry], str, bool]:
        """Read the user's memory, render its block and tell whether the user is over the
        daily token budget (one trip off the event loop)."""
        snapshot = self.store.snapshot(user_id)
        if not snapshot.memories_enabled:
            return snapshot, [], "", False
        entries = entries_within(snapshot.entries, self.config.memory.token_limit)
        return snapshot, entries, render_memory_block(entries), self._over_budget(user_id)

    def _over_budget(self, user_id: str) -> bool:
        """Whether the user's agent runs of today reached the budget (read from the database,
        so every replica sees the same runs)."""
        agent = self.agent
        if agent.daily_token_budget is None or agent.usage is None or not agent.enabled:
            return False
        return agent.is_over_budget(agent.usage.tokens_today(user_id, utcnow()))

    def main_ended(self, memory: TurnMemory) -> None:
        """The main response is complete: start the agent's grace period."""
        memory.run.main_ended(self.agent.grace_seconds)
