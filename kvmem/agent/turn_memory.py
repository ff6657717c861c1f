"""A chat turn's memory side: what to inject into the main request and the agent beside it.

Shared by /chat and /v1/chat/completions, and by the sidecar hooks (/memory/context,
/memory/agent) and the MCP server, so that all of them render the one same block. Memory
degrades, chat does not: when the store cannot be read the request goes on without memory
and the agent state is `failed`. The daily token budget is read in the same trip off the
event loop as the memory itself.

A turn may name a scope (`memory.scopes`, CONTRACT section 23): its block is still one read of
the store (`MemoryStore.snapshot(user, scope)`: the person's own entries and the scope's),
rendered in two parts, each within its own `tokenLimit` (the scope's only, when `isolated`),
and its agent run writes each key where it belongs.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from starlette.concurrency import run_in_threadpool

from kvmem.agent.markers import Marker
from kvmem.agent.memory_agent import MemoryAgent
from kvmem.agent.prompts import (
    ChatLine,
    entries_within,
    render_marker_instructions,
    render_memory_block,
    with_marker_instructions,
)
from kvmem.agent.run import AgentRun, AgentState
from kvmem.agent.run_slots import RunSlot
from kvmem.agent.tools import writable_keys
from kvmem.config import Config
from kvmem.entries import Entry, Snapshot
from kvmem.errors import BadRequest, StoreUnavailable
from kvmem.memory.proposals import review_in_effect
from kvmem.memory.rules import OWN
from kvmem.memory.store import MemoryStore

log = logging.getLogger("kvmem.turn_memory")

BLOCK_COUNTS_KEPT = 256
# Rendered blocks, one per user and scope (the store keeps as many users' entries).
BLOCKS_KEPT = 1024
MAX_CONVERSATION_ID = 200  # the width of memory_changes.conversation_id and agent_runs'
_PRINTABLE_ASCII = re.compile(r"[\x20-\x7e]+")


def check_conversation_id(conversation_id: str | None) -> str | None:
    """A client-given conversation id (e.g. `X-Conversation-Id`): None when absent or empty,
    else 1-200 printable ASCII characters, or `BadRequest`."""
    if conversation_id is None or conversation_id == "":
        return None
    if len(conversation_id) > MAX_CONVERSATION_ID or not _PRINTABLE_ASCII.fullmatch(
        conversation_id
    ):
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
    # `placement: inline`: the block ends with the marker instructions, and the main call
    # cuts the markers out of the reply and hands them to `MemoryService.apply_markers`.
    inline: bool = False

    def as_json(self) -> dict[str, Any]:
        """The `memory` object of a /chat reply, as things stand now."""
        return {
            "injected": self.injected,
            "agent": self.run.state,
            "updates": [update.as_json() for update in self.run.updates],
        }


def newest_user_text(messages: Sequence[ChatLine]) -> str:
    """The newest user message's text, even when it has none (an image only): an older
    message must not open the intent gate for it."""
    return next((m.content for m in reversed(messages) if m.role == "user"), "")


class MemoryService:
    """Prepares each request's memory and starts its agent run."""

    def __init__(self, config: Config, store: MemoryStore, agent: MemoryAgent) -> None:
        self.config = config
        self.store = store
        # A block changes only when the user's memory does, and counting a 200-entry block
        # costs more than reading and rendering it: recent counts are kept (thread-safe).
        self._block_tokens = functools.lru_cache(maxsize=BLOCK_COUNTS_KEPT)(store.tokens.count)
        # Per user and scope: the entries last rendered, the ones injected and their block
        # (read by worker threads without the lock: a race only renders a block twice).
        self._blocks: dict[tuple[str, str], tuple[Sequence[Entry], list[Entry], str]] = {}
        self._blocks_lock = threading.Lock()
        self.agent = agent
        self.rules = store.rules
        self.ledger = agent.ledger  # the budget is the ledger's, not the agent's
        self.inline = config.inline_memory()
        memory = config.memory
        given = memory.agent and memory.agent.instructions
        self.marker_instructions = given or render_marker_instructions(
            memory.valid_keys, memory.char_limit
        )
        # A scoped turn's markers may use the keys it may write (see `writable_keys`).
        scoped = self.rules.scoped
        self.scoped_marker_instructions = given or render_marker_instructions(
            writable_keys(self.rules, scoped_turn=True),
            scoped.char_limit if scoped is not None and scoped.isolated else memory.char_limit,
        )

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
        scope: str = OWN,
    ) -> TurnMemory:
        """Read the user's memory, render the block and start the agent (before the main call);
        `scope`: the turn's (checked by `MemoryRules.scope`), "" for none."""
        window = self.window(messages)
        newest = newest_user_text(messages)
        # An inline turn makes no agent call, so it takes no run slot.
        slot = None if self.inline else self._reserve(user_id, window, newest, temporary=temporary)
        try:
            entries: list[Entry] = []
            snapshot, block, store_failed, over_budget, review = None, "", False, False, False
            if not self.config.memory.disabled and not temporary:
                try:
                    snapshot, entries, block, over_budget, review = await run_in_threadpool(
                        self._read_turn, user_id, scope
                    )
                except StoreUnavailable as exc:
                    log.warning(
                        "memory unavailable, chatting without it: user=%s: %s", user_id, exc
                    )
                    store_failed = True
            if self.inline:
                return self._begin_inline(
                    user_id,
                    conversation_id,
                    entries,
                    block,
                    review,
                    self._inline_verdict(temporary, store_failed, snapshot, window),
                    scope,
                )
            state = self.agent.verdict(
                temporary=temporary,
                store_failed=store_failed,
                memories_enabled=snapshot.memories_enabled if snapshot else True,
                has_window=bool(window),
                over_budget=over_budget,
                busy=slot is None,
                newest_message=newest,
            )
        except BaseException:
            if slot is not None:
                slot.release()
            raise
        if state is not None:
            if slot is not None:
                slot.release()
            run = self.agent.not_run(state, user_id, conversation_id)
            return TurnMemory(block, [e.key for e in entries], run)
        assert snapshot is not None and slot is not None  # read and reserved when it runs
        run = self.agent.start(
            user_id,
            conversation_id,
            snapshot.entries,
            window,
            slot=slot,
            review=review,
            scope=scope,
        )
        return TurnMemory(block, [e.key for e in entries], run)

    def _reserve(
        self, user_id: str, window: Sequence[ChatLine], newest: str, *, temporary: bool
    ) -> RunSlot | None:
        """A `RunSlot` when the agent may run for this request as far as can be told without
        the store (taken before the budget is read: see `kvmem.agent.run_slots`); else None."""
        state = self.agent.verdict(
            temporary=temporary,
            store_failed=False,
            memories_enabled=True,
            has_window=bool(window),
            newest_message=newest,
        )
        return self.agent.reserve(user_id) if state is None else None

    @staticmethod
    def _inline_verdict(
        temporary: bool, store_failed: bool, snapshot: Snapshot | None, window: list[ChatLine]
    ) -> AgentState | None:
        """Why the main model gets no marker instructions, as the agent state; None when it
        does. There is no call to save, so the intent gate and the budget do not apply."""
        if temporary:
            return "skipped"
        if store_failed:
            return "failed"
        assert snapshot is not None
        if not snapshot.memories_enabled or not window:
            return "skipped"
        return None

    def _begin_inline(
        self,
        user_id: str,
        conversation_id: str | None,
        entries: list[Entry],
        block: str,
        review: bool,
        state: AgentState | None,
        scope: str,
    ) -> TurnMemory:
        """An inline turn: the block followed by the marker instructions, and a run that
        applies the markers once the main response ends (`main_ended`)."""
        keys = [e.key for e in entries]
        if state is not None:
            return TurnMemory(block, keys, self.agent.not_run(state, user_id, conversation_id))
        instructions = self.marker_instructions if scope == OWN else self.scoped_marker_instructions
        run = AgentRun.pending(user_id, conversation_id, review=review, scope=scope)
        return TurnMemory(with_marker_instructions(block, instructions), keys, run, inline=True)

    async def context(self, user_id: str, scope: str = OWN) -> MemoryContext:
        """The block a chat request of this user (in `scope`) would get now
        (`StoreUnavailable` if the store cannot be read): the same read and render as `begin`."""
        if self.config.memory.disabled:
            return MemoryContext("", [], 0, False)
        return await run_in_threadpool(self._context, user_id, scope)

    async def start_agent(
        self,
        user_id: str,
        conversation_id: str | None,
        messages: Sequence[ChatLine],
        deadline: float,
        scope: str = OWN,
    ) -> AgentRun:
        """Run the agent on `messages` outside a chat turn (in `scope`), cut off at `deadline`
        (`time.monotonic()`); a run that does not start comes back finished, with its state."""
        window = self.window(messages)
        # Decide what needs no read first, so that a server without an agent answers
        # `disabled` even when the store is down.
        newest = newest_user_text(messages)
        state = self.agent.verdict(
            temporary=False,
            store_failed=False,
            memories_enabled=True,
            has_window=bool(window),
            newest_message=newest,
        )
        if state is not None:
            return self.agent.not_run(state, user_id, conversation_id)  # counted, as a turn's
        slot = self.agent.reserve(user_id)
        try:
            snapshot, _, _, over_budget, review = await run_in_threadpool(
                self._read_turn, user_id, scope
            )
        except BaseException:
            if slot is not None:
                slot.release()
            raise
        state = self.agent.verdict(
            temporary=False,
            store_failed=False,
            memories_enabled=snapshot.memories_enabled,
            has_window=True,
            over_budget=over_budget,
            busy=slot is None,
            newest_message=newest,
        )
        if state is not None:
            if slot is not None:
                slot.release()
            return self.agent.not_run(state, user_id, conversation_id)
        assert slot is not None
        return self.agent.start(
            user_id,
            conversation_id,
            snapshot.entries,
            window,
            slot=slot,
            deadline=deadline,
            review=review,
            scope=scope,
        )

    def _context(self, user_id: str, scope: str) -> MemoryContext:
        snapshot, entries, block = self._read(user_id, scope)
        return MemoryContext(
            block=block,
            injected=[entry.key for entry in entries],
            token_count=self._block_tokens(block) if block else 0,
            enabled=snapshot.memories_enabled,
        )

    def _read(self, user_id: str, scope: str = OWN) -> tuple[Snapshot, list[Entry], str]:
        """Read the user's memory (and the scope's, in one read) and render its block (one
        trip off the event loop)."""
        snapshot = self.store.snapshot(user_id, scope)
        if not snapshot.memories_enabled:
            return snapshot, [], ""
        # The store hands out the same entries object until the user's memory changes, so
        # the block rendered from it is reused as long as that object is the one read.
        reader = (user_id, scope)
        rendered = self._blocks.get(reader)
        if rendered is not None and rendered[0] is snapshot.entries:
            return snapshot, rendered[1], rendered[2]
        if scope == OWN:
            entries = entries_within(snapshot.entries, self.config.memory.token_limit)
            block = render_memory_block(entries)
        else:
            entries, block = self._render_scoped(snapshot.entries, scope)
        with self._blocks_lock:
            if len(self._blocks) >= BLOCKS_KEPT:
                del self._blocks[next(iter(self._blocks))]
            self._blocks[reader] = (snapshot.entries, entries, block)
        return snapshot, entries, block

    def _render_scoped(self, read: Sequence[Entry], scope: str) -> tuple[list[Entry], str]:
        """A scoped turn's injected entries (the person's own, then the scope's) and block:
        each part within its own layer's `tokenLimit`; the scope's alone when `isolated`."""
        layer = self.rules.layer(scope)
        own = (
            []
            if layer.isolated
            else entries_within(
                [entry for entry in read if entry.scope == OWN], self.config.memory.token_limit
            )
        )
        scoped = entries_within(
            [entry for entry in read if entry.scope == scope], layer.token_limit
        )
        return [*own, *scoped], render_memory_block(own, scope, scoped)

    def _read_turn(
        self, user_id: str, scope: str = OWN
    ) -> tuple[Snapshot, list[Entry], str, bool, bool]:
        """`_read`, whether the user is over the daily token budget and whether the agent's
        writes wait for review (one trip off the event loop)."""
        snapshot, entries, block = self._read(user_id, scope)
        over_budget = snapshot.memories_enabled and self._over_budget(user_id)
        return snapshot, entries, block, over_budget, self._review(user_id)

    def _review(self, user_id: str) -> bool:
        """Whether the user's agent writes become proposals (their own switch is read only
        under `memory.review: per_user`)."""
        memory = self.config.memory
        user_review = memory.review == "per_user" and self.agent.proposals.user_review(user_id)
        return review_in_effect(memory, user_review)

    def _over_budget(self, user_id: str) -> bool:
        """Whether the user's agent runs of today reached the budget (read from the database,
        so every replica sees the same runs, plus this process's records not written yet)."""
        return self.agent.enabled and self.ledger.is_over_budget(user_id)

    def task_call(self, task: str) -> TurnMemory:
        """A front end's own call (a title, tags, ...): no block, no agent run, no markers;
        counted in `kvmem_task_calls_total{task}`, not as an agent run."""
        self.agent.metrics.task_calls.labels(task=task).inc()
        return TurnMemory("", [], AgentRun.finished("task"))

    def apply_markers(self, memory: TurnMemory, user_id: str, markers: Sequence[Marker]) -> None:
        """An inline turn's main response is complete: apply the `markers` its reply closed
        (once; `main_ended` then starts their grace period)."""
        if memory.inline and memory.run.state == "running" and memory.run.task is None:
            self.agent.apply_markers(memory.run, user_id, markers)

    def main_ended(self, memory: TurnMemory) -> None:
        """The main response is complete: start the agent's grace period."""
        memory.run.main_ended(self.agent.grace_seconds)
