"""`kvmem check --reach`: call each configured model once, with a one-token request, and say
whether it answered, at which URL, with which credential, how fast, or what failed and what
to change.

`reach_models(config)` checks the main model and the memory agent's (when it runs a model
of its own), each through the same `ModelClient` a server would use, so a check that passes
means the same call works from `kvmem serve`. It knows nothing of the terminal; the CLI
prints `Reach.as_json()` or a view of it.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from dataclasses import dataclass
from typing import Any

from yarl import URL

from kvmem.config import Config
from kvmem.errors import KvmemError, UpstreamError, UpstreamRejected, UpstreamTimeout
from kvmem.upstream.base import UNREACHABLE, Target
from kvmem.upstream.direct_client import api_base
from kvmem.upstream.model_client import ModelClient, agent_target, chat_target
from kvmem.upstream.provider_keys import key_source, missing_key

# The one-token request: enough for the model to answer, as cheap as a call can be.
PROBE = [{"role": "user", "content": "Say OK."}]
PROBE_USER = "kvmem-check"


@dataclass(frozen=True)
class Reach:
    """What one model call showed: reached or not, where, with which key, how fast."""

    role: str  # "chat" or "agent"
    model: str | None
    url: str | None
    credential: str | None  # "OPENAI_API_KEY (set)", "chat.api_key (set)", None: none used
    reachable: bool
    latency_ms: int | None = None
    error: str | None = None  # what failed, or what the model said when it refused
    fix: str | None = None  # what to change
    skipped: str | None = None  # why no call was made (the agent is off, or inline)

    def as_json(self) -> dict[str, Any]:
        """The check's JSON object for this model."""
        return dataclasses.asdict(self)

    @property
    def failed(self) -> bool:
        """A call was made and did not reach the model."""
        return self.skipped is None and not self.reachable


def call_url(target: Target) -> str:
    """The URL `target`'s calls go to (without credentials in it)."""
    if target.client == "direct":
        return str(URL(api_base(target).rstrip("/") + "/chat/completions").with_user(None))
    from kvmem.upstream.litellm_client import litellm_url

    return litellm_url(target)


async def reach_models(config: Config, timeout: float) -> list[Reach]:
    """Call the main model, then the agent's, each at most `timeout` seconds."""
    client = ModelClient.from_config(config, preload=False)
    try:
        results = [await reach(client, chat_target(config.chat), "chat", timeout)]
        on, reason = config.agent_status()
        target = agent_target(config)
        if not on or target is None:
            results.append(Reach("agent", None, None, None, False, skipped=f"off: {reason}"))
        elif config.inline_memory():
            results.append(
                Reach(
                    "agent",
                    None,
                    None,
                    None,
                    False,
                    skipped="inline: the chat model writes memory itself",
                )
            )
        else:
            results.append(await reach(client, target, "agent", timeout))
        return results
    finally:
        await client.aclose()


async def reach(client: ModelClient, target: Target, role: str, timeout: float) -> Reach:
    """One one-token call of `target`, and what it showed."""
    target = dataclasses.replace(target, timeout=min(target.timeout, timeout))
    source = key_source(target)
    found = functools.partial(
        Reach,
        role,
        target.model,
        client.scrubber.scrub(call_url(target)),
        source.describe() if source is not None else None,
    )
    started = time.perf_counter()
    try:
        await client.complete(target, PROBE, PROBE_USER, max_tokens=1)
    except UpstreamRejected as exc:
        # It answered: the URL and the key are right; it only refused this request's shape.
        latency = round(1000 * (time.perf_counter() - started))
        return found(reachable=True, latency_ms=latency, error=exc.message)
    except KvmemError as exc:
        fix = fix_for(exc, target)
        # An unreachable model's message ends with the fix: said once, as the fix.
        error = exc.message.removesuffix(f". {fix}")
        return found(reachable=False, error=error, fix=fix)
    latency = round(1000 * (time.perf_counter() - started))
    return found(reachable=True, latency_ms=latency)


def fix_for(exc: KvmemError, target: Target) -> str:
    """What to change after `exc`, a failed call of `target`."""
    if isinstance(exc, UpstreamError) and UNREACHABLE in exc.message:
        return f"Start it there, or change {target.settings}"
    if isinstance(exc, UpstreamTimeout):
        return f"It did not answer in time: is it running? Otherwise change {target.settings}"
    missing = missing_key(target)
    if missing is not None:
        return missing[0].upper() + missing[1:]
    status = exc.details.get("upstream_status")
    if status in (401, 403):
        return f"The key was refused: check {target.key_setting} or the provider's key variable"
    if status == 404:
        return f"The model or the URL is not known there: change {target.settings}"
    return f"The settings that choose this model: {target.settings}"
