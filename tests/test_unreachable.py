"""A model that cannot be reached: every way in answers 502 `upstream_error` with a message a
person can act on (the model, the URL tried, why, the settings that choose them), never a
Python object's repr or a library's internals, and the log says the same."""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from kvmem.upstream.base import Target
from tests.support.apps import AGENT_MODEL, wait_agents_idle
from tests.support.ports import bound_socket

MAIN_SETTINGS = "chat.model (KVMEM_CHAT_MODEL in the shipped memory.yaml) or chat.api_base"
AGENT_SETTINGS = "memory.agent.provider, memory.agent.model or memory.agent.api_base"


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port bound but not listening: a connection to it is refused."""
    sock = bound_socket()
    yield sock.getsockname()[1]
    sock.close()


# (model, scheme): the direct client (`openai/...`) and litellm (`ollama/...`); over https a
# refused connection's text from aiohttp names its `ssl.SSLContext object at 0x...`.
MODELS = [
    ("openai/main-model", "http"),
    ("openai/main-model", "https"),
    ("ollama/llama3.1", "http"),
]


def unreachable(model: str, url: str, settings: str = MAIN_SETTINGS, whose: str = "the model"):
    return (
        f"the model call failed: cannot reach {whose} {model} at {url} (connection refused). "
        f"Start it there, or change {settings}"
    )


def expected_url(model: str, base: str) -> str:
    """The URL the message names: the direct client's request URL, litellm's base URL."""
    return f"{base}/chat/completions" if model.startswith("openai/") else base


@pytest.mark.parametrize(("model", "scheme"), MODELS)
def test_chat_v1_and_api_name_the_model_the_url_and_the_setting(
    make_client: Any, closed_port: int, model: str, scheme: str, caplog: Any
) -> None:
    base = f"{scheme}://127.0.0.1:{closed_port}"
    client = make_client(chat={"model": model, "api_base": base, "timeout": 10})
    message = unreachable(model, expected_url(model, base))
    openai_error = {"code": "upstream_error", "message": message, "upstream_status": None}
    chat_body = {"messages": [{"role": "user", "content": "hi"}], "model": model}
    caplog.set_level(logging.WARNING, logger="kvmem")

    for stream in (False, True):
        response = client.post("/chat", json={"message": "hi", "stream": stream})
        assert (response.status_code, response.json()) == (502, {"error": openai_error})

        response = client.post("/v1/chat/completions", json={**chat_body, "stream": stream})
        assert response.status_code == 502
        assert response.json() == {"error": {**openai_error, "type": "api_error", "param": None}}

        for path, body in (
            ("/api/chat", chat_body),
            ("/api/generate", {"model": model, "prompt": "hi"}),
        ):
            response = client.post(path, json={**body, "stream": stream})
            assert (response.status_code, response.json()) == (502, {"error": message})

    logged = [r.getMessage() for r in caplog.records if r.name == "kvmem"]
    assert f"POST /chat answered 502 upstream_error: {message}" in logged
    assert f"POST /api/generate answered 502 upstream_error: {message}" in logged
    assert len(logged) == 8  # one line per failed request: 4 routes, streamed or not


def test_the_agent_names_its_own_settings_in_healthz_and_the_log(
    make_client: Any, upstream: Any, chat_sections: Any, closed_port: int, caplog: Any
) -> None:
    base = f"http://127.0.0.1:{closed_port}"
    client = make_client(**chat_sections(agent={"api_base": base}))
    caplog.set_level(logging.INFO, logger="kvmem.agent")
    assert client.post("/chat", json={"message": "I like tea"}).status_code == 200
    wait_agents_idle(client)
    message = unreachable(
        f"openai/{AGENT_MODEL}",
        f"{base}/chat/completions",
        AGENT_SETTINGS,
        "the memory agent's model",
    )
    # A service key sees the message in /healthz; local mode is open.
    last_error = client.get("/healthz").json()["agent"]["last_error"]
    assert last_error["code"] == "upstream_error"
    failures = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert len(failures) == 1 and failures[0].endswith(f": {message}")


def test_a_custom_endpoints_agent_names_its_base_url_setting(
    make_client: Any, upstream: Any, chat_sections: Any, closed_port: int, caplog: Any
) -> None:
    base = f"http://127.0.0.1:{closed_port}/v1"
    sections = chat_sections(agent={"provider": "Gateway", "api_base": None})
    sections["endpoints"] = {"custom": [{"name": "Gateway", "baseURL": base, "apiKey": "k"}]}
    client = make_client(**sections)
    caplog.set_level(logging.INFO, logger="kvmem.agent")
    assert client.post("/chat", json={"message": "I like tea"}).status_code == 200
    wait_agents_idle(client)
    settings = (
        "the baseURL of endpoints.custom 'Gateway', or memory.agent.provider, "
        "memory.agent.model or memory.agent.api_base"
    )
    failures = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert failures and failures[0].endswith(
        unreachable(
            f"openai/{AGENT_MODEL}",
            f"{base}/chat/completions",
            settings,
            "the memory agent's model",
        )
    )


def test_litellm_names_the_providers_default_url_when_none_is_configured() -> None:
    from kvmem.upstream.litellm_client import litellm_url as _url

    assert _url(Target("ollama/llama3.1")) == "http://localhost:11434"
    assert _url(Target("ollama/llama3.1", api_base="http://gpu:11434")) == "http://gpu:11434"
    assert _url(Target("anthropic/claude-x")) == "anthropic's default URL"
    assert _url(Target("nonsense-provider/x")) == "its provider's default URL"


def test_a_host_name_that_does_not_resolve_says_so(make_client: Any) -> None:
    try:
        socket.getaddrinfo("kvmem-test.invalid", 80)
    except socket.gaierror:
        pass
    else:  # a resolver that answers for .invalid (a captive portal) makes this moot
        pytest.skip("this machine's resolver answers for .invalid")
    base = "http://kvmem-test.invalid:8080/v1"
    client = make_client(chat={"model": "openai/m", "api_base": base, "timeout": 10})
    response = client.post("/chat", json={"message": "hi"})
    assert response.status_code == 502
    message = response.json()["error"]["message"]
    assert message.startswith(
        f"the model call failed: cannot reach the model openai/m at {base}/chat/completions "
        "(host name not found ("
    )
    assert message.endswith(f"). Start it there, or change {MAIN_SETTINGS}")
    assert "object at 0x" not in json.dumps(response.json())
