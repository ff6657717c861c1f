"""Which API key a model call sends and whether it is missing (kvmem/upstream/provider_keys.py)."""

from __future__ import annotations

import os

import pytest

from kvmem.upstream.base import Target
from kvmem.upstream.provider_keys import (
    KEYLESS_PROVIDERS,
    PROVIDER_KEYS,
    KeySource,
    key_source,
    missing_key,
)


def test_a_configured_key_is_named_by_its_setting() -> None:
    target = Target("openai/m", api_key="k", client="direct", key_setting="memory.agent.api_key")
    assert key_source(target, {}) == KeySource("memory.agent.api_key", present=True, needed=True)
    assert missing_key(target, {}) is None


def test_the_direct_client_needs_openai_api_key_only_for_openais_own_api() -> None:
    openai = Target("openai/gpt-4.1-mini", client="direct")
    assert key_source(openai, {}) == KeySource("OPENAI_API_KEY", present=False, needed=True)
    assert missing_key(openai, {}) == (
        "no API key for openai/gpt-4.1-mini: set OPENAI_API_KEY in kvmem's environment, "
        "or chat.api_key in memory.yaml"
    )
    assert missing_key(openai, {"OPENAI_API_KEY": "sk-x"}) is None
    # A server of one's own (vLLM, a gateway) may take no key: not judged.
    own = Target("openai/m", client="direct", api_base="http://127.0.0.1:8000/v1")
    assert key_source(own, {}) == KeySource("OPENAI_API_KEY", present=False, needed=False)
    assert missing_key(own, {}) is None
    assert missing_key(openai, {"OPENAI_BASE_URL": "http://127.0.0.1:8000/v1"}) is None


def test_litellm_providers_name_their_own_variable() -> None:
    claude = Target("anthropic/claude-x", kind="agent", key_setting="memory.agent.api_key")
    assert missing_key(claude, {}) == (
        "no API key for anthropic/claude-x: set ANTHROPIC_API_KEY in kvmem's environment, "
        "or memory.agent.api_key in memory.yaml"
    )
    gemini = Target("gemini/gemini-2.0-flash")
    assert key_source(gemini, {"GOOGLE_API_KEY": "g"}) == KeySource(
        "GOOGLE_API_KEY", present=True, needed=True
    )
    assert key_source(Target("ollama/llama3.1"), {}) is None
    assert key_source(Target("someday/model"), {}) is None


@pytest.mark.parametrize("provider", sorted(PROVIDER_KEYS))
def test_each_variable_is_one_litellm_asks_for(
    provider: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvmem.upstream.litellm_client import load_litellm

    for name in list(os.environ):
        if name.endswith(("_API_KEY", "_API_BASE")):
            monkeypatch.delenv(name)
    missing = load_litellm().validate_environment(model=f"{provider}/some-model")["missing_keys"]
    assert set(PROVIDER_KEYS[provider]) <= set(missing)


@pytest.mark.parametrize("provider", sorted(KEYLESS_PROVIDERS))
def test_keyless_providers_ask_litellm_for_no_key(
    provider: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvmem.upstream.litellm_client import load_litellm

    for name in list(os.environ):
        if name.endswith("_API_KEY"):
            monkeypatch.delenv(name)
    missing = load_litellm().validate_environment(model=f"{provider}/some-model")["missing_keys"]
    assert not [name for name in missing if name.endswith("_KEY")]
