"""The memory agent's conversation with the model: what one run is shown, and the calls in
which the model answers with its writes.

`AgentConversation.converse` is the work of one agent run (`MemoryAgent` starts the run, ends
it and records it; kvmem/agent/memory_agent.py). The run's input is rendered off the event
loop (kvmem/agent/prompts.py `render_agent_input`): the entries it may touch, the proposals
pending review under review, the chat window. A scoped turn's run (`memory.scopes`) sees the
person's own entries and its scope's (the scope's only when `isolated`), each part with its
limit, and is told which keys are kept per scope and which scope the chat is; its tools list
the keys it may write.

The model writes through native tool calls (`mode: tools`) or, for models without tool
calling, through one JSON object (`mode: json`, parsed in kvmem/agent/json_mode.py); both are
applied by the `MemoryWriter` (kvmem/agent/writer.py), with the same checks and result texts,
and a second call carries the results if one failed (`MAX_MODEL_CALLS`). Every call goes
through `_call_model`, which counts its tokens on the run. It knows nothing of HTTP, of the
run's task, deadline or ledger, nor of the runs in flight.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio.to_thread

from kvmem.agent.json_mode import JSON_MODE_INSTRUCTIONS, parse_answer, results_message
from kvmem.agent.prompts import (
    DEFAULT_AGENT_INSTRUCTIONS,
    ChatLine,
    ScopePart,
    render_agent_input,
)
from kvmem.agent.run import AgentRun
from kvmem.agent.tools import tool_definitions, writable_keys
from kvmem.agent.writer import MemoryWriter
from kvmem.config import Config
from kvmem.entries import Entry
from kvmem.memory.proposals import Proposal, ProposalStore
from kvmem.memory.rules import OWN
from kvmem.memory.store import MemoryStore
from kvmem.upstream.base import Target
from kvmem.upstream.completion_shapes import (
    a_string,
    an_array,
    an_object,
    first_choice,
    malformed,
    usage_of,
)
from kvmem.upstream.model_client import ModelClient

MAX_MODEL_CALLS = 2


class AgentConversation:
    """One agent's talk with its model: a run's input, and its tools or JSON mode calls."""

    def __init__(
        self,
        config: Config,
        store: MemoryStore,
        proposals: ProposalStore,
        client: ModelClient,
        target: Target | None,
        writer: MemoryWriter,
        mode: str,
    ) -> None:
        self.config = config
        self.store = store
        self.proposals = proposals
        self.client = client
        self.target = target
        self.writer = writer
        self.mode = mode
        self._tools = tool_definitions(config.memory.valid_keys)
        # A scoped turn's tools list the keys it may write: the same in every scope.
        self._scoped_tools = tool_definitions(writable_keys(store.rules, scoped_turn=True))

    async def converse(
        self, run: AgentRun, user_id: str, entries: Sequence[Entry], window: Sequence[ChatLine]
    ) -> None:
        """The run's conversation with the model: its input, then tool calls or JSON mode."""
        assert self.target is not None
        memory = self.config.memory
        prompt = await anyio.to_thread.run_sync(self._agent_input, run, user_id, entries, window)
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
        """The run's input message (with the proposals pending review, under review); a
        scoped turn's holds its scope's part."""
        memory = self.config.memory
        if run.scope == OWN:
            own, scope, pending = entries, None, self._pending(run, user_id, OWN)
        else:
            layer = self.store.rules.layer(run.scope)
            own = [e for e in entries if e.scope == OWN]  # not shown when isolated
            scope = ScopePart(
                run.scope,
                [e for e in entries if e.scope == run.scope],
                layer.token_limit,
                layer.valid_keys or (),
                layer.isolated,
            )
            pending = self._pending(run, user_id, run.scope)
            if not layer.isolated:
                pending = self._pending(run, user_id, OWN) + pending
        return render_agent_input(
            own,
            memory.token_limit,
            memory.valid_keys,
            window,
            memory.max_input_tokens,
            self.store.tokens,
            pending,
            now=self.store.clock(),
            scope=scope,
        )

    def _pending(self, run: AgentRun, user_id: str, scope: str) -> tuple[Proposal, ...]:
        return self.proposals.pending(user_id, scope) if run.review else ()

    async def _converse_tools(
        self, run: AgentRun, user_id: str, messages: list[dict[str, Any]]
    ) -> None:
        """Native tool calls: apply them; a second call carries the results if one failed."""
        assert self.target is not None
        for _ in range(MAX_MODEL_CALLS):
            tools = self._tools if run.scope == OWN else self._scoped_tools
            response = await self._call_model(
                run, messages, user_id, tools=tools, tool_choice="auto"
            )
            message = first_choice(response)["message"]
            listed = an_array(message.get("tool_calls"), "choices[0].message.tool_calls")
            calls = [an_object(call, "a tool call") for call in listed]
            if not calls:
                return
            functions = [_function(call) for call in calls]
            results, failed = await self.writer.apply(
                run, user_id, functions, self.writer.call_tool
            )
            if not failed:
                return
            messages.append(
                {"role": "assistant", "content": message.get("content"), "tool_calls": calls}
            )
            messages += [
                {"role": "tool", "tool_call_id": _call_id(call), "content": result}
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
            answer = a_string(
                first_choice(response)["message"].get("content"), "choices[0].message.content"
            )
            operations = parse_answer(answer)
            if not operations:
                return
            results, failed = await self.writer.apply(run, user_id, operations, self.writer.operate)
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
        run.count_usage(usage_of(response))
        return response


def _function(call: dict[str, Any]) -> dict[str, Any]:
    """A tool call's `function`: an object with string (or absent) `arguments`; any other
    shape is the upstream's malformed answer (`UpstreamError`), not the model's mistake."""
    function = an_object(call.get("function"), "a tool call's function")
    a_string(function.get("arguments"), "a tool call's arguments")
    return function


def _call_id(call: dict[str, Any]) -> str:
    """The id a tool result must name (needed only when results go back to the model)."""
    call_id = a_string(call.get("id"), "a tool call's id")
    if call_id is None:
        raise malformed("a tool call has no id")
    return call_id
