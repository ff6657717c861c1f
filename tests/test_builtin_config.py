"""The built-in config: what `kvmem` runs with where there is no memory.yaml (a fresh folder,
the container image), set from `KVMEM_*` variables; a file named or present replaces it."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvmem.config_loader import builtin_config, load_found_config
from kvmem.errors import ConfigError
from kvmem.upstream.model_client import agent_target
from tests.support.cli import invoke

KEY = "k" * 16


def test_without_variables_it_is_local_mode_with_sqlite_in_the_folder(tmp_path: Path) -> None:
    loaded = builtin_config({}, tmp_path)
    config = loaded.config
    assert loaded.builtin and loaded.warnings == ()
    assert config.auth.mode == "local" and config.auth.service_keys == []
    assert config.database.url == f"sqlite:///{tmp_path}/kvmem.db"
    assert (config.chat.model, config.chat.api_base, config.chat.api_key) == (
        "ollama/llama3.1",
        None,
        None,
    )
    # The memory agent is on, on the chat model: memory is what kvmem is for.
    assert config.agent_status() == (True, "model 'llama3.1' via provider 'ollama'")
    assert config.server.log_format == "text"


def test_every_variable_lands_in_its_field(tmp_path: Path) -> None:
    environ = {
        "KVMEM_SERVICE_KEY": KEY,
        "KVMEM_CHAT_MODEL": "openai/gpt-4.1-mini",
        "KVMEM_CHAT_API_BASE": "http://gateway:4000/v1",
        "KVMEM_CHAT_API_KEY": "chat-secret",
        "KVMEM_AGENT_MODEL": "anthropic/claude-3-5-haiku",
        "KVMEM_AGENT_API_BASE": "http://agent-gateway/v1",
        "KVMEM_AGENT_API_KEY": "agent-secret",
        "KVMEM_DATABASE_URL": "postgresql+psycopg://kvmem:pw@db:5432/kvmem",
        "KVMEM_LOG_FORMAT": "json",
    }
    config = builtin_config(environ, tmp_path).config
    assert config.auth.mode == "keys"
    assert [key.get_secret_value() for key in config.auth.service_keys] == [KEY]
    assert config.chat.model == "openai/gpt-4.1-mini"
    assert config.chat.api_base == "http://gateway:4000/v1"
    assert config.chat.api_key is not None and config.chat.api_key.get_secret_value() == (
        "chat-secret"
    )
    agent = agent_target(config)
    assert agent is not None
    assert (agent.model, agent.api_base, agent.api_key) == (
        "anthropic/claude-3-5-haiku",
        "http://agent-gateway/v1",
        "agent-secret",
    )
    assert config.database.url == "postgresql+psycopg://kvmem:pw@db:5432/kvmem"
    assert config.server.log_format == "json"


def test_the_agent_without_its_own_model_uses_the_chat_model_and_its_upstream(
    tmp_path: Path,
) -> None:
    environ = {
        "KVMEM_CHAT_MODEL": "openai/llama-3.1-8b",
        "KVMEM_CHAT_API_BASE": "http://vllm:8000/v1",
        "KVMEM_CHAT_API_KEY": "vllm-key",
        # Set but empty, as compose passes an unset `${VAR}`: the same as unset.
        "KVMEM_AGENT_MODEL": "",
        "KVMEM_AGENT_API_BASE": "http://ignored/v1",
    }
    agent = agent_target(builtin_config(environ, tmp_path).config)
    assert agent is not None
    assert (agent.model, agent.api_base, agent.api_key) == (
        "openai/llama-3.1-8b",
        "http://vllm:8000/v1",
        "vllm-key",
    )


def test_an_agent_model_without_a_provider_is_an_openai_model(tmp_path: Path) -> None:
    environ = {"KVMEM_AGENT_MODEL": "gpt-4.1-nano", "KVMEM_AGENT_API_KEY": "sk-agent"}
    agent = agent_target(builtin_config(environ, tmp_path).config)
    assert agent is not None
    assert (agent.model, agent.api_base, agent.api_key) == ("openai/gpt-4.1-nano", None, "sk-agent")


@pytest.mark.parametrize(
    ("key", "problem"),
    [
        ("", "is empty"),
        ("k" * 15, "has 15 characters, too short for a key that acts for every user"),
        (f" {KEY}", "starts or ends with white space, which HTTP headers drop"),
        (f"{KEY}\n", "starts or ends with white space, which HTTP headers drop"),
    ],
)
def test_a_service_key_that_is_empty_short_or_padded_is_refused(
    tmp_path: Path, key: str, problem: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        builtin_config({"KVMEM_SERVICE_KEY": key}, tmp_path)
    message = str(refused.value)
    assert message == (
        f"KVMEM_SERVICE_KEY {problem}: without a memory.yaml, kvmem's built-in config takes "
        "its one service key (auth.mode keys) from it; set it to a random secret of at least "
        "16 characters (openssl rand -hex 32), or unset it to serve only this machine in local "
        "mode, or write a memory.yaml (or mount one and name it in KVMEM_CONFIG)"
    )
    if key.strip():
        assert key.strip() not in message


@pytest.mark.parametrize("model", ["openai/", "/gpt-4.1-mini"])
def test_an_agent_model_that_names_no_model_is_refused(tmp_path: Path, model: str) -> None:
    with pytest.raises(ConfigError, match="KVMEM_AGENT_MODEL .* names no model"):
        builtin_config({"KVMEM_AGENT_MODEL": model}, tmp_path)


def test_a_bad_variable_is_refused_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        builtin_config({"KVMEM_LOG_FORMAT": "xml"}, tmp_path)
    assert str(refused.value) == (
        "built-in config (KVMEM_* variables): invalid config:\n"
        "  server.log_format: Input should be 'text' or 'json' (got 'xml')"
    )


def test_a_value_is_taken_as_it_is_not_interpolated(tmp_path: Path) -> None:
    key = "${HOME}-not-a-variable"
    config = builtin_config({"KVMEM_SERVICE_KEY": key, "HOME": "/root"}, tmp_path).config
    assert [k.get_secret_value() for k in config.auth.service_keys] == [key]


def test_a_memory_yaml_here_or_named_replaces_the_built_in_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    environ = {"KVMEM_SERVICE_KEY": KEY}
    assert load_found_config(None, environ).builtin
    (tmp_path / "mounted.yaml").write_text("chat: {model: openai/mounted}\n", encoding="utf-8")
    for loaded in (
        load_found_config("mounted.yaml", environ),
        load_found_config(None, environ | {"KVMEM_CONFIG": "mounted.yaml"}),
    ):
        assert not loaded.builtin
        assert (loaded.config.chat.model, loaded.config.auth.mode) == ("openai/mounted", "local")
    (tmp_path / "memory.yaml").write_text("chat: {model: openai/here}\n", encoding="utf-8")
    here = load_found_config(None, environ)
    assert (here.builtin, here.config.chat.model) == (False, "openai/here")


def test_a_named_file_that_is_missing_is_still_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A typo in --config or KVMEM_CONFIG must not fall back to the built-in config."""
    monkeypatch.chdir(tmp_path)
    for explicit, environ in ((None, {"KVMEM_CONFIG": "gone.yaml"}), ("gone.yaml", {})):
        with pytest.raises(ConfigError, match="gone.yaml: cannot read the config file"):
            load_found_config(explicit, environ)


def test_commands_in_a_fresh_folder_run_on_the_built_in_config(tmp_path: Path) -> None:
    """`kvmem memory set` and `check` in a folder with no memory.yaml: a database here."""
    written = invoke(["memory", "set", "likes", "tea"], cwd=tmp_path)
    assert (written.code, written.stderr) == (0, "")
    read = invoke(["memory", "get", "likes"], cwd=tmp_path)
    assert read.code == 0 and "tea" in read.stdout, read
    assert (tmp_path / "kvmem.db").exists()
    checked = invoke(["check"], cwd=tmp_path, env={"KVMEM_SERVICE_KEY": KEY})
    assert checked.code == 0, checked
    lines = checked.stdout.splitlines()
    assert lines[0] == "# config: built-in, from KVMEM_* variables (no memory.yaml here)"
    assert "  mode: keys" in lines and "  - '**********'" in lines
    assert KEY not in checked.stdout


def test_commands_refuse_a_short_key_with_exit_2(tmp_path: Path) -> None:
    result = invoke(["memory", "list"], cwd=tmp_path, env={"KVMEM_SERVICE_KEY": "short"})
    assert (result.code, result.stdout) == (2, "")
    assert result.stderr.startswith("kvmem: KVMEM_SERVICE_KEY has 5 characters, too short")
    assert not (tmp_path / "kvmem.db").exists()


def test_serve_on_a_public_host_without_a_key_says_which_variable_to_set(tmp_path: Path) -> None:
    """The image's `kvmem serve --host 0.0.0.0` run without KVMEM_SERVICE_KEY."""
    result = invoke(["serve", "--host", "0.0.0.0"], cwd=tmp_path)
    assert (result.code, result.stdout) == (2, "")
    assert result.stderr == (
        "kvmem: auth.mode is local (no credentials), so kvmem only binds a loopback address; "
        "'0.0.0.0' is not one. Use 127.0.0.1, or set KVMEM_SERVICE_KEY (keys mode), or write "
        "a memory.yaml.\n"
    )
