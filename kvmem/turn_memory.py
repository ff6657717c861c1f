"""A chat turn's memory side: what to inject into the main request and the agent beside it.

Shared by /chat and /v1/chat/completions. Memory degrades, chat does not: when the store
cannot be read the request goes on without memory and the agent state is `failed`.
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
        snapshot, block, store_failed = None, "", False
        if not self.config.memory.disabled and not temporary:
            try:
                snapshot, entries, block = await run_in_threadpool(self._read, user_id)
            except StoreUnavailable as exc:
                log.warning("memory unavailable, chatting without it: user=%s: %s", user_id, exc)
                store_failed = True
        window = self.window(messages)
        state = self.agent.verdict(
            temporary=temporary,
            store_failed=store_failed,
            memories_enabled=snapshot.memories_enabled if snapshot else True,
            has_window=bool(window),
            # The newest user message itself, even without text (an image only): an older
            # message must not open the gate for it.
            newest_message=next((m.content for m in reversed(messages) if m.role == "user"), ""),
        )
        if state is not None:
            return TurnMemory(block, [e.key for e in entries], AgentRun.finished(state))
        assert snapshot is not None  # read whenever the agent may run
        run = self.agent.start(user_id, conversation_id, snapshot.entries, window)
        return TurnMemory(block, [e.key for e in entries], run)

    def _read(self, user_id: str) -> tuple[Snapshot, list[Entry], str]:
        """Read the user's memory and render its block (one trip off the event loop)."""
        snapshot = self.store.snapshot(user_id)
        if not snapshot.memories_enabled:
            return snapshot, [], ""
        entries = entries_within(snapshot.entries, self.config.memory.token_limit)
        return snapshot, entries, render_memory_block(entries)

    def main_ended(self, memory: TurnMemory) -> None:
        """The main response is complete: start the agent's grace period."""
        memory.run.main_ended(self.agent.grace_seconds)
