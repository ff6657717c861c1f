"""The agent's writes: its requests (native tool calls, JSON-mode operations, inline markers)
turned into validated writes to the memory store, or into proposals under review.

`MemoryWriter` applies at most `MAX_TOOL_CALLS` requests per model answer, each with the
checks of the store (keys, limits, the run's commit guard) and each answered by the text the
model sees: what was written, or why it was refused (`refusal_message`, kvmem/agent/tools.py,
beside the tool schemas it shares with the MCP server). A write runs in a worker thread and
is recorded on its `AgentRun`. It makes no model call and knows nothing of HTTP.

With `memory.scopes` each write goes to the layer its key belongs to in the run's turn
(`MemoryRules.scope_of_write`: a scoped key to the turn's scope, any other to the person's
own). A key the turn cannot write there (a scoped key in an unscoped turn, an own key in an
isolated one) is refused like a key outside `validKeys`, and the refusal is also reported in
the run's `updates`, with its error, so the reply says that nothing was written.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any

import anyio.to_thread
from pydantic import ValidationError

from kvmem.agent.json_mode import DeleteOperation, SetOperation
from kvmem.agent.run import AgentRun, MemoryUpdate
from kvmem.agent.tools import (
    DeleteMemoryArguments,
    SetMemoryArguments,
    refusal_message,
    writable_keys,
)
from kvmem.errors import KeyNotAllowed, KvmemError, UserErased, describe_problems
from kvmem.memory.expiry import parse_expires_at
from kvmem.memory.proposals import ProposalStore
from kvmem.memory.rules import OWN
from kvmem.memory.store import MemoryStore
from kvmem.metrics import Metrics

# The agent's logger: a capped answer is the agent's warning.
log = logging.getLogger("kvmem.agent")

MAX_TOOL_CALLS = 16

# One way to perform a write request: the result text the model sees, and whether it landed.
Perform = Callable[[AgentRun, str, Any], Awaitable[tuple[str, bool]]]


class MemoryWriter:
    """Applies the agent's write requests to one user's memory, as that run's writes."""

    def __init__(
        self,
        store: MemoryStore,
        proposals: ProposalStore,
        metrics: Metrics,
        outcomes: Counter[str],
    ) -> None:
        self.store = store
        self.proposals = proposals
        self.rules = store.rules
        self.metrics = metrics
        self.outcomes = outcomes  # the agent's: counts answers capped at MAX_TOOL_CALLS

    async def apply(
        self, run: AgentRun, user_id: str, requests: Sequence[Any], perform: Perform
    ) -> tuple[list[str], bool]:
        """Run `perform` on each write request (tool call or JSON operation) in order, at most
        `MAX_TOOL_CALLS`; the result strings and whether any failed."""
        results, failed = [], False
        if len(requests) > MAX_TOOL_CALLS:
            log.warning(
                "memory agent asked for %d writes; applying the first %d",
                len(requests),
                MAX_TOOL_CALLS,
            )
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

    async def operate(
        self, run: AgentRun, user_id: str, operation: SetOperation | DeleteOperation
    ) -> tuple[str, bool]:
        """Apply one validated JSON-mode operation, as the matching tool call would be."""
        if isinstance(operation, SetOperation):
            return await self.write(
                run, user_id, operation.key, operation.value, operation.expires_at
            )
        return await self.write(run, user_id, operation.key, None)

    async def call_tool(
        self, run: AgentRun, user_id: str, function: dict[str, Any]
    ) -> tuple[str, bool]:
        """Apply one native tool call's `function` (its name and JSON arguments): arguments
        that are not JSON or do not validate, and an unknown tool, are refused with a text
        the model can act on."""
        name = function.get("name")
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except json.JSONDecodeError as exc:
            return f"Error: the arguments of {name} are not valid JSON ({exc.msg}).", False
        try:
            if name == "set_memory":
                args = SetMemoryArguments.model_validate(arguments)
                return await self.write(run, user_id, args.key, args.value, args.expires_at)
            if name == "delete_memory":
                delete = DeleteMemoryArguments.model_validate(arguments)
                return await self.write(run, user_id, delete.key, None)
        except ValidationError as exc:
            problems = describe_problems(exc, "arguments")
            return f"Error: invalid arguments for {name}: {problems}.", False
        return f'Error: tool "{name}" does not exist. Use set_memory or delete_memory.', False

    async def write(
        self,
        run: AgentRun,
        user_id: str,
        key: str,
        value: str | None,
        expires_at: str | None = None,
        *,
        report_refusal: bool = False,
    ) -> tuple[str, bool]:
        """Set `key` (or delete it when `value` is None; a set may expire at `expires_at`, a
        date or date-time) in a worker thread, in the layer it belongs to, or propose it under
        review; the result text the model sees and whether the write landed.

        A refusal is recorded in the run's `updates` (with its error) when `report_refusal`
        asks for it, and always when the turn's scope is why (see the module's docstring).
        """
        try:
            scope = self.rules.scope_of_write(key, run.scope)
        except KeyNotAllowed as exc:
            return self._refused(run, exc, key, value, report=True), False
        try:
            expiry = parse_expires_at(expires_at) if expires_at is not None else None
            if run.review:
                return await anyio.to_thread.run_sync(
                    self._propose, run, user_id, key, value, expiry, scope, abandon_on_cancel=True
                ), True
            if value is None:
                return await anyio.to_thread.run_sync(
                    self._delete, run, user_id, key, scope, abandon_on_cancel=True
                ), True
            return await anyio.to_thread.run_sync(
                self._set, run, user_id, key, value, expiry, scope, abandon_on_cancel=True
            ), True
        except UserErased:
            raise  # the run ends: nothing of an erased user is written
        except KvmemError as exc:
            return self._refused(run, exc, key, value, report=report_refusal), False

    def _refused(
        self, run: AgentRun, exc: KvmemError, key: str, value: str | None, *, report: bool
    ) -> str:
        """The refusal's text, recorded in the run's `updates` when `report` says so."""
        refusal = self.refusal(exc, key, run.scope)
        if report:
            run.record(
                MemoryUpdate("set" if value is not None else "delete", key, value, error=refusal)
            )
        return refusal

    def refusal(self, exc: KvmemError, key: str, turn_scope: str = OWN) -> str:
        """The result string the model sees for a refused write in a turn of `turn_scope`:
        the keys it lists are those the turn may write, and a key refused because of the
        turn's scope says so."""
        message = refusal_message(
            exc, key, writable_keys(self.rules, scoped_turn=turn_scope != OWN)
        )
        if not isinstance(exc, KeyNotAllowed):
            return message
        scoped_key = self.rules.is_scoped_key(key)
        if turn_scope == OWN and scoped_key:
            return f"{message} (it is kept per scope, and this chat names no scope)"
        if turn_scope != OWN and not scoped_key and self.rules.layer(turn_scope).isolated:
            return f"{message} (this chat's scope is isolated: only its keys are written)"
        return message

    def _set(
        self,
        run: AgentRun,
        user_id: str,
        key: str,
        value: str,
        expires_at: datetime | None,
        scope: str,
    ) -> str:
        guard = run.commit_guard()
        try:
            written = self.store.set(
                user_id,
                key,
                value,
                "agent",
                conversation_id=run.conversation_id,
                guard=guard,
                since=run.started_at,
                expires_at=expires_at,
                scope=scope,
            )
            run.record(MemoryUpdate("set", written.entry.key, written.entry.value, scope=scope))
        finally:
            guard.release()
        self.metrics.memory_write("agent", "set")
        until = written.entry.expires_at
        return f'Memory set for key "{written.entry.key}" ({written.entry.token_count} tokens' + (
            f", until {until.date().isoformat()})" if until is not None else ")"
        )

    def _delete(self, run: AgentRun, user_id: str, key: str, scope: str) -> str:
        guard = run.commit_guard()
        try:
            self.store.delete(
                user_id,
                key,
                "agent",
                conversation_id=run.conversation_id,
                guard=guard,
                since=run.started_at,
                scope=scope,
            )
            run.record(MemoryUpdate("delete", key, scope=scope))
        finally:
            guard.release()
        self.metrics.memory_write("agent", "delete")
        return f'Memory deleted for key "{key}"'

    def _propose(
        self,
        run: AgentRun,
        user_id: str,
        key: str,
        value: str | None,
        expires_at: datetime | None,
        scope: str,
    ) -> str:
        guard = run.commit_guard()
        try:
            proposal = self.proposals.propose(
                user_id,
                key,
                value,
                conversation_id=run.conversation_id,
                guard=guard,
                since=run.started_at,
                expires_at=expires_at,
                scope=scope,
            )
            run.record(
                MemoryUpdate(proposal.op, proposal.key, proposal.value, pending=True, scope=scope)
            )
        finally:
            guard.release()
        return (
            f'Proposed for review: {proposal.op} key "{proposal.key}". The user will keep '
            "or dismiss it; do not repeat it."
        )
