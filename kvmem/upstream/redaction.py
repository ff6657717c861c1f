"""The configured secrets, and scrubbing them out of text that kvmem relays to clients or logs.

Some upstreams and gateways echo the credentials they were sent ("Incorrect API key provided:
sk-..."); their error text reaches clients in 502 messages and the memory agent's failure
logs. `SecretScrubber.from_config` collects every secret of memory.yaml once, and `scrub`
replaces each occurrence with `***`. It knows nothing of HTTP or of litellm.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

from pydantic import SecretStr

from kvmem.config import Config

MASK = "***"
# API keys (OpenAI's `sk-...` and the like) and bearer tokens, configured or not, in a
# provider's error message that is kept for others to read (/healthz).
_KEY_LIKE = re.compile(r"\b(?:sk|pk|rk)-[A-Za-z0-9_\-*]{6,}|(?i:bearer)\s+\S+")
MAX_SUMMARY_CHARS = 300
# Shorter fragments are not scrubbed: masking every "abc" would garble the message, and a
# credential that short protects nothing.
MIN_SECRET_CHARS = 4
# Header values may hold placeholders that become the user id per request; the text around
# them is the secret part.
_PLACEHOLDER = re.compile(r"\{\{[A-Za-z_]+\}\}")


class SecretScrubber:
    """Replaces every configured secret in a text with `***`."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        fragments = {
            part
            for secret in secrets
            for part in _PLACEHOLDER.split(secret)
            if len(part.strip()) >= MIN_SECRET_CHARS
        }
        # Longest first, so that a secret containing another is masked whole.
        ordered = sorted(fragments, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    @classmethod
    def from_config(cls, config: Config) -> SecretScrubber:
        """A scrubber for every secret in `config`: API keys, header values, service keys."""
        values: list[SecretStr | None] = [config.chat.api_key, *config.chat.headers.values()]
        agent = config.memory.agent
        if agent is not None:
            values += [agent.api_key, *agent.headers.values()]
        for endpoint in config.endpoints.custom:
            values += [endpoint.api_key, *endpoint.headers.values()]
        values += config.auth.service_keys
        secrets = [value.get_secret_value() for value in values if value is not None]
        # The key the OpenAI SDK, litellm and the direct client take from the environment
        # when none is configured is sent upstream too.
        secrets.append(os.environ.get("OPENAI_API_KEY", ""))
        return cls(secrets)

    def scrub(self, text: str) -> str:
        """`text` with every configured secret replaced by `***`."""
        return self._pattern.sub(MASK, text) if self._pattern is not None else text

    def summary(self, exc: BaseException) -> str:
        """A short line about `exc` (its code or class, then its message) with every
        configured secret and anything that looks like a key masked."""
        message = self.scrub(f"{getattr(exc, 'code', type(exc).__name__)}: {exc}")
        return _KEY_LIKE.sub(MASK, message)[:MAX_SUMMARY_CHARS]
