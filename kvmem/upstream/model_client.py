"""The client the services hold, which picks a client for each model call, and the prices.

`ModelClient` sends each call to the `DirectClient` (OpenAI-compatible upstreams,
direct_client.py) or to the `LiteLLMClient` (litellm_client.py, the one module that imports
litellm, and only when a target needs it), as the call's `Target` (upstream/base.py) says. Both
raise the same kvmem errors. This module builds the targets from the config (`chat_target`,
`agent_target`) and chooses their client (`choose_client`, from `chat.client`). The prices
of a model come from litellm's offline price map, read from its package file without
importing litellm (`token_prices`).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import sys
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import anyio
from pydantic import SecretStr

from kvmem.config import ChatConfig, Config
from kvmem.upstream.base import ClientName, Target, UpstreamClient
from kvmem.upstream.direct_client import DirectClient
from kvmem.upstream.litellm_client import LiteLLMClient, load_litellm
from kvmem.upstream.redaction import SecretScrubber

# LibreChat's provider names that are not litellm's (after lower-casing).
PROVIDER_ALIASES = {"azureopenai": "azure", "google": "gemini"}


logger = logging.getLogger(__name__)


def _import_quietly() -> None:
    """The preloading thread's work: a failed import is logged here and raised again by the
    first request that needs litellm (a failed import leaves nothing in sys.modules)."""
    try:
        load_litellm()
    except Exception as exc:  # the request path imports again and raises it to its caller
        logger.warning("litellm failed to import beside start-up: %r", exc)


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
        # KVMEM_CHAT_MODEL is the variable the shipped memory.yaml reads chat.model from.
        settings="chat.model (KVMEM_CHAT_MODEL in the shipped memory.yaml) or chat.api_base",
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
        settings = (
            f"the baseURL of endpoints.custom {endpoint.name!r}, or memory.agent.provider, "
            "memory.agent.model or memory.agent.api_base"
        )
        key_setting = (
            "memory.agent.api_key"
            if agent.api_key is not None
            else f"the apiKey of endpoints.custom {endpoint.name!r}"
        )
    else:
        provider = agent.provider.lower()
        model = f"{PROVIDER_ALIASES.get(provider, provider)}/{agent.model}"
        api_base, api_key, headers = agent.api_base, _secret(agent.api_key), _headers(agent.headers)
        settings = "memory.agent.provider, memory.agent.model or memory.agent.api_base"
        key_setting = "memory.agent.api_key"
    return Target(
        model=model,
        api_base=api_base,
        api_key=api_key,
        headers=headers,
        parameters=dict(agent.model_parameters),
        timeout=config.chat.timeout,
        kind="agent",
        client=choose_client(config.chat.client, model),
        settings=settings,
        key_setting=key_setting,
    )


def uses_litellm(config: Config) -> bool:
    """Whether any model `config` names is called through litellm."""
    targets: list[Target | None] = [
        chat_target(config.chat, model) for model in config.chat.served_models()
    ]
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
        on_surrogates: Callable[[str, int], None] | None = None,
    ) -> None:
        self.scrubber = scrubber or SecretScrubber()
        self.on_call = on_call
        self.on_surrogates = on_surrogates
        self.direct = DirectClient(
            self.scrubber, on_call, max_connections=max_connections, on_surrogates=on_surrogates
        )
        self._litellm: LiteLLMClient | None = None
        # The thread importing litellm beside start-up, when a configured model needs it.
        self.preloading: threading.Thread | None = None

    @classmethod
    def from_config(
        cls,
        config: Config,
        on_call: Callable[[str, float], None] | None = None,
        *,
        preload: bool = True,
        on_surrogates: Callable[[str, int], None] | None = None,
    ) -> ModelClient:
        """The client for `config`: its secrets scrubbed, its pool size; when a configured
        model needs litellm, its import starts now in a thread (see `preload_litellm`)
        unless `preload` is false (a process that may never call a model)."""
        client = cls(
            SecretScrubber.from_config(config),
            on_call,
            max_connections=config.chat.max_connections,
            on_surrogates=on_surrogates,
        )
        if preload and uses_litellm(config):
            client.preload_litellm()
        return client

    def preload_litellm(self) -> None:
        """Import litellm in a thread: about 3 s of CPU that used to come before ready (the
        default `ollama/...` model needs it), and that the first request would otherwise pay.
        A request that needs litellm before the import ends waits for it in a worker thread
        (`_after_import`), then goes on; the import's error, if any, is raised there."""
        if self.preloading is None and "litellm" not in sys.modules:
            self.preloading = threading.Thread(
                target=_import_quietly, name="kvmem-litellm", daemon=True
            )
            self.preloading.start()

    def litellm(self) -> LiteLLMClient:
        """The litellm client, made on first use."""
        if self._litellm is None:
            load_litellm()
            self._litellm = LiteLLMClient(self.scrubber, self.on_call, self.on_surrogates)
        return self._litellm

    def _for(self, target: Target) -> UpstreamClient:
        return self.direct if target.client == "direct" else self.litellm()

    def _importing_for(self, target: Target) -> threading.Thread | None:
        """The preloading thread, when `target` needs litellm and its import has not ended."""
        thread = self.preloading
        if target.client == "direct" or thread is None or not thread.is_alive():
            return None
        return thread

    async def _after_import(self, target: Target) -> UpstreamClient:
        """The client for `target`, once litellm's import (if under way) has ended: waited
        for in a worker thread, so the event loop serves on, and before the call's own
        timeout starts, so the wait does not eat the model's time."""
        thread = self._importing_for(target)
        if thread is not None:
            await anyio.to_thread.run_sync(thread.join)
        return self._for(target)

    async def complete(
        self, target: Target, messages: list[dict[str, Any]], user_id: str, **request: Any
    ) -> dict[str, Any]:
        """One non-streamed completion, as an OpenAI `chat.completion` dict."""
        client = await self._after_import(target)
        return await client.complete(target, messages, user_id, **request)

    def stream(
        self, target: Target, messages: list[dict[str, Any]], user_id: str, **request: Any
    ) -> AsyncIterator[dict[str, Any]]:
        """A streamed completion: `chat.completion.chunk` dicts as the upstream sends them."""
        if self._importing_for(target) is None:  # the usual case: no extra layer per chunk
            return self._for(target).stream(target, messages, user_id, **request)
        return self._stream_after_import(target, messages, user_id, **request)

    async def _stream_after_import(
        self, target: Target, messages: list[dict[str, Any]], user_id: str, **request: Any
    ) -> AsyncIterator[dict[str, Any]]:
        client = await self._after_import(target)
        chunks = client.stream(target, messages, user_id, **request)
        try:
            async for chunk in chunks:
                yield chunk
        finally:
            close = getattr(chunks, "aclose", None)
            if close is not None:
                await close()

    async def aclose(self) -> None:
        """Close both clients' connections (at shutdown)."""
        try:
            await self.direct.aclose()
        finally:
            if self._litellm is not None:
                await self._litellm.aclose()
