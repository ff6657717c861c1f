"""Model calls through litellm, for the providers it translates (Anthropic, Gemini, Bedrock,
Azure, Ollama's native API, ...): the one module that imports litellm, and only when a
target needs it.

`LiteLLMClient` makes the call, streamed or not, with retries off, and translates litellm's
exceptions into kvmem's at this one boundary (`translate`), every configured secret masked.
`model_client.py` chooses which targets come here; what this client shares with the direct
one is in upstream/base.py, the only kvmem client module this one imports.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import anyio

from kvmem.errors import (
    KvmemError,
    UpstreamError,
    UpstreamRateLimited,
    UpstreamRejected,
    UpstreamTimeout,
)
from kvmem.late_imports import import_late
from kvmem.upstream.base import (
    CLIENT_FAULTS,
    TIMEOUT_SLACK,
    UPSTREAM_KEEPALIVE_SECONDS,
    Target,
    UpstreamClient,
    causes,
    connect_reason,
    openai_error_fields,
    plain_text,
    timeout_message,
    unreachable_message,
)
from kvmem.upstream.redaction import SecretScrubber
from kvmem.upstream.surrogates import ChunkSurrogates, clean_answer


def load_litellm() -> Any:
    """litellm, imported on first use: a config whose models all go the direct path never
    pays for it (about a second of start-up and ~100 MiB of memory)."""
    if "litellm" not in sys.modules:
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # never fetch the price map
        # litellm otherwise installs a regex filter on every log record of the process
        # (uvicorn's access log included), a measurable cost per request; kvmem logs no secrets.
        os.environ.setdefault("LITELLM_DISABLE_REDACT_SECRETS", "true")
        # Servers close idle keep-alive connections after a few seconds (uvicorn and vLLM:
        # 5 s); litellm's 15 s default reuses such a connection just as the upstream closes
        # it, and the request fails with "Connection error" (about 1 % of a burst after a
        # 5 s pause). Expiring first leaves no window.
        os.environ.setdefault("AIOHTTP_KEEPALIVE_TIMEOUT", str(UPSTREAM_KEEPALIVE_SECONDS))
    litellm: Any = import_late("litellm")
    litellm.telemetry = False
    litellm.suppress_debug_info = True
    return litellm


class LiteLLMClient(UpstreamClient):
    """Calls models through `litellm.acompletion`; errors come out as `KvmemError`s, with
    every secret `scrubber` knows masked in the upstream's text."""

    async def aclose(self) -> None:
        """Close the HTTP clients litellm keeps (they are process-wide: call at shutdown)."""
        if "litellm" not in sys.modules:  # never used: nothing to close
            return
        # litellm's own names, imported with it: nothing is imported here, at shutdown,
        # perhaps while another thread's import of litellm is under way.
        litellm = load_litellm()
        await litellm.close_litellm_async_clients()
        # Closed clients must not be handed out again if another app starts in this process.
        litellm.in_memory_llm_clients_cache.flush_cache()

    async def complete(
        self, target: Target, messages: list[dict[str, Any]], user_id: str, **request: Any
    ) -> dict[str, Any]:
        """One non-streamed completion, as an OpenAI `chat.completion` dict."""
        started = time.perf_counter()
        try:
            async with asyncio.timeout(target.timeout + TIMEOUT_SLACK):
                response = await load_litellm().acompletion(
                    **self._arguments(target, messages, user_id, request)
                )
        except TimeoutError as exc:
            raise UpstreamTimeout(timeout_message(target)) from exc
        except Exception as exc:  # every litellm failure crosses this one boundary
            raise translate(exc, target, self.scrubber) from exc
        finally:
            self._timed(target, started)
        body, replaced = clean_answer(openai_shape(response.model_dump(exclude_none=True)))
        self._replaced(target, replaced)
        if not body.get("choices"):
            raise UpstreamError(
                "the model call failed: the answer has no choices (a malformed response)",
                upstream_status=200,
            )
        return body

    async def stream(
        self, target: Target, messages: list[dict[str, Any]], user_id: str, **request: Any
    ) -> AsyncIterator[dict[str, Any]]:
        """A streamed completion: `chat.completion.chunk` dicts as the upstream sends them."""
        arguments = self._arguments(target, messages, user_id, request)
        started = time.perf_counter()
        try:
            response = await load_litellm().acompletion(stream=True, **arguments)
        except Exception as exc:
            self._timed(target, started)
            raise translate(exc, target, self.scrubber) from exc
        substantive = 0
        surrogates = ChunkSurrogates()
        try:
            async for chunk in response:
                body = openai_shape(chunk.model_dump(exclude_none=True))
                self._replaced(target, surrogates.clean(body))
                substantive += _is_substantive(body)
                yield body
            tail, replaced = surrogates.finish()
            if tail is not None:
                self._replaced(target, replaced)
                yield tail
        except Exception as exc:
            raise translate(exc, target, self.scrubber) from exc
        finally:
            self._timed(target, started)
            with anyio.CancelScope(shield=True):  # close the upstream even when cancelled
                await response.aclose()
        # Not even a role chunk: the body was not an event stream (litellm then makes up a
        # bare finishing chunk, which a client would take for a complete, empty answer).
        if not substantive:
            raise UpstreamError(
                "the model call failed: the stream held no chunks (a malformed response)",
                upstream_status=200,
            )

    @staticmethod
    def _arguments(
        target: Target, messages: list[dict[str, Any]], user_id: str, request: dict[str, Any]
    ) -> dict[str, Any]:
        arguments: dict[str, Any] = {**target.parameters, **request}
        arguments.update(
            model=target.model,
            messages=messages,
            timeout=target.timeout,
            max_retries=0,
            num_retries=0,
        )
        if target.api_base:
            arguments["api_base"] = target.api_base
        if target.api_key:
            arguments["api_key"] = target.api_key
        headers = target.headers_for(user_id)
        if headers:
            arguments["extra_headers"] = headers
        return arguments


# Fields litellm adds to OpenAI's objects; clients of an OpenAI-compatible API never see them.
LITELLM_FIELDS = ("provider_specific_fields",)


def openai_shape(obj: dict[str, Any]) -> dict[str, Any]:
    """A litellm response or chunk dict with litellm's own extra fields removed."""
    for name in LITELLM_FIELDS:
        obj.pop(name, None)
    if obj.get("object") == "chat.completion.chunk" and "usage" in obj:
        # OpenAI's usage chunk (stream_options.include_usage) has `choices: []`; litellm
        # sometimes gives it an empty choice, which clients would read as one more delta.
        choices = obj.get("choices") or []
        if all(not c.get("delta") and not c.get("finish_reason") for c in choices):
            obj["choices"] = []
    for choice in obj.get("choices") or ():
        for name in LITELLM_FIELDS:
            choice.pop(name, None)
        for part in ("message", "delta"):
            if isinstance(choice.get(part), dict):
                for name in LITELLM_FIELDS:
                    choice[part].pop(name, None)
    return obj


def _is_substantive(chunk: dict[str, Any]) -> bool:
    """Whether a chunk carries anything an upstream sent: a role, content, tool calls, usage."""
    if chunk.get("usage"):
        return True
    return any(
        set(choice.get("delta") or {}) & {"role", "content", "tool_calls", "function_call"}
        for choice in chunk.get("choices") or ()
    )


def translate(exc: BaseException, target: Target, scrubber: SecretScrubber) -> KvmemError:
    """The kvmem error for a litellm (or transport) exception, secrets scrubbed."""
    if isinstance(exc, KvmemError):
        return exc
    litellm = load_litellm()
    if isinstance(exc, litellm.Timeout | TimeoutError):
        return UpstreamTimeout(timeout_message(target))
    scrub = scrubber.scrub
    unconnected = _connect_error(exc)
    if unconnected is not None:
        return UpstreamError(
            unreachable_message(
                target, scrub(litellm_url(target)), scrub(connect_reason(unconnected))
            ),
            upstream_status=None,
        )
    message = scrub(plain_text(_upstream_message(exc)))
    if isinstance(exc, litellm.RateLimitError):
        return UpstreamRateLimited(
            f"the model is rate limited: {message}", retry_after=_retry_after(exc)
        )
    # A connection error carries litellm's stand-in 500, not anything the upstream sent.
    status = (
        None if isinstance(exc, litellm.APIConnectionError) else getattr(exc, "status_code", None)
    )
    if status in CLIENT_FAULTS:
        upstream = _upstream_error_object(exc, scrub)
        reason = upstream.get("message") if upstream else None
        return UpstreamRejected(
            f"the model refused the request: {reason or message}", status=status, upstream=upstream
        )
    details = {"upstream_status": status} if isinstance(status, int) else {}
    return UpstreamError(f"the model call failed: {message}", **details)


def _connect_error(exc: BaseException) -> BaseException | None:
    """The error under `exc` that says no connection could be made, if one does: aiohttp's
    `ClientConnectorError` (refused, host not found, TLS) or httpx's `ConnectError`, which
    litellm wraps in classes of its own (`APIConnectionError`, `InternalServerError`)."""
    for cause in causes(exc):
        if isinstance(cause, aiohttp.ClientConnectorError) or (
            type(cause).__name__ == "ConnectError" and type(cause).__module__.startswith("httpx")
        ):
            return cause
    return None


def litellm_url(target: Target) -> str:
    """The base URL litellm calls `target` at: the configured one, else the provider's own
    default as litellm knows it (Ollama's http://localhost:11434, Groq's, ...)."""
    if target.api_base:
        return target.api_base
    try:
        _, provider, _, default = load_litellm().get_llm_provider(target.model)
    except Exception:  # an unknown provider: litellm refuses before any call is made
        return "its provider's default URL"
    return default or f"{provider}'s default URL"


def _upstream_error_object(
    exc: BaseException, scrub: Callable[[str], str]
) -> dict[str, Any] | None:
    """The upstream's OpenAI error object (`message`, `type`, `param`, `code`), scrubbed.

    litellm keeps it on the openai SDK's exception (`body`), somewhere down the chain of
    causes; some of litellm's own classes drop it.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        body = getattr(current, "body", None)
        if isinstance(body, dict) and isinstance(body.get("message"), str):
            return openai_error_fields(body, scrub)
        current = current.__cause__ or current.__context__
    return None


def _retry_after(exc: BaseException) -> str | None:
    """The upstream's Retry-After: litellm keeps the real headers apart from `response`."""
    for headers in (
        getattr(exc, "litellm_response_headers", None),
        getattr(getattr(exc, "response", None), "headers", None),
    ):
        if headers is not None and headers.get("retry-after"):
            return str(headers.get("retry-after"))
    return None


def _upstream_message(exc: BaseException) -> str:
    message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return re.sub(r"^(litellm\.\w+: )+", "", str(message)).strip()
