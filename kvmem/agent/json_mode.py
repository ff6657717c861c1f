"""JSON mode for models without tool calling: the instructions, and reading the answer.

With `memory.agent.mode: json` the agent's request carries no tools. The model answers one
JSON object, `{"operations": [{"op": "set", "key", "value"} | {"op": "delete", "key"}]}`,
which this module parses and validates as a whole (a fenced code block is accepted). An
answer that is not such an object, or holds an unknown op or a field of the wrong type, is
refused entirely: nothing of it is applied. Applying the operations is the `MemoryWriter`'s
(kvmem/agent/writer.py), exactly as for tool calls; this module knows nothing of the store.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from kvmem.errors import describe_problems

JSON_MODE_INSTRUCTIONS = """\
# Answer format
You have no tools in this conversation. Instead of calling set_memory or delete_memory, \
answer with only one JSON object and nothing else:
{"operations": [{"op": "set", "key": "<key>", "value": "<the complete new value>"}, \
{"op": "delete", "key": "<key>"}]}
- "set" stores or replaces the value of a key, as set_memory would; "delete" forgets a key, \
as delete_memory would.
- A "set" of a fact true only for a while also has "expires_at": "YYYY-MM-DD", the last \
day it holds, as set_memory takes it.
- If there is nothing to remember or forget, answer {"operations": []}.
- No prose, no explanation, no other fields."""


class SetOperation(BaseModel):
    """Store or replace the value of a key."""

    model_config = ConfigDict(extra="forbid", strict=True)
    op: Literal["set"]
    key: str
    value: str
    expires_at: str | None = None


class DeleteOperation(BaseModel):
    """Forget a key."""

    model_config = ConfigDict(extra="forbid", strict=True)
    op: Literal["delete"]
    key: str


Operation = Annotated[SetOperation | DeleteOperation, Field(discriminator="op")]
_OPERATIONS = TypeAdapter(list[Operation])

# One fenced block: ``` or ```json, its body, the closing fence.
_FENCE = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\n?(.*?)```", re.DOTALL)
# Reasoning models served by Ollama (qwen3, deepseek-r1, ...) write their thinking first, in
# the content itself; it is not part of the answer.
_THINKING = re.compile(r"^\s*<think>.*?</think>", re.DOTALL)


class InvalidAnswer(Exception):
    """The model's answer is not a valid `{"operations": [...]}` object; nothing is applied."""


def _json_text(answer: str) -> str:
    """The JSON the answer holds: the whole answer, or its one fenced block (after any
    leading <think> block)."""
    answer = _THINKING.sub("", answer, count=1)
    fences = _FENCE.findall(answer)
    if len(fences) == 1:
        return fences[0].strip()
    if len(fences) > 1:
        raise InvalidAnswer(f"the answer holds {len(fences)} fenced blocks; expected one object")
    return answer.strip()


def parse_answer(answer: str | None) -> list[SetOperation | DeleteOperation]:
    """The validated operations of a JSON-mode answer, in order.

    Raises `InvalidAnswer` for an empty answer, prose, invalid JSON, anything but an object
    with an `operations` list, and any operation that is unknown or malformed: an answer is
    taken whole or not at all.
    """
    if not answer or not answer.strip():
        raise InvalidAnswer("the answer is empty; expected a JSON object")
    try:
        document = json.loads(_json_text(answer))
    except json.JSONDecodeError as exc:
        raise InvalidAnswer(f"the answer is not valid JSON ({exc.msg})") from exc
    if not isinstance(document, dict) or "operations" not in document:
        raise InvalidAnswer('the answer is not a JSON object with an "operations" list')
    try:
        return _OPERATIONS.validate_python(document["operations"])
    except ValidationError as exc:
        problems = describe_problems(exc, "operations")
        raise InvalidAnswer(f"invalid operations: {problems}") from exc


def describe(operation: SetOperation | DeleteOperation) -> str:
    """An operation as one short line, for the results message."""
    return f'{operation.op} "{operation.key}"'


def results_message(
    operations: Sequence[SetOperation | DeleteOperation], results: Sequence[str]
) -> str:
    """The user message of the corrective call: each operation's result, in order."""
    lines = [
        f"{index}. {describe(operation)}: {result}"
        for index, (operation, result) in enumerate(zip(operations, results, strict=True), 1)
    ]
    return "\n".join(
        [
            "Results of your operations:",
            *lines,
            "",
            "Operations that succeeded are done; do not repeat them. Answer with only one JSON "
            'object holding the corrected operations for those that failed, or {"operations": []}.',
        ]
    )
