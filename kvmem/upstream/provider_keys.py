"""Which API key a model call sends, where it comes from, and whether it is missing.

A `Target` carries the key memory.yaml gave it (`chat.api_key`, `memory.agent.api_key`, a
custom endpoint's `apiKey`). Without one, the key comes from the environment: the direct
client reads `OPENAI_API_KEY` (as the OpenAI SDK does), litellm the provider's own variable
(`ANTHROPIC_API_KEY`, ...). `key_source` names it, so that `kvmem check --reach` can say
which credential a call uses and start-up can say, before any chat, that one is missing
(`missing_key`): once in `kvmem serve`'s log, and in `/healthz` as the agent not ready.

It reads the environment and knows the variables of the common providers (the same names
litellm's `validate_environment` asks for; a test holds the two together); a provider not
listed here (a local server, a cloud with its own sign-in) is not judged. It imports nothing
of litellm or aiohttp.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from kvmem.upstream.base import Target

# The variables litellm reads a provider's key from (any one of them is enough), for the
# providers whose calls always need one. Ollama, vLLM and LM Studio need none.
PROVIDER_KEYS: dict[str, tuple[str, ...]] = {
    "openai": ("OPENAI_API_KEY",),
    "anthropic": ("ANTHROPIC_API_KEY",),
    "gemini": ("GEMINI_API_KEY", "GOOGLE_API_KEY"),
    "groq": ("GROQ_API_KEY",),
    "mistral": ("MISTRAL_API_KEY",),
    "deepseek": ("DEEPSEEK_API_KEY",),
    "xai": ("XAI_API_KEY",),
    "openrouter": ("OPENROUTER_API_KEY",),
    "cohere": ("COHERE_API_KEY",),
    "together_ai": ("TOGETHERAI_API_KEY",),
    "perplexity": ("PERPLEXITYAI_API_KEY",),
    "fireworks_ai": ("FIREWORKS_AI_API_KEY",),
    "cerebras": ("CEREBRAS_API_KEY",),
}
# Providers that are called with no key at all.
KEYLESS_PROVIDERS = frozenset({"ollama", "ollama_chat", "hosted_vllm", "lm_studio"})


@dataclass(frozen=True)
class KeySource:
    """Where a call's API key comes from: a setting of memory.yaml or an environment
    variable (`name`), whether it holds a key (`present`), and whether the call cannot do
    without one (`needed`)."""

    name: str
    present: bool
    needed: bool

    def describe(self) -> str:
        """`OPENAI_API_KEY (set)`, `chat.api_key (set)`, `OPENAI_API_KEY (not set)`."""
        return f"{self.name} ({'set' if self.present else 'not set'})"


def key_source(target: Target, environ: Mapping[str, str] | None = None) -> KeySource | None:
    """Where `target`'s key comes from; None when its provider takes none (Ollama) or is one
    this module does not know."""
    environ = os.environ if environ is None else environ
    if target.api_key:
        return KeySource(target.key_setting, present=True, needed=True)
    provider = target.model.partition("/")[0].lower() if "/" in target.model else "openai"
    if target.client == "direct":
        # The direct client sends OPENAI_API_KEY when it is set; OpenAI's own API (no base
        # URL set anywhere) refuses a call without it, a server of one's own may not.
        own_server = (
            target.api_base or environ.get("OPENAI_BASE_URL") or environ.get("OPENAI_API_BASE")
        )
        present = bool(environ.get("OPENAI_API_KEY"))
        return KeySource("OPENAI_API_KEY", present=present, needed=not own_server)
    if provider in KEYLESS_PROVIDERS:
        return None
    names = PROVIDER_KEYS.get(provider)
    if names is None:
        return None
    present_name = next((name for name in names if environ.get(name)), None)
    return KeySource(present_name or names[0], present=present_name is not None, needed=True)


def missing_key(target: Target, environ: Mapping[str, str] | None = None) -> str | None:
    """Why `target`'s calls will be refused for want of a key, naming the variable and the
    setting that would give one; None when nothing is known to be missing."""
    source = key_source(target, environ)
    if source is None or source.present or not source.needed:
        return None
    return (
        f"no API key for {target.model}: set {source.name} in kvmem's environment, "
        f"or {target.key_setting} in memory.yaml"
    )
