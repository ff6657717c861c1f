"""The MCP server's tools as MCP lists them: their argument models (unknown arguments
refused, types not coerced), the schemas generated from them as the memory agent's are
(kvmem/agent/tools.py `tool_schema`), and the hints for clients that ask before running one
(`ANNOTATIONS`). `TOOLS` maps each name to its model; `tool_definitions` lists them for the
server's rules (`scope` and `memory_scopes` only on a server that keeps scopes).

It knows nothing of requests, sessions or the store, nor of what a tool does: that is
`MemoryMcp`'s (kvmem/server/mcp_server.py), the one module that imports this one. It holds
the SDK's types (`mcp_types`), so it too is imported only late, with the MCP server.
"""

from __future__ import annotations

import mcp_types as types
from pydantic import BaseModel, ConfigDict, Field

from kvmem.agent.tools import EXPIRES_DESCRIPTION, KEY_DESCRIPTION, tool_schema
from kvmem.memory.rules import MemoryRules

DEFAULT_HISTORY_LIMIT, MAX_HISTORY_LIMIT = 50, 500  # as GET /memory/history
SCOPE_DESCRIPTION = (
    "The scope to act on: an assistant, a model or a project whose memory is kept apart "
    "from the person's own (1-128 characters of A-Z, a-z, 0-9 and . _ : @ / -). Leave it "
    "out for the session's scope (X-Memory-Scope), or else the person's own memory."
)


class ToolArguments(BaseModel):
    """Base of the tools' argument models: unknown arguments are refused, types not coerced."""

    model_config = ConfigDict(extra="forbid", strict=True)


class LayerArguments(ToolArguments):
    """Base of the tools that act on one layer of the user's memory: their own, or a
    `scope`'s."""

    scope: str | None = Field(None, description=SCOPE_DESCRIPTION)


class ListArguments(LayerArguments):
    """List everything remembered about the user: each entry's key, value, token count,
    source and dates (newest first), the total tokens against the token limit, and the
    allowed keys. Call it before changing memory to see what is already stored."""


class ScopesArguments(ToolArguments):
    """List the scopes that hold memory about the user (assistants, models or projects whose
    memory is kept apart from the person's own), by name, with how many entries and tokens
    each holds. Name one as `scope` in the other tools to read or change it."""


class GetArguments(LayerArguments):
    """Read one memory about the user by its key."""

    key: str = Field(description=KEY_DESCRIPTION)


class SetArguments(LayerArguments):
    """Remember something about the user: store `value` under `key`, replacing what the key
    held (so merge anything worth keeping into the new value). Use it only when the user asks
    to remember or update something; keep values short and factual."""

    key: str = Field(description=KEY_DESCRIPTION)
    value: str = Field(description="The complete value to store.")
    expires_at: str | None = Field(default=None, description=EXPIRES_DESCRIPTION)
    expires_in: str | None = Field(
        default=None,
        description='Instead of expires_at: how long it holds, "90m", "12h", "3d", "2w".',
    )


class DeleteArguments(LayerArguments):
    """Forget a memory about the user: delete the entry at `key`."""

    key: str = Field(description=KEY_DESCRIPTION)


class HistoryArguments(LayerArguments):
    """Show how the user's memory changed, newest first: each change's id, key, op (set or
    delete), old and new value, source (manual, agent, import, revert, mcp), conversation and
    time. Give `key` for one key's changes (also after it was deleted); for older changes,
    call again with `before` set to the `next` of the previous answer."""

    key: str | None = Field(None, description=f"{KEY_DESCRIPTION} Leave out for all keys.")
    limit: int = Field(
        DEFAULT_HISTORY_LIMIT,
        ge=1,
        le=MAX_HISTORY_LIMIT,
        description="How many changes to return at most.",
    )
    before: int | None = Field(None, ge=1, description="Only changes with a smaller id.")


class ProposalsArguments(LayerArguments):
    """List the memory agent's proposals waiting for the user's review, newest first: each
    one's id, key, op (set or delete), proposed value, conversation and time. Nothing of
    them is remembered until the user keeps one."""


class ProposalArguments(LayerArguments):
    """Keep one of the memory agent's proposals: apply it to memory now, under every rule
    (a proposal that no longer fits the token limit stays pending). Only when the user says so."""

    id: int = Field(ge=1, description="The proposal's id, from memory_proposals.")


class RejectArguments(ProposalArguments):
    """Dismiss one of the memory agent's proposals: it is dropped and nothing is remembered."""


TOOLS: dict[str, type[ToolArguments]] = {
    "memory_list": ListArguments,
    "memory_scopes": ScopesArguments,
    "memory_get": GetArguments,
    "memory_set": SetArguments,
    "memory_delete": DeleteArguments,
    "memory_history": HistoryArguments,
    "memory_proposals": ProposalsArguments,
    "memory_proposal_accept": ProposalArguments,
    "memory_proposal_reject": RejectArguments,
}


# Hints for clients that ask before running a tool: reads change nothing, a set replaces a
# value (the same call twice is the same as once), a delete loses one; nothing leaves kvmem.
READ = types.ToolAnnotations(read_only_hint=True, open_world_hint=False)
ANNOTATIONS = {
    "memory_list": READ,
    "memory_scopes": READ,
    "memory_get": READ,
    "memory_history": READ,
    "memory_proposals": READ,
    # Each answers once: a second call finds the proposal gone.
    "memory_proposal_accept": types.ToolAnnotations(
        read_only_hint=False, destructive_hint=True, idempotent_hint=False, open_world_hint=False
    ),
    "memory_proposal_reject": types.ToolAnnotations(
        read_only_hint=False, destructive_hint=True, idempotent_hint=False, open_world_hint=False
    ),
    "memory_set": types.ToolAnnotations(
        read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False
    ),
    "memory_delete": types.ToolAnnotations(
        read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False
    ),
}


def tool_definitions(rules: MemoryRules) -> list[types.Tool]:
    """The tools as MCP lists them, with schemas generated from their argument models (the
    key's description lists `validKeys` when set), as the memory agent's are. `scope` is
    shown last, and it and `memory_scopes` only on a server that keeps scopes (elsewhere
    naming one is an error)."""
    scoped = rules.scoped
    valid_keys = list(rules.valid_keys) if rules.valid_keys else None
    if valid_keys is not None and scoped is not None:
        valid_keys += scoped.valid_keys or ()
    tools = []
    for name, arguments in TOOLS.items():
        if scoped is None and name == "memory_scopes":
            continue
        function = tool_schema(name, arguments, valid_keys)["function"]
        schema = function["parameters"]
        scope = schema["properties"].pop("scope", None)
        if scope is not None and scoped is not None:
            keys = ", ".join(scoped.valid_keys or ())
            scope["description"] += f" The keys {keys} are kept per scope: name one for them."
            schema["properties"]["scope"] = scope
        tools.append(
            types.Tool(
                name=name,
                description=" ".join(function["description"].split()),
                input_schema=schema,
                annotations=ANNOTATIONS[name],
            )
        )
    return tools
