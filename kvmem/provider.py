"""Every model call, and which client makes it: the one module that imports litellm.

A `Target` says which model to call and how (litellm model string, base URL, key, headers,
parameters, timeout) and which client calls it (`choose_client`, from `chat.client`).
`ModelClient` is what the services hold: it sends each call to the `DirectClient`
(OpenAI-compatible upstreams, see direct_client.py) or to `LiteLLMClient`, which makes the
call through litellm, streamed or not, with retries off, and translates litellm's exceptions
into kvmem's at this one boundary. litellm is imported only when a target needs it.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import json
import os
import re
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import anyio
from pydantic import SecretStr

from kvmem import direct_client
from kvmem.config import ChatConfig, Config
from kvmem.direct_client import CLIENT_FAULTS, OPENAI_ERROR_FIELDS, DirectClient
from kvmem.errors import (
    KvmemError,
    UpstreamError,
    UpstreamRateLimited,
    UpstreamRejected,
    UpstreamTimeout,
)
from kvmem.redaction import SecretScrubber

# Pooled upstream connections idle longer than this are not reused but reopened (see
# direct_client); litellm's own pool gets the same expiry through aiohttp's setting.
UPSTREAM_KEEPALIVE_SECONDS = direct_client.UPSTREAM_KEEPALIVE_SECONDS


def _litellm() -> Any:
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
    import litellm

    litellm.telemetry = False
    litellm.suppress_debug_info = True
    return litellm


ClientName = Literal["litellm", "direct"]
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
    client: ClientName = "litellm"  # which client calls it (see `choose_client`)

    def headers_for(self, user_id: str) -> dict[str, str]:
        """The headers with `{{LIBRECHAT_USER_ID}}`/`{{KVMEM_USER_ID}}` set to the user."""

        def fill(match: re.Match[str]) -> str:
            return user_id if match.group(1) in ("LIBRECHAT_USER_ID", "KVMEM_USER_ID") else ""

        return {name: _USER_PLACEHOLDER.sub(fill, value) for name, value in self.headers.items()}


def _secret(value: SecretStr | None) -> str | None:
    return (value.get_secret_value() or None) if value is not None else None


def _headers(headers: Mapping[str, SecretStr]) -> dict[str, str]:
    return {name: value.get_secret_value() for name, value in headers.items()}


def choose_client(mode: str, model: str) -> ClientName:
    """Which client calls `model` under `chat.client: mode`.

    `auto` sends `openai/...` models (custom endpoints become those too) straight to their
    base URL, OpenAI's when none is set; every other provider needs litellm to translate.
    `direct` and `litellm` force one client for every target.
    """
    if mode == "auto":
        return "direct" if model.startswith("openai/") else "litellm"
    return "direct" if mode == "direct" else "litellm"


def chat_target(chat: ChatConfig, model: str | None = None) -> Target:
    """The main model (or another of `chat.models`, which share its base URL and key)."""
    model = model or chat.model
    return Target(
        model=model,
        client=choose_client(chat.client, model),
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
        client=choose_client(config.chat.client, model),
    )


def uses_litellm(config: Config) -> bool:
    """Whether any model `config` names is called through litellm."""
    targets = [chat_target(config.chat, model) for model in config.chat.served_models()]
    targets.append(agent_target(config))
    return any(target is not None and target.client == "litellm" for target in targets)


PRICE_MAP_FILENAME = "model_prices_and_context_window_backup.json"


@functools.lru_cache(maxsize=64)
def token_prices(model: str) -> tuple[float, float] | None:
    """USD per input token and per output token from litellm's offline price map, or None
    when the map has no price for `model` (a local model, a custom endpoint's own name).

    The map is read from litellm's package file, not through litellm: a direct-path config
    does not import litellm at all. `provider/model` is looked up as is, then as `model`
    (the map names most models without their provider), as litellm does.
    """
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / PRICE_MAP_FILENAME
    try:
        prices = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    _, _, bare = model.partition("/")
    for name in (model, bare):
        entry = prices.get(name) if name else None
        if isinstance(entry, dict):
            cost_in = entry.get("input_cost_per_token")
            cost_out = entry.get("output_cost_per_token")
            if isinstance(cost_in, int | float) and isinstance(cost_out, int | float):
                return float(cost_in), float(cost_out)
    return None


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
        if "litellm" not in sys.modules:  # never used: nothing to close
            return
        from litellm.llms.custom_httpx.async_client_cleanup import (
            close_litellm_async_clients,
        )

        await close_litellm_async_clients()
        # Closed clients must not be handed out again if another app starts in this process.
        _litellm().in_memory_llm_clients_cache.flush_cache()

    async def complete(
        self, target: Target, messages: list[dict[str, Any]], user_id: str, **request: Any
    ) -> dict[str, Any]:
        """One non-streamed completion, as an OpenAI `chat.completion` dict."""
        started = time.perf_counter()
        try:
            async with asyncio.timeout(target.timeout + TIMEOUT_SLACK):
                response = await _litellm().acompletion(
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
            response = await _litellm().acompletion(stream=True, **arguments)
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


def translate(
    exc: BaseException, target: Target, scrubber: SecretScrubber | None = None
) -> KvmemError:
    """The kvmem error for a litellm (or transport) exception, secrets scrubbed."""
    if isinstance(exc, KvmemError):
        return exc
    litellm = _litellm()
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


_timeout_message = direct_client.timeout_message


class ModelClient:
    """The one client the services hold: each call goes to the direct client or to litellm,
    as its target says (`Target.client`). litellm's client is made, and litellm imported, on
    the first call that needs it."""

    def __init__(
        self,
        scrubber: SecretScrubber | None = None,
        on_call: Callable[[str, float], None] | None = None,
        *,
        max_connections: int = 100,
    ) -> None:
        self.scrubber = scrubber or SecretScrubber()
        self.on_call = on_call
        self.direct = DirectClient(self.scrubber, on_call, max_connections=max_connections)
        self._litellm: LiteLLMClient | None = None

    @classmethod
    def from_config(
        cls, config: Config, on_call: Callable[[str, float], None] | None = None
    ) -> ModelClient:
        """The client for `config`: its secrets scrubbed, its pool size; litellm imported
        now when a configured model needs it (so the first request does not wait for it)."""
        client = cls(
            SecretScrubber.from_config(config), on_call,
            max_connections=config.chat.max_connections,
        )
        if uses_litellm(config):
            client.litellm()
        return client

    def litellm(self) -> LiteLLMClient:
        """The litellm client, made on first use."""
        if self._litellm is None:
            _litellm()
            self._litellm = LiteLLMClient(self.scrubber, self.on_call)
        return self._litellm

    def _for(self, target: Target) -> DirectClient | LiteLLMClient:
        return self.direct if target.client == "direct" else self.litellm()

    async def complete(
        self, target: Target, messages: list[dict[str, Any]], user_id: str, **request: Any
    ) -> dict[str, Any]:
        """One non-streamed completion, as an OpenAI `chat.completion` dict."""
        return await self._for(target).complete(target, messages, user_id, **request)

    def stream(
        self, target: Target, messages: list[dict[str, Any]], user_id: str, **request: Any
    ) -> AsyncIterator[dict[str, Any]]:
        """A streamed completion: `chat.completion.chunk` dicts as the upstream sends them."""
        return self._for(target).stream(target, messages, user_id, **request)

    async def aclose(self) -> None:
        """Close both clients' connections (at shutdown)."""
        try:
            await self.direct.aclose()
        finally:
            if self._litellm is not None:
                await self._litellm.aclose()


def _upstream_message(exc: BaseException) -> str:
    message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return re.sub(r"^(litellm\.\w+: )+", "", str(message)).strip()
