"""A chat turn's memory side: what to inject into the main request and the agent beside it.

Shared by /chat and /v1/chat/completions, and by the sidecar hooks (/memory/context,
/memory/agent) and the MCP server, so that all of them render the one same block. Memory
degrades, chat does not: when the store cannot be read the request goes on without memory
and the agent state is `failed`.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from starlette.concurrency import run_in_threadpool

from kvmem.agent import AgentRun, MemoryAgent
from kvmem.config import Config
from kvmem.errors import BadRequest, StoreUnavailable
from kvmem.prompts import ChatLine, entries_within, render_memory_block
from kvmem.store import Entry, MemoryStore, Snapshot

log = logging.getLogger("kvmem.turn_memory")

BLOCK_COUNTS_KEPT = 256
MAX_CONVERSATION_ID = 200  # the width of memory_changes.conversation_id and agent_runs'
_PRINTABLE_ASCII = re.compile(r"[\x20-\x7e]+")


def check_conversation_id(conversation_id: str | None) -> str | None:
    """A client-given conversation id (e.g. `X-Conversation-Id`): None when absent or empty,
    else 1-200 printable ASCII characters, or `BadRequest`."""
    if conversation_id is None or conversation_id == "":
        return None
    if len(conversation_id) > MAX_CONVERSATION_ID or not _PRINTABLE_ASCII.fullmatch(conversation_id):
        raise BadRequest(
            f"invalid conversation id: use 1-{MAX_CONVERSATION_ID} printable ASCII characters"
        )
    return conversation_id


@dataclass(frozen=True)
class MemoryContext:
    """What kvmem would inject for a user now: the block, its keys and its token count."""

    block: str
    injected: list[str]
    token_count: int
    enabled: bool


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
        # A block changes only when the user's memory does, and counting a 200-entry block
        # costs more than reading and rendering it: recent counts are kept (thread-safe).
        self._block_tokens = functools.lru_cache(maxsize=BLOCK_COUNTS_KEPT)(store.tokens.count)
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
        )
        if state is not None:
            return TurnMemory(block, [e.key for e in entries], AgentRun.finished(state))
        assert snapshot is not None  # read whenever the agent may run
        run = self.agent.start(user_id, conversation_id, snapshot.entries, window)
        return TurnMemory(block, [e.key for e in entries], run)

    async def context(self, user_id: str) -> MemoryContext:
        """The block a chat request of this user would get now (`StoreUnavailable` if the
        store cannot be read): the same read and render as `begin`."""
        if self.config.memory.disabled:
            return MemoryContext("", [], 0, False)
        return await run_in_threadpool(self._context, user_id)

    async def start_agent(
        self,
        user_id: str,
        conversation_id: str | None,
        messages: Sequence[ChatLine],
        deadline: float,
    ) -> AgentRun:
        """Run the agent on `messages` outside a chat turn, cut off at `deadline`
        (`time.monotonic()`); a run that does not start comes back finished, with its state."""
        window = self.window(messages)
        # Decide what needs no read first, so that a server without an agent answers
        # `disabled` even when the store is down.
        state = self.agent.verdict(
            temporary=False, store_failed=False, memories_enabled=True, has_window=bool(window)
        )
        if state is not None:
            return AgentRun.finished(state)
        snapshot = await run_in_threadpool(self.store.snapshot, user_id)
        if not snapshot.memories_enabled:
            return AgentRun.finished("skipped")
        return self.agent.start(user_id, conversation_id, snapshot.entries, window, deadline=deadline)

    def _context(self, user_id: str) -> MemoryContext:
        snapshot, entries, block = self._read(user_id)
        return MemoryContext(
            block=block,
            injected=[entry.key for entry in entries],
            token_count=self._block_tokens(block) if block else 0,
            enabled=snapshot.memories_enabled,
        )

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
