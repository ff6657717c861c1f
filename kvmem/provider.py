"""Every model call, through litellm: the one module that imports it.

A `Target` says which model to call and how (litellm model string, base URL, key, headers,
parameters, timeout). `LiteLLMClient` makes the call, streamed or not, with retries off, and
translates litellm's exceptions into kvmem's at this one boundary.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
from pydantic import SecretStr

from kvmem.config import ChatConfig, Config
from kvmem.errors import (
    KvmemError,
    UpstreamError,
    UpstreamRateLimited,
    UpstreamRejected,
    UpstreamTimeout,
)
from kvmem.redaction import SecretScrubber

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # never fetch the price map
# litellm otherwise installs a regex filter on every log record of the process (uvicorn's
# access log included), a measurable cost per request; kvmem logs no secrets.
os.environ.setdefault("LITELLM_DISABLE_REDACT_SECRETS", "true")
# Pooled upstream connections idle longer than this are not reused but reopened. Servers
# close idle keep-alive connections after a few seconds (uvicorn and vLLM: 5 s); litellm's
# 15 s default reuses such a connection just as the upstream closes it, and the request
# fails with "Connection error" (about 1 % of a burst after a 5 s pause). Expiring first
# leaves no window; a busy pool still reuses its connections.
UPSTREAM_KEEPALIVE_SECONDS = 2
os.environ.setdefault("AIOHTTP_KEEPALIVE_TIMEOUT", str(UPSTREAM_KEEPALIVE_SECONDS))
import litellm  # noqa: E402

litellm.telemetry = False
litellm.suppress_debug_info = True

# LibreChat's provider names that are not litellm's (after lower-casing).
PROVIDER_ALIASES = {"azureopenai": "azure", "google": "gemini"}
_USER_PLACEHOLDER = re.compile(r"\{\{(LIBRECHAT_USER_[A-Z_]+|KVMEM_USER_ID)\}\}")
# A backstop over litellm's own timeout, so a timeout always answers within a second of it.
TIMEOUT_SLACK = 0.5


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

    def headers_for(self, user_id: str) -> dict[str, str]:
        """The headers with `{{LIBRECHAT_USER_ID}}`/`{{KVMEM_USER_ID}}` set to the user."""

        def fill(match: re.Match[str]) -> str:
            return user_id if match.group(1) in ("LIBRECHAT_USER_ID", "KVMEM_USER_ID") else ""

        return {name: _USER_PLACEHOLDER.sub(fill, value) for name, value in self.headers.items()}


def _secret(value: SecretStr | None) -> str | None:
    return (value.get_secret_value() or None) if value is not None else None


def _headers(headers: Mapping[str, SecretStr]) -> dict[str, str]:
    return {name: value.get_secret_value() for name, value in headers.items()}


def chat_target(chat: ChatConfig, model: str | None = None) -> Target:
    """The main model (or another of `chat.models`, which share its base URL and key)."""
    return Target(
        model=model or chat.model,
        api_base=chat.api_base,
        api_key=_secret(chat.api_key),
        headers=_headers(chat.headers),
        parameters=dict(chat.model_parameters),
        timeout=chat.timeout,
    )


def agent_target(config: Config) -> Target | None:
    """The memory agent's model: `provider/model`, or the custom endpoint `provider` names."""
    agent = config.memory.agent
    if agent is None or not agent.provider or not agent.model:
        return None
    endpoint = config.custom_endpoint(agent.provider)
    if endpoint is not None:
        model = f"openai/{agent.model}"  # custom endpoints speak the OpenAI API
        api_base = agent.api_base or endpoint.base_url
        api_key = _secret(agent.api_key) or _secret(endpoint.api_key)
        headers = {**_headers(endpoint.headers), **_headers(agent.headers)}
    else:
        provider = agent.provider.lower()
        model = f"{PROVIDER_ALIASES.get(provider, provider)}/{agent.model}"
        api_base, api_key, headers = agent.api_base, _secret(agent.api_key), _headers(agent.headers)
    return Target(
        model=model,
        api_base=api_base,
        api_key=api_key,
        headers=headers,
        parameters=dict(agent.model_parameters),
        timeout=config.chat.timeout,
        kind="agent",
    )


def token_prices(model: str) -> tuple[float, float] | None:
    """USD per input token and per output token from litellm's offline price map, or None
    when the map has no price for `model` (a local model, a custom endpoint's own name)."""
    try:
        prices = litellm.cost_per_token(model=model, prompt_tokens=1, completion_tokens=1)
    except Exception:  # litellm raises several kinds for "not in the map"; all mean no price
        return None
    return float(prices[0]), float(prices[1])


class LiteLLMClient:
    """Calls models through `litellm.acompletion`; errors come out as `KvmemError`s, with
    every secret `scrubber` knows masked in the upstream's text.

    `on_call(kind, seconds)`, when given, hears how long each call took (a stream: until it
    ended), whether it succeeded or not.
    """

    def __init__(
        self,
        scrubber: SecretScrubber | None = None,
        on_call: Callable[[str, float], None] | None = None,
    ) -> None:
        self.scrubber = scrubber or SecretScrubber()
        self.on_call = on_call

    async def aclose(self) -> None:
        """Close the HTTP clients litellm keeps (they are process-wide: call at shutdown)."""
        from litellm.llms.custom_httpx.async_client_cleanup import (
            close_litellm_async_clients,
        )

        await close_litellm_async_clients()
        # Closed clients must not be handed out again if another app starts in this process.
        litellm.in_memory_llm_clients_cache.flush_cache()

    async def complete(
        self, target: Target, messages: list[dict[str, Any]], user_id: str, **request: Any
    ) -> dict[str, Any]:
        """One non-streamed completion, as an OpenAI `chat.completion` dict."""
        started = time.perf_counter()
        try:
            async with asyncio.timeout(target.timeout + TIMEOUT_SLACK):
                response = await litellm.acompletion(
                    **self._arguments(target, messages, user_id, request)
                )
        except TimeoutError as exc:
            raise UpstreamTimeout(_timeout_message(target)) from exc
        except Exception as exc:  # every litellm failure crosses this one boundary
            raise translate(exc, target, self.scrubber) from exc
        finally:
            self._timed(target, started)
        body = openai_shape(response.model_dump(exclude_none=True))
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
            response = await litellm.acompletion(stream=True, **arguments)
        except Exception as exc:
            self._timed(target, started)
            raise translate(exc, target, self.scrubber) from exc
        substantive = 0
        try:
            async for chunk in response:
                body = openai_shape(chunk.model_dump(exclude_none=True))
                substantive += _is_substantive(body)
                yield body
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

    def _timed(self, target: Target, started: float) -> None:
        if self.on_call is not None:
            self.on_call(target.kind, time.perf_counter() - started)

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


# Upstream statuses that mean the request itself was refused (too long for the context,
# too large, unprocessable): the client's to fix, so they keep their status. 401 and 403 mean
# kvmem's own credentials were refused and 404 a model kvmem is configured with is missing:
# the operator's to fix, so they stay 502 like every other upstream failure.
CLIENT_FAULTS = frozenset({400, 413, 422})


def translate(
    exc: BaseException, target: Target, scrubber: SecretScrubber | None = None
) -> KvmemError:
    """The kvmem error for a litellm (or transport) exception, secrets scrubbed."""
    if isinstance(exc, KvmemError):
        return exc
    if isinstance(exc, litellm.Timeout | TimeoutError):
        return UpstreamTimeout(_timeout_message(target))
    scrub = (scrubber or SecretScrubber()).scrub
    message = scrub(_upstream_message(exc))
    if isinstance(exc, litellm.RateLimitError):
        return UpstreamRateLimited(
            f"the model is rate limited: {message}", retry_after=_retry_after(exc)
        )
    # A connection error carries litellm's stand-in 500, not anything the upstream sent.
    status = None if isinstance(exc, litellm.APIConnectionError) else getattr(exc, "status_code", None)
    if status in CLIENT_FAULTS:
        upstream = _upstream_error_object(exc, scrub)
        reason = upstream.get("message") if upstream else None
        return UpstreamRejected(
            f"the model refused the request: {reason or message}", status=status, upstream=upstream
        )
    details = {"upstream_status": status} if isinstance(status, int) else {}
    return UpstreamError(f"the model call failed: {message}", **details)


# The fields of an OpenAI error object that are passed on to /v1 clients.
OPENAI_ERROR_FIELDS = ("message", "type", "param", "code")


def _upstream_error_object(exc: BaseException, scrub: Any) -> dict[str, Any] | None:
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
            return {
                name: scrub(value) if isinstance(value, str) else value
                for name in OPENAI_ERROR_FIELDS
                if name in body and isinstance(value := body[name], str | int | None)
            }
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


def _timeout_message(target: Target) -> str:
    return f"the model did not answer within {target.timeout:g} seconds"


def _upstream_message(exc: BaseException) -> str:
    message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return re.sub(r"^(litellm\.\w+: )+", "", str(message)).strip()
