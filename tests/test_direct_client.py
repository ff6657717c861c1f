"""The direct path (kvmem/upstream/direct_client.py) and how model_client.py chooses it: fidelity (every
field the upstream sends reaches the client, byte for byte), no redirects followed, the size
cap, no key in errors, and litellm left unimported when no target needs it."""

from __future__ import annotations

import base64
import json
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic import ValidationError
from starlette.testclient import TestClient

from kvmem.config import Config
from kvmem.upstream.base import Target
from kvmem.upstream.model_client import (
    ModelClient,
    agent_target,
    chat_target,
    choose_client,
    token_prices,
    uses_litellm,
)
from tests.support.apps import AGENT_MODEL, MAIN_MODEL, sse_events
from tests.support.processes import WATCH_LITELLM_IMPORTS
from tests.support.upstream import Reply, ScriptedUpstream

MODEL_ID = f"openai/{MAIN_MODEL}"


def compact(value: Any) -> bytes:
    """JSON as an upstream (and kvmem) sends it: no spaces."""
    return json.dumps(value, separators=(",", ":")).encode()


# What litellm drops or rewrites: null fields, reasoning_content, the usage details, the
# fingerprint, and fields no library knows.
RICH_COMPLETION = {
    "id": "chatcmpl-rich",
    "object": "chat.completion",
    "created": 1764000000,
    "model": MAIN_MODEL,
    "system_fingerprint": "fp_123",
    "service_tier": "default",
    "x_vendor": {"trace": ["a", 1, None]},
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "Hi",
                "reasoning_content": "think",
                "refusal": None,
                "annotations": [],
                "x_message": True,
            },
            "logprobs": None,
            "finish_reason": "stop",
            "x_choice": 0.5,
        }
    ],
    "usage": {
        "prompt_tokens": 9,
        "completion_tokens": 3,
        "total_tokens": 12,
        "prompt_tokens_details": {"cached_tokens": 4, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 2},
        "x_usage": "kept",
    },
}


def chunk(delta: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-rich",
        "object": "chat.completion.chunk",
        "created": 1764000000,
        "model": MAIN_MODEL,
        "system_fingerprint": "fp_123",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}],
        **extra,
    }


RICH_CHUNKS = [
    chunk({"role": "assistant", "content": "", "reasoning_content": "th"}, x_chunk=1),
    chunk({"content": "Hi", "x_delta": [1]}),
    {**chunk({}), "choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "x_f": None}]},
    {
        "id": "chatcmpl-rich",
        "object": "chat.completion.chunk",
        "created": 1764000000,
        "model": MAIN_MODEL,
        "choices": [],
        "usage": RICH_COMPLETION["usage"],
    },
]
RICH_STREAM = b"".join(b"data: " + compact(event) + b"\n\n" for event in RICH_CHUNKS)


@pytest.fixture
def client(make_client: Callable[..., TestClient], chat_sections: Any) -> TestClient:
    return make_client(**chat_sections(agent={"enabled": False}, chat={"client": "direct"}))


def test_a_completion_reaches_the_client_byte_for_byte(client: TestClient, upstream: Any) -> None:
    upstream.script(MAIN_MODEL, Reply(raw=compact(RICH_COMPLETION)))
    response = client.post(
        "/v1/chat/completions",
        json={"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert (response.status_code, response.content) == (200, compact(RICH_COMPLETION))
    [received] = upstream.received(MAIN_MODEL)
    assert received.headers["authorization"] == "Bearer main-key"


def test_a_stream_reaches_the_client_byte_for_byte(client: TestClient, upstream: Any) -> None:
    # Comments, CRLF line ends and a named event are SSE the parser must read past.
    upstream.script(
        MAIN_MODEL,
        Reply(
            raw=b": keep-alive\r\n\r\n"
            + RICH_STREAM.replace(b"\n\n", b"\r\n\r\n", 1)
            + b"data: [DONE]\n\n"
        ),
    )
    response = client.post(
        "/v1/chat/completions",
        json={
            "model": MODEL_ID,
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
        },
    )
    assert (response.status_code, response.content) == (200, RICH_STREAM + b"data: [DONE]\n\n")
    assert upstream.received(MAIN_MODEL)[0].body["stream"] is True


def test_chat_stores_the_reply_of_a_direct_stream(client: TestClient, upstream: Any) -> None:
    upstream.script(MAIN_MODEL, Reply(raw=RICH_STREAM + b"data: [DONE]\n\n"))
    events = sse_events(client.post("/chat", json={"message": "hi", "stream": True}).text)
    assert [name for name, _ in events] == ["delta", "done"]
    conversation_id = events[-1][1]["conversation_id"]
    stored = client.get(f"/conversations/{conversation_id}").json()["messages"]
    assert [(m["role"], m["content"]) for m in stored] == [("user", "hi"), ("assistant", "Hi")]


def test_an_error_event_mid_stream_ends_the_stream_with_an_error(
    client: TestClient, upstream: Any
) -> None:
    first = chunk({"role": "assistant", "content": "Hi"})
    upstream.script(
        MAIN_MODEL,
        Reply(
            raw=b"data: "
            + compact(first)
            + b"\n\ndata: "
            + compact({"error": {"message": "overloaded, key main-key", "type": "server_error"}})
            + b"\n\n"
        ),
    )
    response = client.post(
        "/v1/chat/completions",
        json={
            "model": MODEL_ID,
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
        },
    )
    assert (response.status_code, response.text) == (
        200,
        (
            "data: " + compact(first).decode() + "\n\n"
            'data: {"error":{"code":"upstream_error","message":"the model call failed: overloaded, '
            'key ***","upstream_status":200,"type":"api_error","param":null}}\n\n'
        ),
    )


def test_a_redirect_is_not_followed(client: TestClient, upstream: Any) -> None:
    elsewhere = ScriptedUpstream().start()
    try:
        upstream.script(
            MAIN_MODEL, Reply(status=307, headers={"Location": f"{elsewhere.url}/chat/completions"})
        )
        response = client.post("/chat", json={"message": "hi"})
        assert (response.status_code, response.json()) == (
            502,
            {
                "error": {
                    "code": "upstream_error",
                    "message": "the model call failed: scripted 307",
                    "upstream_status": 307,
                }
            },
        )
        assert elsewhere.requests == []
    finally:
        elsewhere.stop()


@pytest.fixture
def small_cap(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """A 2 KiB response cap instead of 64 MiB (the same code path, without 64 MiB of test data)."""
    monkeypatch.setattr("kvmem.upstream.direct_client.MAX_RESPONSE_BYTES", 2048)
    yield 2048


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_an_answer_over_the_size_cap_is_cut_off(
    client: TestClient, upstream: Any, small_cap: int, stream: bool
) -> None:
    big = {**RICH_COMPLETION, "x_padding": "x" * small_cap}
    raw = compact(big) if not stream else b"data: " + compact(chunk({"content": "x" * small_cap}))
    upstream.script(MAIN_MODEL, Reply(raw=raw))
    response = client.post("/chat", json={"message": "hi", "stream": stream})
    assert (response.status_code, response.json()) == (
        502,
        {
            "error": {
                "code": "upstream_error",
                "message": f"the model call failed: the answer is larger than {small_cap} bytes",
                "upstream_status": 200,
            }
        },
    )


def test_an_answer_within_the_cap_is_not_cut(
    client: TestClient, upstream: Any, small_cap: int
) -> None:
    upstream.script(MAIN_MODEL, Reply(raw=compact(RICH_COMPLETION)))
    assert len(compact(RICH_COMPLETION)) < small_cap
    response = client.post(
        "/v1/chat/completions",
        json={"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert response.status_code == 200


def test_an_echoed_key_never_reaches_the_client(client: TestClient, upstream: Any) -> None:
    upstream.script(
        MAIN_MODEL,
        Reply(
            status=401,
            error={
                "error": {
                    "message": "Incorrect API key provided: main-key",
                    "type": "invalid_request_error",
                    "code": "invalid_api_key",
                }
            },
        ),
    )
    response = client.post("/chat", json={"message": "hi"})
    assert (response.status_code, response.json()) == (
        502,
        {
            "error": {
                "code": "upstream_error",
                "message": "the model call failed: Incorrect API key provided: ***",
                "upstream_status": 401,
            }
        },
    )


def test_a_refusal_passes_the_upstreams_error_object_on(client: TestClient, upstream: Any) -> None:
    upstream.script(
        MAIN_MODEL,
        Reply(
            status=400,
            error={
                "error": {
                    "message": "maximum context length exceeded",
                    "type": "invalid_request_error",
                    "param": "messages",
                    "code": "context_length_exceeded",
                }
            },
        ),
    )
    response = client.post(
        "/v1/chat/completions",
        json={"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert (response.status_code, response.json()) == (
        400,
        {
            "error": {
                "message": "maximum context length exceeded",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        },
    )


@pytest.mark.parametrize(
    ("mode", "model", "client"),
    [
        ("auto", "openai/gpt-4o", "direct"),
        ("auto", "anthropic/claude-sonnet-4", "litellm"),
        ("auto", "ollama/llama3.1", "litellm"),
        ("direct", "ollama/llama3.1", "direct"),
        ("litellm", "openai/gpt-4o", "litellm"),
    ],
)
def test_which_client_calls_a_model(mode: str, model: str, client: str) -> None:
    assert choose_client(mode, model) == client


def test_a_custom_endpoint_agent_goes_direct_and_litellm_is_then_unneeded() -> None:
    config = Config.model_validate(
        {
            "chat": {"model": "openai/main", "api_base": "http://127.0.0.1:1/v1"},
            "endpoints": {"custom": [{"name": "local", "baseURL": "http://127.0.0.1:2/v1"}]},
            "memory": {"agent": {"provider": "local", "model": "small"}},
        }
    )
    target = agent_target(config)
    assert target is not None
    assert (target.model, target.api_base, target.client) == (
        "openai/small",
        "http://127.0.0.1:2/v1",
        "direct",
    )
    assert uses_litellm(config) is False
    assert (
        uses_litellm(
            config.model_copy(
                update={
                    "chat": config.chat.model_copy(update={"models": ["anthropic/claude-sonnet-4"]})
                }
            )
        )
        is True
    )
    assert chat_target(config.chat).client == "direct"


def test_the_price_map_is_read_without_litellm() -> None:
    assert token_prices("openai/gpt-4o-mini") == (1.5e-07, 6e-07)
    assert token_prices(f"openai/{AGENT_MODEL}") is None


def test_a_direct_only_server_never_imports_litellm(database: Any, database_url: str) -> None:
    """Nor the `mcp` SDK, which only a request to /mcp loads (see test_mcp.py)."""
    script = (
        "import sys\n"
        "from starlette.testclient import TestClient\n"
        "from kvmem.server.app import create_app\n"
        "from kvmem.config import Config\n"
        "config = Config.model_validate({'database': {'url': %r},\n"
        "    'chat': {'model': 'openai/m', 'api_base': 'http://127.0.0.1:1/v1'},\n"
        "    'memory': {'agent': {'provider': 'openai', 'model': 'gpt-4o-mini',\n"
        "                         'api_base': 'http://127.0.0.1:1/v1'}}})\n"
        "with TestClient(create_app(config), base_url='http://127.0.0.1') as client:\n"
        "    assert client.get('/healthz').status_code == 200\n"
        "print(sorted(m for m in sys.modules\n"
        "             if m.split('.')[0] in {'litellm', 'mcp', 'mcp_types'}))\n"
    ) % database_url
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False, timeout=120
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, "[]\n", "")


def test_litellm_is_imported_beside_start_up_not_before_it() -> None:
    """The default `ollama/...` model needs litellm (~3 s of imports): the client starts its
    import in a thread, so `kvmem serve` is ready without waiting for it; a direct-only
    config starts no such thread."""
    script = WATCH_LITELLM_IMPORTS + (
        "from kvmem.config import Config\n"
        "from kvmem.upstream.model_client import ModelClient\n"
        "direct = ModelClient.from_config(Config.model_validate(\n"
        "    {'chat': {'model': 'openai/m', 'api_base': 'http://127.0.0.1:1/v1'}}))\n"
        "assert direct.preloading is None and Watch.seen == []\n"
        "client = ModelClient.from_config(Config.model_validate({}))\n"
        "assert client.preloading is not None\n"
        "client.preloading.join(120)\n"
        "print(Watch.seen, 'litellm' in sys.modules, client.litellm() is client.litellm())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False, timeout=180
    )
    assert (result.returncode, result.stdout, result.stderr) == (
        0,
        "['kvmem-litellm'] True True\n",
        "",
    )


def test_a_request_waits_for_litellm_s_import_without_blocking_the_event_loop() -> None:
    """A request that needs litellm while the start-up import is still under way waits for
    it in a worker thread: the loop serves other requests meanwhile, and the call's own
    timeout starts only once the import has ended (a blocked loop ate a 'hang' test's
    timeout before the request was sent)."""
    client = ModelClient()
    imported = threading.Event()
    client.preloading = threading.Thread(target=imported.wait, args=(10,), daemon=True)
    client.preloading.start()
    order: list[str] = []

    async def main() -> None:
        async def other_request() -> None:
            await anyio.sleep(0.05)
            order.append("loop served")
            imported.set()

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(other_request)
            chosen = await client._after_import(Target(model="ollama/m", client="litellm"))
            order.append("litellm client")
            assert chosen is client.litellm()

    anyio.run(main)
    assert order == ["loop served", "litellm client"]


def test_an_unknown_client_is_a_config_error() -> None:
    with pytest.raises(ValidationError) as caught:
        Config.model_validate({"chat": {"client": "fast"}})
    assert [(error["loc"], error["type"]) for error in caught.value.errors()] == [
        (("chat", "client"), "literal_error")
    ]


def test_without_a_configured_key_the_environments_openai_key_is_sent_and_scrubbed(
    make_client: Callable[..., TestClient],
    chat_sections: Any,
    upstream: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Like the OpenAI SDK and litellm, the direct client falls back to OPENAI_API_KEY (the
    README's quick start relies on it), and an upstream echoing it never shows it."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-the-environment-123")
    sections = chat_sections(agent={"enabled": False}, chat={"client": "direct"})
    del sections["chat"]["api_key"]
    client = make_client(**sections)
    upstream.script(
        MAIN_MODEL,
        Reply(content="hi"),
        Reply(
            status=401,
            error={"error": {"message": "Incorrect API key provided: sk-from-the-environment-123"}},
        ),
    )
    body = {"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}]}

    assert client.post("/v1/chat/completions", json=body).status_code == 200
    received = upstream.received(MAIN_MODEL)[0]
    assert received.headers["authorization"] == "Bearer sk-from-the-environment-123"

    refused = client.post("/v1/chat/completions", json=body)
    assert refused.status_code == 502
    assert "sk-from-the-environment-123" not in refused.text
    assert "Incorrect API key provided: ***" in refused.json()["error"]["message"]


def test_the_environments_proxy_carries_the_call_unless_no_proxy_exempts_its_host(
    make_client: Callable[..., TestClient],
    chat_sections: Any,
    upstream: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """HTTP_PROXY/HTTPS_PROXY and NO_PROXY apply, as for httpx, the OpenAI SDK and litellm.
    The scripted upstream stands in for the proxy: it answers whatever URL it is asked for."""
    proxy = upstream.url.removesuffix("/v1")
    for name in ("no_proxy", "NO_PROXY", "https_proxy", "HTTPS_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("http_proxy", proxy)
    monkeypatch.setenv("HTTP_PROXY", proxy)
    sections = chat_sections(
        agent={"enabled": False},
        chat={"client": "direct", "api_base": "http://upstream.invalid/v1"},
    )
    body = {"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}]}

    assert make_client(**sections).post("/v1/chat/completions", json=body).status_code == 200
    assert upstream.received(MAIN_MODEL)[0].headers["host"] == "upstream.invalid"

    monkeypatch.setenv("no_proxy", "upstream.invalid")
    monkeypatch.setenv("NO_PROXY", "upstream.invalid")
    exempt = make_client(**sections).post("/v1/chat/completions", json=body)
    assert exempt.status_code == 502  # straight to a host that does not exist
    assert len(upstream.received(MAIN_MODEL)) == 1


def test_credentials_in_the_base_url_are_sent_as_basic_auth_and_never_quoted(
    make_client: Callable[..., TestClient],
    chat_sections: Any,
    upstream: Any,
) -> None:
    """As httpx: the URL's user:password become the Authorization header (instead of the
    key); an answer that is not HTTP fails without quoting the URL."""
    with socket.create_server(("127.0.0.1", 0)) as garbage:
        port = garbage.getsockname()[1]
        credentialed = upstream.url.replace("http://", "http://ops:pa%40ss@")
        client = make_client(
            **chat_sections(
                agent={"enabled": False}, chat={"client": "direct", "api_base": credentialed}
            )
        )
        body = {"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}]}
        assert client.post("/v1/chat/completions", json=body).status_code == 200
        assert upstream.received(MAIN_MODEL)[0].headers["authorization"] == (
            "Basic " + base64.b64encode(b"ops:pa@ss").decode()
        )

        def answer_garbage() -> None:
            connection, _ = garbage.accept()
            with connection:
                connection.recv(65536)
                connection.sendall(b"NOT HTTP AT ALL\r\n\r\n")

        threading.Thread(target=answer_garbage, daemon=True).start()
        broken = make_client(
            **chat_sections(
                agent={"enabled": False},
                chat={"client": "direct", "api_base": f"http://ops:pa%40ss@127.0.0.1:{port}/v1"},
            )
        )
        refused = broken.post("/v1/chat/completions", json=body)
    assert refused.status_code == 502
    assert refused.json()["error"]["message"].startswith("the model call failed: ")
    assert "pa@ss" not in refused.text and "pa%40ss" not in refused.text


def test_one_tls_context_per_process_for_the_same_certificate_settings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Every client shares the context its settings give (reading the CA bundle is ~20 ms of
    CPU each time); SSL_CERT_FILE still chooses the certificates, as httpx's would."""
    import certifi

    from kvmem.upstream.direct_client import tls_context

    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    default = tls_context()
    assert tls_context() is default
    assert (default.verify_mode, default.check_hostname) == (ssl.CERT_REQUIRED, True)
    assert default.cert_store_stats()["x509_ca"] > 100  # certifi's bundle

    first = Path(certifi.where()).read_text().split("-----END CERTIFICATE-----")[0]
    one = tmp_path / "one.pem"
    one.write_text(first + "-----END CERTIFICATE-----\n")
    monkeypatch.setenv("SSL_CERT_FILE", str(one))
    chosen = tls_context()
    assert tls_context() is chosen
    assert chosen.cert_store_stats()["x509_ca"] == 1
