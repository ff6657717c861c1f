"""Reading the fields of an upstream's OpenAI answer that kvmem translates, each checked.

`/v1` passes the upstream's JSON on unchanged, so a field of the wrong shape is the client's
to see; a route that translates the answer into another shape (Ollama's `/api/*`, `/chat`)
reads its fields, and one of the wrong shape (`choices` a string, `usage` a string, no `message`)
must be the upstream's failure, a 502 `upstream_error` (or a stream's last error line),
never a 500. These readers raise `UpstreamError` saying which field was wrong. They know
nothing of Ollama or HTTP.
"""

from __future__ import annotations

from typing import Any

from kvmem.errors import UpstreamError


def malformed(what: str) -> UpstreamError:
    """The failure of an answer whose `what` has the wrong shape."""
    return UpstreamError(
        f"the model call failed: {what} (a malformed response)", upstream_status=200
    )


def an_object(value: Any, what: str) -> dict[str, Any]:
    """`value` if it is an object, `{}` if absent (null), else `malformed`."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise malformed(f"{what} is not an object")
    return value


def an_array(value: Any, what: str) -> list[Any]:
    """`value` if it is an array, `[]` if absent (null), else `malformed`."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise malformed(f"{what} is not an array")
    return value


def a_string(value: Any, what: str) -> str | None:
    """`value` if it is a string, None if absent (null), else `malformed`."""
    if value is not None and not isinstance(value, str):
        raise malformed(f"{what} is not a string")
    return value


def first_choice(completion: Any) -> dict[str, Any]:
    """A whole completion's first choice; `malformed` unless it has one, holding a message."""
    choices = an_array(an_object(completion, "the answer").get("choices"), "choices")
    if not choices:
        raise malformed("the answer has no choices")
    choice = an_object(choices[0], "choices[0]")
    if not isinstance(choice.get("message"), dict):
        raise malformed("choices[0].message is missing or not an object")
    return choice


def chunk_choices(chunk: Any) -> list[dict[str, Any]]:
    """A streamed chunk's choices (checked objects, each `delta` an object)."""
    choices = an_array(an_object(chunk, "a chunk").get("choices"), "a chunk's choices")
    checked = [an_object(choice, "a chunk's choice") for choice in choices]
    for choice in checked:
        an_object(choice.get("delta"), "a chunk's delta")
    return checked


def usage_of(answer: Any) -> dict[str, Any]:
    """An answer's (or chunk's) `usage`, `{}` when it has none."""
    return an_object(an_object(answer, "the answer").get("usage"), "usage")
