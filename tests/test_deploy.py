"""deploy/: the Dockerfile says what the image promises, and the compose files beside LibreChat,
Open WebUI and for two replicas are valid YAML with a `kvmem` service, whose comments name
every variable they read from `.env`. (deploy/check-image.sh builds and runs the image.)"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvmem.config_loader import load_config

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
COMPOSE_FILES = sorted((DEPLOY / "compose").rglob("docker-compose*.yml"))
_VARIABLE = re.compile(r"\$\{([A-Z][A-Z0-9_]*)")


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def leading_comments(path: Path) -> str:
    """The comment lines at the top of a file, before its first line of YAML."""
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        lines.append(line)
    return "\n".join(lines)


def test_there_is_a_compose_file_for_each_front_end_and_for_replicas() -> None:
    assert [p.relative_to(DEPLOY / "compose").as_posix() for p in COMPOSE_FILES] == [
        "librechat/docker-compose.override.yml",
        "openwebui/docker-compose.yml",
        "replicas/docker-compose.yml",
    ]


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: p.parent.name)
def test_each_compose_file_runs_kvmem_with_its_data_in_a_volume(path: Path) -> None:
    services = load(path)["services"]
    kvmem = services["kvmem"]
    assert kvmem["image"] == "${KVMEM_IMAGE:-kvmem:latest}"
    environment = kvmem["environment"]
    # Compose refuses to start without the key: never an empty one by accident.
    assert environment["KVMEM_SERVICE_KEY"].startswith("${KVMEM_SERVICE_KEY:?")
    if "KVMEM_DATABASE_URL" not in environment:
        assert "kvmem-data:/data" in kvmem["volumes"]
        assert "kvmem-data" in load(path)["volumes"]


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: p.parent.name)
def test_each_compose_files_comments_name_every_variable_it_reads_from_env(path: Path) -> None:
    comments = leading_comments(path)
    assert "Put in .env" in comments or "Put in LibreChat's .env" in comments
    for variable in sorted(set(_VARIABLE.findall(path.read_text(encoding="utf-8")))):
        assert re.search(rf"^#\s+{variable}=", comments, re.MULTILINE), (path, variable)


def test_librechat_forwards_the_user_and_the_conversation_and_marks_titles_as_tasks() -> None:
    folder = DEPLOY / "compose" / "librechat"
    api = load(folder / "docker-compose.override.yml")["services"]["api"]
    assert {"type": "bind", "source": "./librechat.yaml", "target": "/app/librechat.yaml"} in api[
        "volumes"
    ]
    config = load(folder / "librechat.yaml")
    assert "memory" not in config  # LibreChat's own memory would be a second one
    endpoints = {entry["name"]: entry for entry in config["endpoints"]["custom"]}
    chat = endpoints["kvmem"]
    assert chat["baseURL"] == "http://kvmem:8700/v1"
    assert chat["apiKey"] == "${KVMEM_SERVICE_KEY}"
    assert chat["headers"] == {
        "X-User-Id": "{{LIBRECHAT_USER_ID}}",
        "X-Conversation-Id": "{{LIBRECHAT_BODY_CONVERSATIONID}}",
    }
    assert "X-Memory-Task" not in chat["headers"]
    titles = endpoints[chat["titleEndpoint"]]
    assert titles["baseURL"] == chat["baseURL"] and titles["apiKey"] == chat["apiKey"]
    assert titles["headers"] == {**chat["headers"], "X-Memory-Task": "title"}
    # kvmem itself can be pointed at the whole file (LibreChat's fields are ignored).
    loaded = load_config(folder / "librechat.yaml", {"KVMEM_SERVICE_KEY": "k" * 32})
    assert [e.name for e in loaded.config.endpoints.custom] == ["kvmem", "kvmem-tasks"]


def test_open_webui_forwards_a_signed_user_and_kvmem_verifies_it() -> None:
    folder = DEPLOY / "compose" / "openwebui"
    services = load(folder / "docker-compose.yml")["services"]
    webui = services["open-webui"]["environment"]
    kvmem = services["kvmem"]
    assert webui["OPENAI_API_BASE_URL"] == "http://kvmem:8700/v1"
    assert webui["OPENAI_API_KEY"] == kvmem["environment"]["KVMEM_SERVICE_KEY"]
    assert webui["ENABLE_FORWARD_USER_INFO_HEADERS"] == "true"
    secret = webui["FORWARD_USER_INFO_HEADER_JWT_SECRET"]
    assert secret == kvmem["environment"]["WEBUI_FORWARD_JWT_SECRET"]
    mounted = {v.split(":")[1]: v.split(":")[0] for v in kvmem["volumes"] if v.startswith("./")}
    config_path = kvmem["environment"]["KVMEM_CONFIG"]
    assert (folder / mounted[config_path]).resolve() == folder / "memory.yaml"
    config = load(folder / "memory.yaml")
    assert config["auth"]["mode"] == "keys"
    assert config["auth"]["service_keys"] == ["${KVMEM_SERVICE_KEY}"]
    assert config["auth"]["jwt"] == {"secret": "${WEBUI_FORWARD_JWT_SECRET}", "required": True}
    assert config["auth"]["conversation_id_headers"] == ["X-OpenWebUI-Chat-Id"]
    # Every ${VAR} of the mounted config is in kvmem's environment.
    text = (folder / "memory.yaml").read_text(encoding="utf-8")
    assert set(_VARIABLE.findall(text)) <= set(kvmem["environment"])
    assert '{"X-Memory-Task": "{{TASK}}"}' in leading_comments(folder / "docker-compose.yml")
    # kvmem loads it with what the compose file gives it.
    environ = {
        "KVMEM_SERVICE_KEY": "k" * 32,
        "WEBUI_FORWARD_JWT_SECRET": "s" * 32,
        "KVMEM_CHAT_MODEL": "openai/gpt-4.1-mini",
        "KVMEM_CHAT_API_BASE": "https://api.openai.com/v1",
        "KVMEM_CHAT_API_KEY": "sk-test",
        "KVMEM_AGENT_PROVIDER": "openai",
        "KVMEM_AGENT_MODEL": "gpt-4.1-nano",
    }
    loaded = load_config(folder / "memory.yaml", environ)
    assert loaded.warnings == ()
    jwt = loaded.config.auth.jwt
    assert jwt is not None and jwt.required and jwt.secret.get_secret_value() == "s" * 32
    assert loaded.config.agent_status() == (True, "model 'gpt-4.1-nano' via provider 'openai'")


def test_two_replicas_share_one_postgresql() -> None:
    compose = load(DEPLOY / "compose" / "replicas" / "docker-compose.yml")
    kvmem = compose["services"]["kvmem"]
    assert kvmem["deploy"]["replicas"] == 2
    assert kvmem["environment"]["KVMEM_DATABASE_URL"].startswith(
        "postgresql+psycopg://kvmem:${POSTGRES_PASSWORD"
    )
    assert kvmem["environment"]["KVMEM_DATABASE_URL"].endswith("@postgres:5432/kvmem")
    assert kvmem["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    assert compose["services"]["postgres"]["environment"]["POSTGRES_DB"] == "kvmem"


def dockerfile_instructions() -> list[tuple[str, str]]:
    """The Dockerfile's instructions (continuation lines joined), as (NAME, arguments)."""
    text = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    lines = [line for line in text.split("\n") if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    found = []
    for line in joined.split("\n"):
        if line.strip():
            name, _, arguments = line.strip().partition(" ")
            found.append((name.upper(), " ".join(arguments.split())))
    return found


def test_the_dockerfile_builds_from_a_base_argument_and_runs_kvmem_as_promised() -> None:
    instructions = dockerfile_instructions()
    names = [name for name, _ in instructions]
    assert instructions[0] == ("ARG", "BASE=python:3.12-slim")
    froms = [arguments for name, arguments in instructions if name == "FROM"]
    assert froms == ["${BASE} AS build", "${BASE}"]  # multi-stage, both on BASE
    final = instructions[names.index("FROM", names.index("FROM") + 1) :]
    last = dict(final)
    assert last["USER"] == "kvmem"
    assert "--uid 10001" in last["RUN"] and "chown kvmem:kvmem /data" in last["RUN"]
    assert last["VOLUME"] == "/data"
    assert last["EXPOSE"] == "8700"
    assert "http://127.0.0.1:8700/healthz" in last["HEALTHCHECK"]
    assert last["CMD"] == '["kvmem", "serve", "--host", "0.0.0.0"]'
    assert "KVMEM_DATABASE_URL=sqlite:////data/kvmem.db" in last["ENV"]
    # The build's CA bundle is an argument, never copied into the image.
    assert [a for n, a in instructions if n == "COPY" and "cert" in a.lower()] == []


def test_the_image_check_stays_out_of_ci() -> None:
    """Building an image takes minutes and root: it is run on purpose, not by .ci/run."""
    assert (DEPLOY / "check-image.sh").exists()
    assert "check-image" not in (ROOT / ".ci" / "run").read_text(encoding="utf-8")
