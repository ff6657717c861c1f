"""The settings kvmem runs with: the sections of memory.yaml as pydantic models.

Field names follow LibreChat's `memory:` block (`validKeys`, `tokenLimit`, ...) so that a
pasted LibreChat config loads unchanged; kvmem's own sections use snake_case. Secrets are
`SecretStr`, so they are masked in every repr and in `model_dump(mode="json")`.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

KEY_PATTERN = re.compile(r"[a-z][a-z0-9_]{0,127}")
# "nothing" is LibreChat's sentinel; "history", "export", "proposals" and "scopes" name routes
# under /memory/ that a GET of a key would otherwise shadow or be shadowed by.
RESERVED_KEYS = frozenset({"nothing", "history", "export", "proposals", "scopes"})


def reserved_keys_text() -> str:
    """The reserved keys as a message lists them: 'export', 'history', 'nothing', 'proposals'
    or 'scopes'."""
    names = [f"'{key}'" for key in sorted(RESERVED_KEYS)]
    return ", ".join(names[:-1]) + " or " + names[-1]


class Section(BaseModel):
    """A config section: unknown fields are errors, values are immutable after loading."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


# A host name or IPv4 address, or an IPv6 address in brackets; no port, no scheme.
_HOST_NAME = re.compile(r"[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?\.?|\[[0-9a-f:.]+\]")
# An origin as browsers send it: scheme://host[:port], nothing after.
_ORIGIN = re.compile(r"https?://([a-z0-9_.-]+|\[[0-9a-f:.]+\])(:[0-9]{1,5})?")


class ServerConfig(Section):
    """Where `kvmem serve` listens, and the bounds on what one request may send."""

    host: str = "127.0.0.1"
    port: int = Field(8700, ge=0, le=65535)
    max_body_bytes: int = Field(1_048_576, gt=0)
    # The request line and headers together; larger answers 431 before the app sees them.
    max_header_bytes: int = Field(65_536, ge=1024)
    # The request line and headers must arrive within this long of the connection opening
    # (or of the previous answer, on a kept-alive connection); else 408 and close.
    header_timeout_seconds: float = Field(10, gt=0)
    # The whole body must arrive within this long of the handler starting to read it (408).
    body_timeout_seconds: float = Field(30, gt=0)
    # On SIGTERM: how long in-flight requests (and memory agent runs, up to their own
    # deadlines) may take to finish before they are cut off.
    drain_seconds: float = Field(10, ge=0)
    # The names a request's Host header may carry (any port); "*" allows any. Unset: the
    # loopback names and `host` in `local` mode, any name in `keys` mode (server/site_guard.py).
    allowed_hosts: list[str] | None = None
    # Origins of other sites whose pages may send writes (`https://chat.example.com`).
    allowed_origins: list[str] = Field(default_factory=list)
    # How `kvmem serve` writes its log lines to stderr: `text` for people, `json` (one object
    # a line) for log pipelines.
    log_format: Literal["text", "json"] = "text"

    @field_validator("allowed_hosts")
    @classmethod
    def _host_names(cls, hosts: list[str] | None) -> list[str] | None:
        if hosts is None:
            return None
        names = []
        for host in hosts:
            name = host.strip().lower()
            if name != "*" and not _HOST_NAME.fullmatch(name):
                raise ValueError(
                    f"{host!r} is not a host name: write a name or address alone, without a "
                    'scheme or port (localhost, 127.0.0.1, [::1], kvmem.example.com), or "*"'
                )
            names.append(name)
        return names

    @field_validator("allowed_origins")
    @classmethod
    def _origins(cls, origins: list[str]) -> list[str]:
        for origin in origins:
            if not _ORIGIN.fullmatch(origin.lower()):
                raise ValueError(
                    f"{origin!r} is not an origin: write scheme://host[:port] with nothing "
                    "after it, such as https://chat.example.com or http://127.0.0.1:3080"
                )
        return [origin.lower() for origin in origins]

    def is_loopback(self, host: str | None = None) -> bool:
        """Whether `host` (default: the configured one) only accepts local connections."""
        name = (host or self.host).strip("[]")
        if name == "localhost":
            return True
        try:
            return ipaddress.ip_address(name).is_loopback
        except ValueError:
            return False


class DatabaseConfig(Section):
    """The SQLAlchemy URL of the store; SQLite by default, PostgreSQL for several replicas."""

    url: str = "sqlite:///kvmem.db"
    pool_size: int = Field(5, ge=1)
    max_overflow: int = Field(10, ge=0)

    @field_validator("url")
    @classmethod
    def _parseable(cls, url: str) -> str:
        try:
            make_url(url)
        except ArgumentError as exc:
            raise ValueError(
                "expected a SQLAlchemy database URL such as sqlite:///kvmem.db or "
                "postgresql+psycopg://user:password@host:5432/kvmem"
            ) from exc
        return url

    def masked_url(self) -> str:
        """The URL with its password replaced by `***`."""
        return make_url(self.url).render_as_string(hide_password=True)

    def __repr_args__(self) -> Any:
        for name, value in super().__repr_args__():
            yield name, self.masked_url() if name == "url" else value


# RFC 7518 section 3.2: an HMAC key at least as long as the hash's output.
JWT_MIN_SECRET_BYTES = {"HS256": 32, "HS384": 48, "HS512": 64}
JwtAlgorithm = Literal["HS256", "HS384", "HS512"]


def _hs256() -> list[JwtAlgorithm]:
    return ["HS256"]


class JwtConfig(Section):
    """`auth.jwt`: the signed token a front end sends to name its user (Open WebUI's
    `X-OpenWebUI-User-Jwt`, HS256 with `FORWARD_USER_INFO_HEADER_JWT_SECRET`)."""

    secret: SecretStr
    header: str = Field("X-OpenWebUI-User-Jwt", min_length=1)
    # Shared-secret algorithms only: `none` and public-key algorithms are never accepted.
    algorithms: list[JwtAlgorithm] = Field(default_factory=_hs256, min_length=1)
    issuer: str = Field("open-webui", min_length=1)
    user_claim: str = Field("sub", min_length=1)
    leeway_seconds: float = Field(30, ge=0)
    # True: a service-key request without the token is 401 (no plain user-id headers).
    required: bool = False

    @model_validator(mode="after")
    def _secret_long_enough(self) -> JwtConfig:
        needed = max(JWT_MIN_SECRET_BYTES[algorithm] for algorithm in self.algorithms)
        if len(self.secret.get_secret_value().encode()) < needed:
            raise ValueError(
                f"auth.jwt.secret must be at least {needed} bytes for "
                f"{', '.join(self.algorithms)} (RFC 7518 section 3.2); use the same long "
                "random value as Open WebUI's FORWARD_USER_INFO_HEADER_JWT_SECRET"
            )
        return self


class AuthConfig(Section):
    """Who may call kvmem: `local` (one user, loopback only) or `keys` (bearer keys)."""

    mode: Literal["local", "keys"] = "local"
    service_keys: list[SecretStr] = Field(default_factory=list)
    # Headers a service key may name its user with, first present wins. Open WebUI sends
    # X-OpenWebUI-User-Id when ENABLE_FORWARD_USER_INFO_HEADERS is on.
    user_id_headers: list[str] = Field(
        default_factory=lambda: ["X-User-Id", "X-OpenWebUI-User-Id"], min_length=1
    )
    # How long a token from POST /sessions acts for its user.
    session_seconds: int = Field(3600, gt=0)
    # Headers that name the conversation when X-Conversation-Id is absent, first present
    # wins: Open WebUI sends X-OpenWebUI-Chat-Id when it forwards user info.
    conversation_id_headers: list[str] = Field(default_factory=lambda: ["X-OpenWebUI-Chat-Id"])
    # A signed user (Open WebUI's FORWARD_USER_INFO_HEADER_JWT_SECRET) instead of plain headers.
    jwt: JwtConfig | None = None


# One CSP source expression: a scheme, a host source or a quoted keyword, never a list
# separator that would let a config value end the directive and start another.
_CSP_SOURCE = re.compile(r"[^\s;,']+|'(self|none)'")


class UiConfig(Section):
    """The memory page at /ui: which sites may show it in a frame."""

    # CSP frame-ancestors sources; the default lets only kvmem's own pages frame it.
    frame_ancestors: list[str] = Field(default_factory=lambda: ["'self'"], min_length=1)

    @field_validator("frame_ancestors")
    @classmethod
    def _sources(cls, sources: list[str]) -> list[str]:
        for source in sources:
            if not _CSP_SOURCE.fullmatch(source):
                raise ValueError(
                    f"{source!r} is not a frame-ancestors source: use an origin such as "
                    "https://chat.example.com, or 'self' or 'none' (quotes included)"
                )
        return sources


class ChatConfig(Section):
    """The main model that /chat and /v1/chat/completions call (directly or through litellm)."""

    model: str = "ollama/llama3.1"
    api_base: str | None = Field(None, validation_alias=AliasChoices("api_base", "baseURL"))
    api_key: SecretStr | None = Field(None, validation_alias=AliasChoices("api_key", "apiKey"))
    headers: dict[str, SecretStr] = Field(default_factory=dict)
    models: list[str] = Field(default_factory=list)
    system_prompt: str = "You are a helpful assistant."
    max_turns: int = Field(10, ge=0)
    timeout: float = Field(120, gt=0)
    model_parameters: dict[str, Any] = Field(default_factory=dict)
    # Which client calls the models (main and agent): `auto` calls `openai/...` models and
    # custom endpoints directly over HTTP and the other providers through litellm.
    client: Literal["auto", "litellm", "direct"] = "auto"
    # Connections the direct client keeps open to upstreams, at most.
    max_connections: int = Field(100, ge=1)

    def served_models(self) -> list[str]:
        """The model ids clients may ask for: `model` first, then `models`, no repeats."""
        return list(dict.fromkeys([self.model, *self.models]))


class AgentConfig(Section):
    """The memory agent: a second, cheap model call that sets and deletes keys."""

    enabled: bool = True
    provider: str | None = None
    model: str | None = None
    instructions: str | None = None
    model_parameters: dict[str, Any] = Field(default_factory=lambda: {"temperature": 0.4})
    api_base: str | None = Field(None, validation_alias=AliasChoices("api_base", "baseURL"))
    api_key: SecretStr | None = Field(None, validation_alias=AliasChoices("api_key", "apiKey"))
    headers: dict[str, SecretStr] = Field(default_factory=dict)
    grace_seconds: float = Field(3, ge=0)
    # Input + output tokens of a user's agent runs per UTC day; past it, no agent call.
    daily_token_budget: int | None = Field(None, ge=0)
    # Runs in flight at once: one user's, and the process's; past either, the turn's agent
    # is `busy` (no model call) and `POST /memory/agent` answers 429 `too_many_runs`.
    max_runs_per_user: int = Field(2, ge=1)
    max_concurrent_runs: int = Field(64, ge=1)
    trigger: Literal["always", "intent"] = "always"
    trigger_phrases: list[str] = Field(default_factory=list)
    mode: Literal["tools", "json"] = "tools"
    # `separate`: the second model call above. `inline`: no second call; the main model is
    # told to end its reply with [MEMORY: key = value] / [FORGET: key] markers, which kvmem
    # cuts out of the reply and applies (kvmem/agent/markers.py); provider and model are not needed.
    placement: Literal["separate", "inline"] = "separate"

    @field_validator("trigger_phrases")
    @classmethod
    def _no_blank_phrase(cls, phrases: list[str]) -> list[str]:
        # A blank phrase would be found in every message and silently turn the gate off.
        for phrase in phrases:
            if not phrase.strip():
                raise ValueError("a trigger phrase must not be blank")
        return phrases


class HistoryConfig(Section):
    """`memory.history`: how long the change log of every entry is kept."""

    # 0 keeps no history at all; older changes are removed when the user next writes and
    # are never shown once they are older than this.
    keep_days: int = Field(90, ge=0)


class TasksConfig(Section):
    """`memory.tasks`: which calls are a front end's own (a title, tags, ...), not a turn."""

    # Recognise the task prompts Open WebUI and LibreChat send by default.
    detect: bool = True
    # Regular expressions searched in the last user message; a match is a task call.
    patterns: list[str] = Field(default_factory=list)

    @field_validator("patterns")
    @classmethod
    def _compiles(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            if not pattern:
                raise ValueError("a task pattern must not be empty (it would match every call)")
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"{pattern!r} is not a regular expression: {exc}") from exc
        return patterns


class ScopesConfig(Section):
    """`memory.scopes`: the keys kept apart for each scope (an assistant, a model, a project),
    beside the person's own; CONTRACT section 23."""

    valid_keys: list[str] = Field(alias="validKeys", min_length=1)
    # Per scope; None: `memory.tokenLimit` and `memory.charLimit`.
    token_limit: int | None = Field(None, alias="tokenLimit", ge=0)
    char_limit: int | None = Field(None, alias="charLimit", gt=0)
    # A /v1 or /api request that names no scope is scoped "model:<model id>".
    by_model: bool = False
    # A scoped request sees and writes only its scope's entries.
    isolated: bool = False
    # The scopes one user may hold (each with entries of its own, within its own limits): a
    # write or import that would start one more is refused (409 memory_full). Generous,
    # since `by_model` starts a scope per model a person chats with.
    max_scopes: int = Field(1000, alias="maxScopes", ge=1)

    @field_validator("valid_keys")
    @classmethod
    def _well_formed_keys(cls, keys: list[str]) -> list[str]:
        return _well_formed(keys)


def _well_formed(keys: list[str]) -> list[str]:
    """`keys` without repeats, if each can be stored; else `ValueError` naming the first."""
    for key in keys:
        if not KEY_PATTERN.fullmatch(key) or key in RESERVED_KEYS:
            raise ValueError(
                f"{key!r} can never be stored: keys match ^[a-z][a-z0-9_]{{0,127}}$ "
                f"and are not {reserved_keys_text()}"
            )
    return list(dict.fromkeys(keys))


class MemoryConfig(Section):
    """LibreChat's `memory:` block, with the same field names and meaning."""

    disabled: bool = False
    personalize: bool = True
    valid_keys: list[str] | None = Field(None, alias="validKeys")
    token_limit: int | None = Field(None, alias="tokenLimit", ge=0)
    char_limit: int = Field(10_000, alias="charLimit", gt=0)
    max_input_tokens: int = Field(12_000, alias="maxInputTokens", gt=0)
    message_window_size: int = Field(5, alias="messageWindowSize", gt=0)
    agent: AgentConfig | None = None
    history: HistoryConfig = HistoryConfig()
    # Whether the agent's writes wait for the person's "keep" (`kvmem.memory.proposals`): `off`
    # (LibreChat's behaviour), `on` for everyone, or `per_user` (PATCH /preferences).
    review: Literal["off", "on", "per_user"] = "off"
    tasks: TasksConfig = TasksConfig()
    scopes: ScopesConfig | None = None

    @field_validator("review", mode="before")
    @classmethod
    def _review_words(cls, review: Any) -> Any:
        # YAML reads a bare `off` and `on` as booleans: take them as the words they were.
        if isinstance(review, bool):
            return "on" if review else "off"
        return review

    @field_validator("valid_keys")
    @classmethod
    def _well_formed_keys(cls, keys: list[str] | None) -> list[str] | None:
        return _well_formed(keys) if keys else None

    @model_validator(mode="after")
    def _one_layer_per_key(self) -> MemoryConfig:
        # A key is the person's own or scoped, never both: the agent's writes route by key.
        if self.scopes is not None and self.valid_keys:
            both = [key for key in self.scopes.valid_keys if key in self.valid_keys]
            if both:
                raise ValueError(
                    f"{', '.join(both)}: in both memory.validKeys and memory.scopes.validKeys; "
                    "a key is either the person's own or kept per scope, never both"
                )
        return self


class CustomEndpoint(Section):
    """A LibreChat `endpoints.custom` entry, which `memory.agent.provider` may name."""

    name: str
    base_url: str | None = Field(None, validation_alias=AliasChoices("baseURL", "api_base"))
    api_key: SecretStr | None = Field(None, validation_alias=AliasChoices("apiKey", "api_key"))
    headers: dict[str, SecretStr] = Field(default_factory=dict)
    models: dict[str, Any] = Field(default_factory=dict)


class EndpointsConfig(Section):
    """LibreChat's `endpoints:` section; kvmem reads only its `custom` entries."""

    custom: list[CustomEndpoint] = Field(default_factory=list)


class Config(Section):
    """The whole of memory.yaml as kvmem understands it."""

    server: ServerConfig = ServerConfig()
    database: DatabaseConfig = DatabaseConfig()
    auth: AuthConfig = AuthConfig()
    chat: ChatConfig = ChatConfig()
    memory: MemoryConfig = MemoryConfig()
    endpoints: EndpointsConfig = EndpointsConfig()
    ui: UiConfig = UiConfig()

    def custom_endpoint(self, name: str) -> CustomEndpoint | None:
        """The custom endpoint called `name` (exactly, else ignoring case), if any."""
        for match in (lambda e: e.name == name, lambda e: e.name.lower() == name.lower()):
            for endpoint in self.endpoints.custom:
                if match(endpoint):
                    return endpoint
        return None

    def agent_status(self) -> tuple[bool, str]:
        """Whether the memory agent runs, and why (for `kvmem check` and the agent gate)."""
        agent = self.memory.agent
        if self.memory.disabled:
            return False, "memory.disabled is true"
        if agent is None:
            return False, "memory.agent is not configured"
        if not agent.enabled:
            return False, "memory.agent.enabled is false"
        if agent.placement == "inline":
            return True, "inline: the main model writes memory markers in its reply"
        if not agent.provider or not agent.model:
            return False, "memory.agent needs both provider and model"
        endpoint = self.custom_endpoint(agent.provider)
        via = f"custom endpoint {endpoint.name!r}" if endpoint else f"provider {agent.provider!r}"
        return True, f"model {agent.model!r} via {via}"

    def inline_memory(self) -> bool:
        """Whether the main model writes memory itself (`memory.agent.placement: inline`)."""
        agent = self.memory.agent
        return (
            not self.memory.disabled
            and agent is not None
            and agent.enabled
            and agent.placement == "inline"
        )
