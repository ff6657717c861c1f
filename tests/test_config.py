"""memory.yaml: LibreChat's own examples load unchanged; every error names file and field."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import SecretStr

from kvmem.config import (
    AgentConfig,
    Config,
    CustomEndpoint,
    DatabaseConfig,
    EndpointsConfig,
    MemoryConfig,
)
from kvmem.config_loader import find_config_path, interpolate, load_config
from kvmem.errors import ConfigError

WriteConfig = Callable[..., Path]

# The three `memory:` examples of LibreChat's User Memory documentation
# (seeds/002_eb7da0d4f72bb5bf.txt), verbatim but for the custom one's indentation.
BASIC = """\
memory:
  tokenLimit: 2000
  maxInputTokens: 12000
  agent:
    provider: 'openAI'
    model: 'gpt-4.1-mini'
"""

ADVANCED = """\
memory:
  disabled: false
  validKeys: ['preferences', 'context', 'facts']
  tokenLimit: 3000
  maxInputTokens: 12000
  personalize: true
  messageWindowSize: 10
  agent:
    provider: 'anthropic'
    model: 'claude-3-opus-20240229'
    instructions: 'Remember only explicitly stated preferences and key facts.'
    model_parameters:
      temperature: 0.3
"""

CUSTOM_LIBRECHAT_YAML = """\
version: 1.3.5
cache: true

interface:
  customWelcome: "Welcome to LibreChat!"
  memories: true
  agents: true

registration:
  socialLogins: ['github', 'google']

endpoints:
  custom:
    - name: 'Custom Memory Endpoint'
      apiKey: 'dummy'
      baseURL: 'https://api.gateway.ai/v1'
      headers:
        x-gateway-api-key: '${GATEWAY_API_KEY}'
        x-gateway-virtual-key: '${GATEWAY_OPENAI_VIRTUAL_KEY}'
        X-User-Identifier: '{{LIBRECHAT_USER_EMAIL}}'
        X-Application-Identifier: 'LibreChat - Test'
        api-key: '${TEST_CUSTOM_API_KEY}'
      models:
        default:
          - 'gpt-4o-mini'
          - 'gpt-4o'
        fetch: false

memory:
  disabled: false
  tokenLimit: 3000
  maxInputTokens: 12000
  personalize: true
  messageWindowSize: 10
  agent:
    provider: 'Custom Memory Endpoint'
    model: 'gpt-4o-mini'
"""

CUSTOM_ENV = {
    "GATEWAY_API_KEY": "gw-secret-1111",
    "GATEWAY_OPENAI_VIRTUAL_KEY": "vk-secret-2222",
    "TEST_CUSTOM_API_KEY": "custom-secret-3333",
}


def default_database(folder: Path) -> DatabaseConfig:
    """The default `sqlite:///kvmem.db`, resolved against the config file's folder."""
    return DatabaseConfig(url=f"sqlite:///{folder.resolve() / 'kvmem.db'}")


def test_basic_example_loads(write_config: WriteConfig, tmp_path: Path) -> None:
    loaded = load_config(write_config(BASIC), environ={})
    assert loaded.warnings == ()
    assert loaded.config == Config(
        database=default_database(tmp_path),
        memory=MemoryConfig(
            tokenLimit=2000,
            maxInputTokens=12000,
            agent=AgentConfig(provider="openAI", model="gpt-4.1-mini"),
        ),
    )
    assert loaded.config.memory.agent.model_parameters == {"temperature": 0.4}
    assert loaded.config.agent_status() == (True, "model 'gpt-4.1-mini' via provider 'openAI'")


def test_advanced_example_loads(write_config: WriteConfig, tmp_path: Path) -> None:
    loaded = load_config(write_config(ADVANCED), environ={})
    assert loaded.warnings == ()
    assert loaded.config == Config(
        database=default_database(tmp_path),
        memory=MemoryConfig(
            disabled=False,
            validKeys=["preferences", "context", "facts"],
            tokenLimit=3000,
            maxInputTokens=12000,
            personalize=True,
            messageWindowSize=10,
            agent=AgentConfig(
                provider="anthropic",
                model="claude-3-opus-20240229",
                instructions="Remember only explicitly stated preferences and key facts.",
                model_parameters={"temperature": 0.3},
            ),
        ),
    )


def test_custom_endpoint_example_loads_inside_a_whole_librechat_yaml(
    write_config: WriteConfig, tmp_path: Path
) -> None:
    path = write_config(CUSTOM_LIBRECHAT_YAML, name="librechat.yaml")
    loaded = load_config(path, environ=CUSTOM_ENV)
    assert loaded.path == path
    assert loaded.warnings == (
        "ignoring top-level section 'version' (not used by kvmem)",
        "ignoring top-level section 'cache' (not used by kvmem)",
        "ignoring top-level section 'interface' (not used by kvmem)",
        "ignoring top-level section 'registration' (not used by kvmem)",
        "ignoring endpoints.custom[0].models.fetch (a LibreChat field kvmem does not use)",
    )
    endpoint = CustomEndpoint(
        name="Custom Memory Endpoint",
        apiKey="dummy",
        baseURL="https://api.gateway.ai/v1",
        headers={
            "x-gateway-api-key": "gw-secret-1111",
            "x-gateway-virtual-key": "vk-secret-2222",
            "X-User-Identifier": "{{LIBRECHAT_USER_EMAIL}}",
            "X-Application-Identifier": "LibreChat - Test",
            "api-key": "custom-secret-3333",
        },
        models={"default": ["gpt-4o-mini", "gpt-4o"]},
    )
    assert loaded.config == Config(
        database=default_database(tmp_path),
        endpoints=EndpointsConfig(custom=[endpoint]),
        memory=MemoryConfig(
            disabled=False,
            tokenLimit=3000,
            maxInputTokens=12000,
            personalize=True,
            messageWindowSize=10,
            agent=AgentConfig(provider="Custom Memory Endpoint", model="gpt-4o-mini"),
        ),
    )
    # The placeholder is resolved per request, not at load time.
    headers = loaded.config.endpoints.custom[0].headers
    assert headers["X-User-Identifier"].get_secret_value() == "{{LIBRECHAT_USER_EMAIL}}"
    assert loaded.config.custom_endpoint(loaded.config.memory.agent.provider) == endpoint
    assert loaded.config.agent_status() == (
        True,
        "model 'gpt-4o-mini' via custom endpoint 'Custom Memory Endpoint'",
    )


def test_other_endpoints_and_custom_entry_extras_are_ignored_with_warnings(
    write_config: WriteConfig,
) -> None:
    text = """\
endpoints:
  openAI:
    apiKey: '${OPENAI_API_KEY}'
    titleConvo: true
  agents:
    disableBuilder: false
  custom:
    - name: 'Gateway'
      apiKey: 'k'
      baseURL: 'https://gw.example/v1'
      titleConvo: true
      titleModel: 'gpt-4o-mini'
      modelDisplayLabel: 'My Gateway'
      dropParams: ['stop', 'user']
      iconURL: '${UNSET_BUT_IGNORED}'
      models:
        default: ['m1']
        fetch: true
memory:
  agent: {provider: gateway, model: m1}
"""
    # Ignored fields are not interpolated: their unset variables are no error.
    loaded = load_config(write_config(text), environ={})
    assert loaded.warnings == (
        "ignoring endpoints.openAI (kvmem reads only endpoints.custom)",
        "ignoring endpoints.agents (kvmem reads only endpoints.custom)",
        "ignoring endpoints.custom[0].titleConvo (a LibreChat field kvmem does not use)",
        "ignoring endpoints.custom[0].titleModel (a LibreChat field kvmem does not use)",
        "ignoring endpoints.custom[0].modelDisplayLabel (a LibreChat field kvmem does not use)",
        "ignoring endpoints.custom[0].dropParams (a LibreChat field kvmem does not use)",
        "ignoring endpoints.custom[0].iconURL (a LibreChat field kvmem does not use)",
        "ignoring endpoints.custom[0].models.fetch (a LibreChat field kvmem does not use)",
    )
    assert loaded.config.endpoints == EndpointsConfig(
        custom=[
            CustomEndpoint(
                name="Gateway",
                apiKey="k",
                baseURL="https://gw.example/v1",
                models={"default": ["m1"]},
            )
        ]
    )
    # Provider names match custom endpoints ignoring case.
    assert loaded.config.custom_endpoint(loaded.config.memory.agent.provider).name == "Gateway"


def test_custom_endpoint_lookup() -> None:
    config = Config.model_validate(
        {
            "endpoints": {
                "custom": [{"name": "My Gateway"}, {"name": "my gateway"}, {"name": "Other"}]
            }
        }
    )
    assert config.custom_endpoint("My Gateway") is config.endpoints.custom[0]
    assert config.custom_endpoint("my gateway") is config.endpoints.custom[1]
    assert config.custom_endpoint("MY GATEWAY") is config.endpoints.custom[0]
    assert config.custom_endpoint("other") is config.endpoints.custom[2]
    assert config.custom_endpoint("openai") is None


def test_an_empty_file_is_the_defaults(write_config: WriteConfig, tmp_path: Path) -> None:
    loaded = load_config(write_config(""), environ={})
    assert (loaded.config, loaded.warnings) == (Config(database=default_database(tmp_path)), ())


def test_interpolate_is_a_pure_function() -> None:
    environ = {"HOST": "0.0.0.0", "PORT": "9000", "EMPTY": ""}
    value = {
        "server": {"host": "${HOST}", "port": "${PORT:-8700}", "name": "pre-${HOST}-${PORT}-post"},
        "list": ["${MISSING:-fallback}", "${MISSING:-}", 3, None, True, "$HOST", "${HOST:-x}"],
        "empty": {"plain": "${EMPTY}", "defaulted": "${EMPTY:-used}"},
        "literal": "no variables here {{LIBRECHAT_USER_ID}}",
    }
    before = repr(value)
    assert interpolate(value, environ) == {
        "server": {"host": "0.0.0.0", "port": "9000", "name": "pre-0.0.0.0-9000-post"},
        "list": ["fallback", "", 3, None, True, "$HOST", "0.0.0.0"],
        "empty": {"plain": "", "defaulted": "used"},
        "literal": "no variables here {{LIBRECHAT_USER_ID}}",
    }
    assert repr(value) == before  # the input is not changed


def test_interpolate_names_the_missing_variable_and_the_field() -> None:
    value = {"endpoints": {"custom": [{"headers": {"x-key": "Bearer ${GATEWAY_KEY}"}}]}}
    with pytest.raises(KeyError) as raised:
        interpolate(value, {})
    assert raised.value.args == ("GATEWAY_KEY", "endpoints.custom[0].headers.x-key")


def test_interpolation_happens_before_validation(write_config: WriteConfig) -> None:
    path = write_config("server: {port: '${KV_PORT:-8701}'}\nmemory: {tokenLimit: '${KV_LIMIT}'}\n")
    config = load_config(path, environ={"KV_LIMIT": "500"}).config
    assert (config.server.port, config.memory.token_limit) == (8701, 500)


def test_a_missing_variable_names_variable_field_and_file(write_config: WriteConfig) -> None:
    path = write_config(
        "memory:\n  agent:\n    provider: openai\n    model: m\n    apiKey: ${KV_AGENT_KEY}\n"
    )
    with pytest.raises(ConfigError) as raised:
        load_config(path, environ={"OTHER": "x"})
    assert str(raised.value) == (
        f"{path}: memory.agent.apiKey: environment variable KV_AGENT_KEY is not set "
        "(write ${KV_AGENT_KEY:-default} to give a default)"
    )


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            "memory:\n  tokenLimt: 2000\n",
            "memory.tokenLimt: unknown field; did you mean 'tokenLimit'?",
        ),
        (
            "memory:\n  validkeys: [a]\n",
            "memory.validkeys: unknown field; did you mean 'validKeys'?",
        ),
        (
            "memory:\n  agent:\n    modell: x\n",
            "memory.agent.modell: unknown field; did you mean 'model'?",
        ),
        (
            "memory:\n  agent:\n    mod: json\n",
            "memory.agent.mod: unknown field; did you mean 'mode'?",
        ),
        # A swap keeps every letter: people who type `modle` mean `model` before `mode`.
        (
            "memory:\n  agent:\n    modle: x\n",
            "memory.agent.modle: unknown field; did you mean 'model' or 'mode'?",
        ),
        (
            "memory:\n  agent:\n    mdoe: json\n",
            "memory.agent.mdoe: unknown field; did you mean 'mode'?",
        ),
        # One name per field: the spelling nearest the typo of a field with aliases.
        (
            "memory:\n  agent:\n    apikey: k\n",
            "memory.agent.apikey: unknown field; did you mean 'apiKey'?",
        ),
        (
            "memory:\n  agent:\n    api_kye: k\n",
            "memory.agent.api_kye: unknown field; did you mean 'api_key'?",
        ),
        # Further than a typo from every field: the one field most like it, as before.
        (
            "chat:\n  system_message: x\n",
            "chat.system_message: unknown field; did you mean 'system_prompt'?",
        ),
        ("server:\n  prot: 8700\n", "server.prot: unknown field; did you mean 'port'?"),
        (
            "auth:\n  service_key: [x]\n",
            "auth.service_key: unknown field; did you mean 'service_keys'?",
        ),
        ("memory:\n  zzzzzz: 1\n", "memory.zzzzzz: unknown field"),
    ],
)
def test_unknown_fields_name_the_path_and_suggest(
    write_config: WriteConfig, text: str, problem: str
) -> None:
    path = write_config(text)
    with pytest.raises(ConfigError) as raised:
        load_config(path, environ={})
    assert str(raised.value) == f"{path}: invalid config:\n  {problem}"


def test_every_near_miss_in_the_config_is_named_with_its_full_path(
    write_config: WriteConfig,
) -> None:
    path = write_config("""\
server: {prot: 8700, hots: 0.0.0.0}
chat: {modle: m}
memory:
  tokenLimt: 10
  agent: {provider: openai, modle: m, grace_secs: 2}
  history: {keepDays: 5}
""")
    with pytest.raises(ConfigError) as raised:
        load_config(path, environ={})
    assert str(raised.value).splitlines() == [
        f"{path}: invalid config:",
        "  server.prot: unknown field; did you mean 'port'?",
        "  server.hots: unknown field; did you mean 'host'?",
        "  chat.modle: unknown field; did you mean 'model'?",
        "  memory.agent.modle: unknown field; did you mean 'model' or 'mode'?",
        "  memory.agent.grace_secs: unknown field; did you mean 'grace_seconds'?",
        "  memory.history.keepDays: unknown field; did you mean 'keep_days'?",
        "  memory.tokenLimt: unknown field; did you mean 'tokenLimit'?",
    ]


def test_ignored_names_that_are_typos_of_kvmems_are_named_in_their_warnings(
    write_config: WriteConfig,
) -> None:
    """Top-level sections and custom-endpoint fields kvmem does not know are ignored (a
    pasted librechat.yaml carries many); a typo of one kvmem knows says which it meant."""
    text = """\
memroy: {tokenLimit: 10}
endpoints:
  custum: []
  custom:
    - name: g
      apikey: k
      baseUrl: https://gw.example/v1
      models: {defualt: [m]}
"""
    loaded = load_config(write_config(text), environ={})
    assert loaded.warnings == (
        "ignoring top-level section 'memroy' (not used by kvmem); did you mean 'memory'?",
        "ignoring endpoints.custum (kvmem reads only endpoints.custom); did you mean 'custom'?",
        "ignoring endpoints.custom[0].apikey (unknown field); did you mean 'apiKey'?",
        "ignoring endpoints.custom[0].baseUrl (unknown field); did you mean 'baseURL'?",
        "ignoring endpoints.custom[0].models.defualt (unknown field); did you mean 'default'?",
    )


# LibreChat's own top-level sections, `endpoints` entries and custom-endpoint fields.
LIBRECHAT_SECTIONS = [
    "version",
    "cache",
    "fileStrategy",
    "secureImageLinks",
    "imageOutputType",
    "ocr",
    "webSearch",
    "includedTools",
    "filteredTools",
    "mcpServers",
    "interface",
    "turnstile",
    "registration",
    "balance",
    "transactions",
    "speech",
    "rateLimits",
    "actions",
    "fileConfig",
    "modelSpecs",
    "agents",
]
LIBRECHAT_ENDPOINTS = [
    "openAI",
    "azureOpenAI",
    "assistants",
    "azureAssistants",
    "agents",
    "anthropic",
    "bedrock",
    "google",
    "gptPlugins",
    "all",
]
LIBRECHAT_CUSTOM_FIELDS = [
    "iconURL",
    "titleConvo",
    "titleMethod",
    "titleModel",
    "titleMessageRole",
    "summarize",
    "summaryModel",
    "forcePrompt",
    "modelDisplayLabel",
    "addParams",
    "dropParams",
    "directEndpoint",
    "customParams",
    "customOrder",
]


def test_librechats_own_names_get_no_suggestion(write_config: WriteConfig) -> None:
    custom = "".join(f"      {field}: 1\n" for field in LIBRECHAT_CUSTOM_FIELDS)
    text = (
        "".join(f"{section}: 1\n" for section in LIBRECHAT_SECTIONS)
        + "endpoints:\n"
        + "".join(f"  {endpoint}: {{}}\n" for endpoint in LIBRECHAT_ENDPOINTS)
        + f"  custom:\n    - name: g\n{custom}      models: {{default: [m], fetch: true, userIdQuery: true}}\n"
    )
    warnings = load_config(write_config(text), environ={}).warnings
    assert len(warnings) == (
        len(LIBRECHAT_SECTIONS) + len(LIBRECHAT_ENDPOINTS) + len(LIBRECHAT_CUSTOM_FIELDS) + 2
    )
    assert [warning for warning in warnings if "did you mean" in warning] == []


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            "memory:\n  tokenLimit: lots\n",
            "memory.tokenLimit: Input should be a valid integer, unable to parse string as an "
            "integer (got 'lots')",
        ),
        (
            "memory:\n  validKeys: abc\n",
            "memory.validKeys: Input should be a valid list (got 'abc')",
        ),
        ("auth:\n  mode: open\n", "auth.mode: Input should be 'local' or 'keys' (got 'open')"),
        (
            "endpoints:\n  custom:\n    - name: g\n      models: [m1]\n",
            "endpoints.custom[0].models: Input should be a valid dictionary (got ['m1'])",
        ),
        (
            "endpoints:\n  custom:\n    - baseURL: https://x\n",
            "endpoints.custom[0].name: Field required",
        ),
    ],
)
def test_wrong_types_name_file_and_path(write_config: WriteConfig, text: str, problem: str) -> None:
    path = write_config(text)
    with pytest.raises(ConfigError) as raised:
        load_config(path, environ={})
    assert str(raised.value) == f"{path}: invalid config:\n  {problem}"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            "auth:\n  service_keys: [123456789]\n",
            "auth.service_keys[0]: Input should be a valid string",
        ),
        (
            "auth:\n  service_keys: svc-secret-1\n",
            "auth.service_keys: Input should be a valid list",
        ),
        ("chat:\n  api_key: 987654321\n", "chat.api_key: Input should be a valid string"),
        (
            "memory:\n  agent: {headers: {x-key: 55555}}\n",
            "memory.agent.headers.x-key: Input should be a valid string",
        ),
        (
            "endpoints:\n  custom: [{name: g, apiKey: [svc-secret-2]}]\n",
            "endpoints.custom[0].apiKey: Input should be a valid string",
        ),
        ("database:\n  url: 31415926\n", "database.url: Input should be a valid string"),
    ],
)
def test_wrongly_typed_secrets_are_not_echoed(
    write_config: WriteConfig, text: str, problem: str
) -> None:
    path = write_config(text)
    with pytest.raises(ConfigError) as raised:
        load_config(path, environ={})
    assert str(raised.value) == f"{path}: invalid config:\n  {problem}"


@pytest.mark.parametrize(
    "bad", ["Bad-Key", "nothing", "history", "export", "1abc", "a" * 129, "", "with space"]
)
def test_invalid_valid_keys_are_refused(write_config: WriteConfig, bad: str) -> None:
    path = write_config(f"memory:\n  validKeys: ['fine', '{bad}']\n")
    with pytest.raises(ConfigError) as raised:
        load_config(path, environ={})
    assert str(raised.value) == (
        f"{path}: invalid config:\n  memory.validKeys: Value error, {bad!r} can never be stored: "
        "keys match ^[a-z][a-z0-9_]{0,127}$ and are not 'export', 'history', 'nothing', 'proposals' or 'scopes'"
    )


def test_valid_keys_of_128_characters_are_accepted(write_config: WriteConfig) -> None:
    config = load_config(
        write_config(f"memory: {{validKeys: [{'k' * 128}, b, b]}}\n"), environ={}
    ).config
    assert config.memory.valid_keys == ["k" * 128, "b"]


def test_memory_agent_id_is_a_clear_error(write_config: WriteConfig) -> None:
    path = write_config("memory:\n  agent:\n    id: 'memory-specialist-001'\n")
    with pytest.raises(ConfigError) as raised:
        load_config(path, environ={})
    assert str(raised.value) == (
        f"{path}: memory.agent.id: LibreChat's predefined agents do not exist in kvmem; "
        "expected memory.agent.provider and memory.agent.model instead"
    )


def test_unreadable_and_malformed_files(write_config: WriteConfig, tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as raised:
        load_config(missing, environ={})
    assert str(raised.value) == f"{missing}: cannot read the config file: No such file or directory"

    not_a_mapping = write_config("- a\n- b\n")
    with pytest.raises(ConfigError) as raised:
        load_config(not_a_mapping, environ={})
    assert str(raised.value) == f"{not_a_mapping}: expected a mapping of sections at the top level"

    broken = write_config("memory: [unclosed\n", name="broken.yaml")
    with pytest.raises(ConfigError) as raised:
        load_config(broken, environ={})
    assert str(raised.value).startswith(f"{broken}: not valid YAML: ")


def test_relative_sqlite_path_is_relative_to_the_config_folder(
    write_config: WriteConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    path = write_config("database: {url: 'sqlite:///data/kv.db'}\n", name="conf/memory.yaml")
    assert (
        load_config(path, environ={}).config.database.url
        == f"sqlite:///{tmp_path / 'conf/data/kv.db'}"
    )

    dotted = write_config("database: {url: 'sqlite:///./kv.db'}\n", name="conf/dotted.yaml")
    assert (
        load_config(dotted, environ={}).config.database.url
        == f"sqlite:///{tmp_path / 'conf/kv.db'}"
    )


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:////srv/kvmem/kv.db",
        "sqlite:///:memory:",
        "postgresql+psycopg://kv:pw@db:5432/kvmem",
    ],
)
def test_absolute_memory_and_server_urls_are_unchanged(write_config: WriteConfig, url: str) -> None:
    path = write_config(f"database: {{url: '{url}'}}\n")
    assert load_config(path, environ={}).config.database.url == url


def test_find_config_path() -> None:
    assert find_config_path("a.yaml", {"KVMEM_CONFIG": "b.yaml"}) == Path("a.yaml")
    assert find_config_path(None, {"KVMEM_CONFIG": "b.yaml"}) == Path("b.yaml")
    assert find_config_path(None, {}) == Path("memory.yaml")


SECRETS_YAML = """\
database:
  url: 'postgresql+psycopg://kvmem:${DB_PASSWORD}@db.internal:5432/kvmem'
auth:
  mode: keys
  service_keys: ['${SERVICE_KEY}', 'svc-literal-5555']
chat:
  model: openai/gpt-4o
  api_key: '${CHAT_KEY}'
  headers: {x-chat-header: 'chat-header-6666'}
memory:
  agent:
    provider: 'Custom Memory Endpoint'
    model: gpt-4o-mini
    apiKey: 'agent-key-7777'
    headers: {x-agent-header: 'agent-header-8888'}
endpoints:
  custom:
    - name: 'Custom Memory Endpoint'
      apiKey: 'dummy-9999'
      baseURL: 'https://api.gateway.ai/v1'
      headers:
        x-gateway-api-key: '${GATEWAY_API_KEY}'
        X-Application-Identifier: 'LibreChat - Test'
"""
SECRETS_ENV = {
    "DB_PASSWORD": "db-pass-0000",
    "SERVICE_KEY": "svc-env-4444",
    "CHAT_KEY": "chat-key-1212",
    "GATEWAY_API_KEY": "gw-secret-1111",
}
SECRET_VALUES = [
    "db-pass-0000",
    "svc-env-4444",
    "svc-literal-5555",
    "chat-key-1212",
    "chat-header-6666",
    "agent-key-7777",
    "agent-header-8888",
    "dummy-9999",
    "gw-secret-1111",
    "LibreChat - Test",
]


def test_secrets_never_appear_in_repr(write_config: WriteConfig) -> None:
    config = load_config(write_config(SECRETS_YAML), environ=SECRETS_ENV).config
    # They are loaded all the same.
    assert config.auth.service_keys == [SecretStr("svc-env-4444"), SecretStr("svc-literal-5555")]
    assert config.database.url == "postgresql+psycopg://kvmem:db-pass-0000@db.internal:5432/kvmem"
    texts = [
        repr(config),
        str(config),
        repr(config.database),
        repr(config.endpoints),
        repr(config.chat),
    ]
    for text in texts:
        for secret in SECRET_VALUES:
            assert secret not in text, (secret, text)
    assert "postgresql+psycopg://kvmem:***@db.internal:5432/kvmem" in repr(config)


def _run_check(path: Path, environ: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "KVMEM_CONFIG"} | environ
    return subprocess.run(
        [sys.executable, "-m", "kvmem", "check", "--config", str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def test_kvmem_check_masks_every_secret(write_config: WriteConfig) -> None:
    result = _run_check(write_config(SECRETS_YAML), SECRETS_ENV)
    assert (result.returncode, result.stderr) == (0, "")
    for secret in SECRET_VALUES:
        assert secret not in result.stdout, secret
    assert "url: postgresql+psycopg://kvmem:***@db.internal:5432/kvmem" in result.stdout
    assert "x-gateway-api-key: '**********'" in result.stdout
    assert "X-Application-Identifier: '**********'" in result.stdout
    assert result.stdout.rstrip().splitlines()[-1] == (
        "# memory agent: on (model 'gpt-4o-mini' via custom endpoint 'Custom Memory Endpoint')"
    )


def test_kvmem_check_on_the_librechat_example(write_config: WriteConfig) -> None:
    path = write_config(CUSTOM_LIBRECHAT_YAML, name="librechat.yaml")
    result = _run_check(path, CUSTOM_ENV)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        "kvmem: warning: ignoring top-level section 'version' (not used by kvmem)",
        "kvmem: warning: ignoring top-level section 'cache' (not used by kvmem)",
        "kvmem: warning: ignoring top-level section 'interface' (not used by kvmem)",
        "kvmem: warning: ignoring top-level section 'registration' (not used by kvmem)",
        "kvmem: warning: ignoring endpoints.custom[0].models.fetch (a LibreChat field kvmem does not use)",
    ]
    for secret in [*CUSTOM_ENV.values(), "dummy", "LibreChat - Test", "LIBRECHAT_USER_EMAIL"]:
        assert secret not in result.stdout, secret
    assert result.stdout.splitlines()[0] == f"# config: {path.resolve()}"


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.168.1.10", False),
        ("example.com", False),
    ],
)
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert Config().server.is_loopback(host) is loopback


def test_an_unparseable_database_url_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "memory.yaml"
    path.write_text('database: {url: "not a url"}\n', encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    message = str(caught.value)
    assert message.startswith(f"{path}: invalid config:")
    assert "database.url: Value error, expected a SQLAlchemy database URL" in message


@pytest.mark.parametrize(
    ("text", "review"),
    [
        ("", "off"),
        ("memory: {review: off}", "off"),
        ("memory: {review: on}", "on"),
        ("memory: {review: 'on'}", "on"),
        ("memory: {review: per_user}", "per_user"),
    ],
)
def test_memory_review_reads_bare_yaml_words(
    write_config: WriteConfig, text: str, review: str
) -> None:
    # YAML 1.1 reads a bare on/off as a boolean; the field takes them as the words.
    assert load_config(write_config(text), environ={}).config.memory.review == review


def test_memory_review_refuses_other_values(write_config: WriteConfig) -> None:
    path = write_config("memory: {review: sometimes}")
    with pytest.raises(ConfigError) as raised:
        load_config(path, environ={})
    assert str(raised.value) == (
        f"{path}: invalid config:\n"
        "  memory.review: Input should be 'off', 'on' or 'per_user' (got 'sometimes')"
    )
