"""The model-call contract both clients share: what a call is sent to, and how it fails.

A `Target` says which model to call and how (litellm model string, base URL, key, headers,
parameters, timeout) and which client calls it (`ClientName`). `UpstreamClient` is the base
of both clients, `DirectClient` (direct_client.py) and `LiteLLMClient` (litellm_client.py):
the calls they answer, the scrubber that masks secrets in upstream text and the timing hook.
The constants and helpers here keep their errors alike: which statuses are the client's
fault, how a timeout is worded, which fields of an OpenAI error object are passed on.

It sits below both clients and `model_client.py` (which picks a client per target) and
imports none of them; it knows nothing of litellm, aiohttp or the config.
"""

from __future__ import annotations

import errno
import os
import re
import socket
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from kvmem.upstream.redaction import SecretScrubber

ClientName = Literal["litellm", "direct"]

# Pooled connections idle longer than this are closed, not reused: upstreams close idle
# keep-alive connections after a few seconds (uvicorn and vLLM: 5 s), and reusing one just as
# it closes fails the request. A busy pool still reuses its connections.
UPSTREAM_KEEPALIVE_SECONDS = 2
# A backstop over the client's own timeouts (connect, each read), which also bounds the time
# to send the request, so a timeout always answers within a second of it.
TIMEOUT_SLACK = 0.5
# Upstream statuses that mean the request itself was refused (too long for the context,
# too large, unprocessable): the client's to fix, so they keep their status. 401 and 403 mean
# kvmem's own credentials were refused and 404 a model kvmem is configured with is missing:
# the operator's to fix, so they stay 502 like every other upstream failure.
CLIENT_FAULTS = frozenset({400, 413, 422})
# The fields of an OpenAI error object that are passed on to /v1 clients.
OPENAI_ERROR_FIELDS = ("message", "type", "param", "code")

_USER_PLACEHOLDER = re.compile(r"\{\{(LIBRECHAT_USER_[A-Z_]+|KVMEM_USER_ID)\}\}")


@dataclass(frozen=True)
class Target:
    """A model to call and how to reach it."""

    model: str
    api_base: str | None = None
    api_key: str | None = field(default=None, repr=False)
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    parameters: Mapping[str, Any] = field(default_factory=dict)
    timeout: float = 120.0
    kind: str = "main"  # "main" (the chat) or "agent" (the memory agent), for the metrics
    client: ClientName = "litellm"  # which client calls it (model_client.choose_client)
    # The settings that chose this model and its URL, named in an error a person must act on.
    settings: str = "chat.model or chat.api_base"
    # The setting that gives it its API key (provider_keys.py names it when one is missing).
    key_setting: str = "chat.api_key"

    def headers_for(self, user_id: str) -> dict[str, str]:
        """The headers with `{{LIBRECHAT_USER_ID}}`/`{{KVMEM_USER_ID}}` set to the user."""
        if not self.headers:  # the common case, on every model call
            return {}

        def fill(match: re.Match[str]) -> str:
            return user_id if match.group(1) in ("LIBRECHAT_USER_ID", "KVMEM_USER_ID") else ""

        return {name: _USER_PLACEHOLDER.sub(fill, value) for name, value in self.headers.items()}


class UpstreamClient(ABC):
    """What both model clients share: the calls they answer, the scrubber that masks secrets
    in upstream text, and `on_call(kind, seconds)`, which, when given, hears how long each
    call took (a stream: until it ended), whether it succeeded or not, and
    `on_surrogates(kind, count)`, which hears of lone surrogates replaced in an answer."""

    def __init__(
        self,
        scrubber: SecretScrubber | None = None,
        on_call: Callable[[str, float], None] | None = None,
        on_surrogates: Callable[[str, int], None] | None = None,
    ) -> None:
        self.scrubber = scrubber or SecretScrubber()
        self.on_call = on_call
        self.on_surrogates = on_surrogates

    @abstractmethod
    async def complete(
        self, target: Target, messages: list[dict[str, Any]], user_id: str, **request: Any
    ) -> dict[str, Any]:
        """One non-streamed completion, as an OpenAI `chat.completion` dict."""

    @abstractmethod
    def stream(
        self, target: Target, messages: list[dict[str, Any]], user_id: str, **request: Any
    ) -> AsyncIterator[dict[str, Any]]:
        """A streamed completion: `chat.completion.chunk` dicts as the upstream sends them."""

    @abstractmethod
    async def aclose(self) -> None:
        """Close the client's connections (at shutdown)."""

    def _timed(self, target: Target, started: float) -> None:
        if self.on_call is not None:
            self.on_call(target.kind, time.perf_counter() - started)

    def _replaced(self, target: Target, count: int) -> None:
        """Note `count` lone surrogates replaced in an answer for `target` (surrogates.py)."""
        if count and self.on_surrogates is not None:
            self.on_surrogates(target.kind, count)


def timeout_message(target: Target) -> str:
    """The message of an `UpstreamTimeout` for `target`."""
    return f"the model did not answer within {target.timeout:g} seconds"


# A Python object's repr, as some libraries put in their messages (`ssl:<ssl.SSLContext
# object at 0x7f...>`): never shown to a person.
_OBJECT_REPR = re.compile(r"\s*\S*<[^<>]*\bobject at 0x[0-9A-Fa-f]+>")


def plain_text(text: str) -> str:
    """`text` without Python object reprs (`<ssl.SSLContext object at 0x...>`)."""
    return _OBJECT_REPR.sub("", text)


def connect_reason(error: BaseException) -> str:
    """Why a connection could not be made, in a few words a person knows ("connection
    refused", "host name not found: Name or service not known"), from the deepest
    `OSError` under `error` (its causes included)."""
    deepest: BaseException = error
    for cause in causes(error):
        if isinstance(cause, OSError):
            deepest = cause
    if isinstance(deepest, ConnectionRefusedError):
        return "connection refused"
    if isinstance(deepest, socket.gaierror):
        return f"host name not found ({deepest.strerror or deepest})"
    code = getattr(deepest, "errno", None)
    if isinstance(code, int) and code in errno.errorcode:
        return os.strerror(code).lower()
    return plain_text(str(getattr(deepest, "strerror", None) or deepest)) or type(deepest).__name__


def causes(error: BaseException) -> list[BaseException]:
    """`error` and the chain of its causes (`__cause__`, else `__context__`), each once."""
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and all(current is not seen for seen in chain):
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


# The words of every unreachable model's message (`unreachable_message`).
UNREACHABLE = "cannot reach"


def unreachable_message(target: Target, url: str, reason: str) -> str:
    """The message of a model call that could not connect: which model, the URL tried, why,
    and which settings choose them (`Target.settings`)."""
    whose = "the memory agent's model" if target.kind == "agent" else "the model"
    return (
        f"the model call failed: {UNREACHABLE} {whose} {target.model} at {url} ({reason}). "
        f"Start it there, or change {target.settings}"
    )


def openai_error_fields(error: Mapping[str, Any], scrub: Callable[[str], str]) -> dict[str, Any]:
    """The fields of an upstream's OpenAI error object that are passed on (`message`, `type`,
    `param`, `code`, each a string, a number or null), their text scrubbed."""
    return {
        name: scrub(value) if isinstance(value, str) else value
        for name in OPENAI_ERROR_FIELDS
        if name in error and isinstance(value := error[name], str | int | None)
    }
