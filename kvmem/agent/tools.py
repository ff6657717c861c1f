"""The memory agent's two tools: their argument models, the schemas generated from them, the
keys a turn may write (`writable_keys`), and the text a model is told when a write is refused
(shared with the MCP server's tools)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from kvmem.errors import (
    EmptyValue,
    InvalidKey,
    KeyNotAllowed,
    KvmemError,
    MemoryFull,
    NotFound,
    ValueTooLong,
)
from kvmem.memory.rules import MemoryRules

KEY_DESCRIPTION = "The memory key: lowercase letters, digits and _, starting with a letter."
EXPIRES_DESCRIPTION = (
    "Only for a fact true for a while: the last day it holds (YYYY-MM-DD, UTC) or an RFC 3339 "
    "date-time; after it the memory is forgotten. Omit for lasting facts."
)


class SetMemoryArguments(BaseModel):
    """Save a memory about the user, replacing what the key held."""

    model_config = ConfigDict(extra="forbid", strict=True)
    key: str = Field(description=KEY_DESCRIPTION)
    value: str = Field(description="The complete value to store.")
    expires_at: str | None = Field(default=None, description=EXPIRES_DESCRIPTION)


class DeleteMemoryArguments(BaseModel):
    """Forget a memory about the user."""

    model_config = ConfigDict(extra="forbid", strict=True)
    key: str = Field(description=KEY_DESCRIPTION)


# The agent's tools: the name the model calls, and the model its arguments must validate as.
TOOLS: dict[str, type[BaseModel]] = {
    "set_memory": SetMemoryArguments,
    "delete_memory": DeleteMemoryArguments,
}


def tool_schema(
    name: str, arguments: type[BaseModel], valid_keys: Sequence[str] | None
) -> dict[str, Any]:
    """One tool in OpenAI's format, generated from its argument model (docstring, fields and
    their descriptions), so the schema the model sees and the validation cannot drift apart."""
    schema = arguments.model_json_schema()
    schema.pop("title", None)
    schema.pop("description", None)
    for field_schema in schema["properties"].values():
        field_schema.pop("title", None)
        # An optional field (`str | None = None`) is shown as its type alone: leaving it out
        # is how a model says "none", and small models stumble on `anyOf` with null.
        options = field_schema.get("anyOf")
        if options and {"type": "null"} in options and field_schema.get("default", 0) is None:
            [kept] = [option for option in options if option != {"type": "null"}]
            del field_schema["anyOf"], field_schema["default"]
            field_schema.update(kept)
    if valid_keys and "key" in schema["properties"]:
        key = schema["properties"]["key"]
        key["description"] = f"{key['description']} Must be one of: {', '.join(valid_keys)}."
    return {
        "type": "function",
        "function": {"name": name, "description": arguments.__doc__, "parameters": schema},
    }


def tool_definitions(valid_keys: Sequence[str] | None) -> list[dict[str, Any]]:
    """The agent's tools in OpenAI's format; the key's description lists `validKeys` when set."""
    return [tool_schema(name, arguments, valid_keys) for name, arguments in TOOLS.items()]


def writable_keys(rules: MemoryRules, scoped_turn: bool) -> tuple[str, ...] | None:
    """The keys the agent may write in a turn (None: any well-formed key): the person's own
    `validKeys`, and in a scoped turn the keys kept per scope too (only those when scopes
    are `isolated`)."""
    scoped = rules.scoped
    if not scoped_turn or scoped is None:
        return rules.valid_keys
    if scoped.isolated:
        return scoped.valid_keys
    if rules.valid_keys is None:
        return None
    return (*rules.valid_keys, *(scoped.valid_keys or ()))


def refusal_message(exc: KvmemError, key: Any, valid_keys: Sequence[str] | None) -> str:
    """What a model is told when a memory write on `key` is refused (the agent's tool result,
    and the text of an MCP tool's error result)."""
    if isinstance(exc, KeyNotAllowed | InvalidKey):
        if valid_keys:
            return f'Invalid key "{key}". Must be one of: {", ".join(valid_keys)}'
        return (
            f'Invalid key "{key}". Keys are lowercase letters, digits and _, '
            "start with a letter, and are at most 128 characters."
        )
    if isinstance(exc, MemoryFull) and "max_scopes" in exc.details:
        return (
            f"Memory already holds its limit of {exc.details['max_scopes']} scopes, and this "
            "would start another. Cannot save this memory."
        )
    if isinstance(exc, MemoryFull):
        return "Memory storage would exceed limit. Cannot save this memory."
    if isinstance(exc, EmptyValue):
        return f'Empty value for key "{key}". Cannot save an empty memory.'
    if isinstance(exc, ValueTooLong):
        return (
            f'Value for key "{key}" is too long ({exc.details["length"]} characters; '
            f"the limit is {exc.details['char_limit']}). Shorten it."
        )
    if isinstance(exc, NotFound):
        return f'No memory with key "{key}". Nothing to delete.'
    return f"Error: {exc.message}"
