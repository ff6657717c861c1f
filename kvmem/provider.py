"""Every model call, through litellm: the one module that imports it.

A `Target` says which model to call and how (litellm model string, base URL, key, headers,
parameters, timeout). `LiteLLMClient` makes the call, streamed or not, with retries off, and
translates litellm's exceptions into kvmem's at this one boundary.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import SecretStr

from kvmem.config import ChatConfig, Config
from kvmem.errors import KvmemError, UpstreamError, UpstreamRateLimited, UpstreamTimeout

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # never fetch the price map
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
    )


class LiteLLMClient:
    """Calls models through `litellm.acompletion`; errors come out as `KvmemError`s."""

    async def complete(
        self, target: Target, messages: list[dict[str, Any]], user_id: str, **request: Any
    ) -> dict[str, Any]:
        """One non-streamed completion, as an OpenAI `chat.completion` dict."""
        try:
            async with asyncio.timeout(target.timeout + TIMEOUT_SLACK):
                response = await litellm.acompletion(
                    **self._arguments(target, messages, user_id, request)
                )
        except TimeoutError as exc:
            raise UpstreamTimeout(_timeout_message(target)) from exc
        except Exception as exc:  # every litellm failure crosses this one boundary
            raise translate(exc, target) from exc
        return openai_shape(response.model_dump(exclude_none=True))

    async def stream(
        self, target: Target, messages: list[dict[str, Any]], user_id: str, **request: Any
    ) -> AsyncIterator[dict[str, Any]]:
        """A streamed completion: `chat.completion.chunk` dicts as the upstream sends them."""
        arguments = self._arguments(target, messages, user_id, request)
        try:
            response = await litellm.acompletion(stream=True, **arguments)
        except Exception as exc:
            raise translate(exc, target) from exc
        try:
            async for chunk in response:
                yield openai_shape(chunk.model_dump(exclude_none=True))
        except Exception as exc:
            raise translate(exc, target) from exc
        finally:
            await response.aclose()

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
    for choice in obj.get("choices") or ():
        for name in LITELLM_FIELDS:
            choice.pop(name, None)
        for part in ("message", "delta"):
            if isinstance(choice.get(part), dict):
                for name in LITELLM_FIELDS:
                    choice[part].pop(name, None)
    return obj


def translate(exc: BaseException, target: Target) -> KvmemError:
    """The kvmem error for a litellm (or transport) exception."""
    if isinstance(exc, KvmemError):
        return exc
    if isinstance(exc, litellm.Timeout | TimeoutError):
        return UpstreamTimeout(_timeout_message(target))
    message = _upstream_message(exc)
    if isinstance(exc, litellm.RateLimitError):
        return UpstreamRateLimited(
            f"the model is rate limited: {message}", retry_after=_retry_after(exc)
        )
    status = getattr(exc, "status_code", None)
    details = {"upstream_status": status} if isinstance(status, int) else {}
    return UpstreamError(f"the model call failed: {message}", **details)


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
