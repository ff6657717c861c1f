"""What black-box probing broke (issue 16), one section per item: each test failed on the code
before the fix. Database tests run on both backends; transport tests use real sockets
against a real server (`kvmem serve`, or uvicorn with kvmem's HTTP protocol)."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from kvmem.db.engine import Database
from kvmem.server.credentials import KeyStore
from tests.support.apps import (
    AGENT_MODEL,
    MAIN_MODEL,
    LiveServer,
    wait_agents_idle,
)
from tests.support.processes import ServeProcess
from tests.support.upstream import Reply, ScriptedUpstream

# One `kvmem serve` for the module: its tests stay on one worker.
pytestmark = pytest.mark.xdist_group("hardening")

MakeClient = Callable[..., TestClient]
COMPLETION = {"model": f"openai/{MAIN_MODEL}", "messages": [{"role": "user", "content": "hi"}]}


def error(path: str, code: str, message: str, **details: Any) -> dict[str, Any]:
    """kvmem's error body for `path` (OpenAI's `type` and `param` under /v1)."""
    body: dict[str, Any] = {"code": code, "message": message, **details}
    if path.startswith("/v1/"):
        body.setdefault(
            "type", "invalid_request_error" if code != "upstream_error" else "api_error"
        )
        body.setdefault("param", None)
    return {"error": body}


def nothing_changed(client: TestClient, upstream: ScriptedUpstream) -> None:
    """No entry, no conversation, the switch untouched, and no model called."""
    listing = client.get("/memory").json()
    assert (listing["memories"], listing["total_tokens"]) == ([], 0)
    assert client.get("/conversations").json() == {"conversations": [], "next": None}
    assert client.get("/preferences").json() == {"memories": True, "review": False}
    assert upstream.requests == []


def exchange(port: int, request: bytes, dribble: bytes = b"", every: float = 0.0) -> bytes:
    """Send `request` on a raw socket, then `dribble` a byte each `every` seconds (in a
    thread, so an answer sent before it is all written is still read); return every byte
    the server answers until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:

        def send() -> None:
            try:
                sock.sendall(request)
                for byte in dribble:
                    time.sleep(every)
                    sock.sendall(bytes([byte]))
            except OSError:
                pass  # the server refused and closed: its answer is what the test reads

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        answer = b""
        while True:
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                break
            if not data:
                break
            answer += data
    return answer


def parse_answer(answer: bytes) -> tuple[str, dict[str, str], Any]:
    """A raw HTTP answer as (status line, headers, JSON body)."""
    head, _, body = answer.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value for name, value in (line.split(": ", 1) for line in lines)}
    return status, headers, json.loads(body)


# --- item 1: a JSON integer of more than 4,300 digits ---------------------------------------

HUGE = b"1" * 5000
HUGE_BODIES = [
    ("PUT", "/memory/k", b'{"value": ' + HUGE + b"}"),
    ("POST", "/chat", b'{"message": "hi", "max_turns": ' + HUGE + b"}"),
    ("PATCH", "/preferences", b'{"memories": ' + HUGE + b"}"),
    (
        "POST",
        "/v1/chat/completions",
        b'{"model": "openai/main-model", "messages": [{"role": "user", "content": "hi"}], "seed": '
        + HUGE
        + b"}",
    ),
]


@pytest.mark.parametrize(
    ("method", "path", "content"),
    HUGE_BODIES,
    ids=["put", "chat-max-turns", "preferences", "completions-seed"],
)
def test_item1_huge_json_integer_is_400_on_every_body_route(
    make_client: MakeClient,
    chat_sections: Any,
    upstream: ScriptedUpstream,
    method: str,
    path: str,
    content: bytes,
) -> None:
    client = make_client(**chat_sections())
    response = client.request(method, path, content=content)
    assert (response.status_code, response.json()) == (
        400,
        error(path, "bad_request", "the JSON body holds an integer of more than 4300 digits"),
    )
    nothing_changed(client, upstream)


# --- item 2: secrets echoed by an upstream are scrubbed -------------------------------------

MAIN_KEY = "sk-main-SECRET-1111"
MAIN_HEADER = "hdr-main-SECRET-2222"
AGENT_KEY = "sk-agent-SECRET-3333"
ENDPOINT_KEY = "sk-endpoint-SECRET-4444"
ENDPOINT_HEADER = "hdr-endpoint-SECRET-5555"
FRONT_END_SERVICE_KEY = "svc-SECRET-6666"
ALL_SECRETS = [
    MAIN_KEY,
    MAIN_HEADER,
    AGENT_KEY,
    ENDPOINT_KEY,
    ENDPOINT_HEADER,
    FRONT_END_SERVICE_KEY,
]


def secret_sections(
    upstream: ScriptedUpstream, agent_via_endpoint: bool, client: str = "auto"
) -> dict[str, Any]:
    """Main model and agent on the scripted upstream, with keys and header secrets: the
    agent through the custom endpoint (its apiKey and headers), or with its own api_key;
    a service key too (a front end's, which an upstream behind it may echo); `client` is
    `chat.client` (the conftest's `chat_client`)."""
    agent: dict[str, Any] = {"model": AGENT_MODEL, "grace_seconds": 3}
    if agent_via_endpoint:
        agent["provider"] = "Gateway"
    else:
        agent.update(provider="openai", api_base=upstream.url, api_key=AGENT_KEY)
    return {
        "auth": {"service_keys": [FRONT_END_SERVICE_KEY]},
        "chat": {
            "model": f"openai/{MAIN_MODEL}",
            "api_base": upstream.url,
            "api_key": MAIN_KEY,
            "headers": {"X-Gateway-Key": MAIN_HEADER},
            "timeout": 10,
            "client": client,
        },
        "memory": {"agent": agent},
        "endpoints": {
            "custom": [
                {
                    "name": "Gateway",
                    "baseURL": upstream.url,
                    "apiKey": ENDPOINT_KEY,
                    # The text around a placeholder is the secret; the user id it becomes is not.
                    "headers": {"X-Gateway-Key": ENDPOINT_HEADER + "-{{LIBRECHAT_USER_ID}}"},
                }
            ]
        },
    }


def failed(client: str, kind: str, text: str) -> str:
    """kvmem's message for an upstream failure with `text`: through litellm, the text
    starts with litellm's exception class; the direct client passes the text alone."""
    prefix = f"{kind}: OpenAIException - " if client == "litellm" else ""
    return f"the model call failed: {prefix}{text}"


def echo(agent_via_endpoint: bool) -> tuple[str, str]:
    """What an upstream echoing every configured secret says, and that text scrubbed."""
    said = [
        MAIN_KEY,
        MAIN_HEADER,
        ENDPOINT_KEY,
        f"{ENDPOINT_HEADER}-local",
        FRONT_END_SERVICE_KEY,
    ]
    scrubbed = ["***", "***", "***", "***local", "***"]
    if not agent_via_endpoint:
        said.append(AGENT_KEY)
        scrubbed.append("***")
    return (
        f"Incorrect API key provided: {', '.join(said)}",
        f"Incorrect API key provided: {', '.join(scrubbed)}",
    )


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("path", ["/chat", "/v1/chat/completions"])
def test_item2_an_upstream_error_echoing_a_secret_is_scrubbed(
    make_client: MakeClient, upstream: ScriptedUpstream, path: str, stream: bool, chat_client: str
) -> None:
    client = make_client(**secret_sections(upstream, agent_via_endpoint=False, client=chat_client))
    said, scrubbed = echo(agent_via_endpoint=False)
    upstream.script(MAIN_MODEL, Reply(status=500, error={"error": {"message": said}}))
    upstream.default(AGENT_MODEL, Reply(content=None))
    body = {"message": "hi"} if path == "/chat" else COMPLETION
    response = client.post(path, json={**body, "stream": stream})
    assert (response.status_code, response.json()) == (
        502,
        error(
            path,
            "upstream_error",
            failed(chat_client, "InternalServerError", scrubbed),
            upstream_status=500,
        ),
    )
    sent = upstream.received(MAIN_MODEL)[0].headers
    assert (sent["authorization"], sent["x-gateway-key"]) == (f"Bearer {MAIN_KEY}", MAIN_HEADER)


@pytest.mark.parametrize("path", ["/chat", "/v1/chat/completions"])
def test_item2_an_upstream_refusal_echoing_a_secret_is_scrubbed(
    make_client: MakeClient, upstream: ScriptedUpstream, path: str, chat_client: str
) -> None:
    """The same for an upstream 400 that is passed through (item 7), its object included."""
    client = make_client(**secret_sections(upstream, agent_via_endpoint=False, client=chat_client))
    said, scrubbed = echo(agent_via_endpoint=False)
    upstream.script(
        MAIN_MODEL,
        Reply(
            status=400,
            error={
                "error": {
                    "message": said,
                    "type": "invalid_request_error",
                    "param": None,
                    "code": "invalid_api_key",
                }
            },
        ),
    )
    upstream.default(AGENT_MODEL, Reply(content=None))
    body = {"message": "hi"} if path == "/chat" else COMPLETION
    response = client.post(path, json=body)
    expected = (
        {
            "error": {
                "code": "upstream_rejected",
                "message": f"the model refused the request: {scrubbed}",
            }
        }
        if path == "/chat"
        else {
            "error": {
                "code": "invalid_api_key",
                "message": scrubbed,
                "type": "invalid_request_error",
                "param": None,
            }
        }
    )
    assert (response.status_code, response.json()) == (400, expected)


@pytest.mark.parametrize("via_endpoint", [False, True], ids=["agent-key", "custom-endpoint"])
def test_item2_the_agent_failure_log_holds_no_secret(
    make_client: MakeClient,
    upstream: ScriptedUpstream,
    caplog: pytest.LogCaptureFixture,
    via_endpoint: bool,
    chat_client: str,
) -> None:
    caplog.set_level(logging.INFO)
    client = make_client(
        **secret_sections(upstream, agent_via_endpoint=via_endpoint, client=chat_client)
    )
    said, scrubbed = echo(via_endpoint)
    upstream.script(AGENT_MODEL, Reply(status=401, error={"error": {"message": said}}))
    response = client.post("/chat", json={"message": "remember that I like tea"})
    assert response.status_code == 200
    wait_agents_idle(client)
    conversation = response.json()["conversation_id"]
    failures = [r.getMessage() for r in caplog.records if r.name == "kvmem.agent"]
    assert failures == [
        f"memory agent failed: user=local conversation={conversation}: "
        + failed(chat_client, "AuthenticationError", scrubbed)
    ]
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert [secret for secret in ALL_SECRETS if secret in logged] == []
    sent = upstream.received(AGENT_MODEL)[0].headers
    if via_endpoint:
        assert (sent["authorization"], sent["x-gateway-key"]) == (
            f"Bearer {ENDPOINT_KEY}",
            f"{ENDPOINT_HEADER}-local",
        )
    else:
        assert sent["authorization"] == f"Bearer {AGENT_KEY}"


# --- item 3: the request head is bounded at the socket --------------------------------------

HEAD_LIMIT = 8192


@pytest.fixture(scope="module")
def kvmem_serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """A real `kvmem serve` (its own SQLite file) with an 8 KiB bound on request heads. Its
    chat model goes the direct path: the default (`ollama/...`) would import litellm in a
    thread beside start-up, ~80 MiB that a memory measurement could catch mid-way."""
    folder = tmp_path_factory.mktemp("serve")
    process = ServeProcess(
        folder,
        {
            "server": {"max_header_bytes": HEAD_LIMIT},
            "database": {"url": f"sqlite:///{folder / 'kvmem.db'}"},
            "chat": {"model": "openai/unused", "api_base": "http://127.0.0.1:9/v1"},
        },
    ).start()
    yield process
    process.stop()


def rss_kib(pid: int) -> int:
    """The resident memory of process `pid`, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_item3_a_16_mib_header_is_431_from_kvmem_serve_without_buffering_it(
    kvmem_serve: ServeProcess,
) -> None:
    assert kvmem_serve.process is not None
    # The server loads its tokenizer (~50 MiB) in a thread after it is ready; a write waits
    # for it, so the baseline below is taken with the tokenizer in memory, however slow the
    # machine (measured before it, a loaded machine saw the load as growth).
    written = httpx.put(f"{kvmem_serve.url}/memory/baseline", json={"value": "x"}, timeout=30)
    assert written.status_code in (200, 201), written.text
    before = rss_kib(kvmem_serve.process.pid)
    request = (
        b"GET /memory HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: "
        + b"a" * (16 * 1024 * 1024)
        + b"\r\n\r\n"
    )
    answers = [b""] * 10

    def one(index: int) -> None:
        answers[index] = exchange(kvmem_serve.port, request)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    grown_mib = (rss_kib(kvmem_serve.process.pid) - before) / 1024
    for answer in answers:
        status, headers, body = parse_answer(answer)
        assert (status, headers["content-type"], headers["connection"], body) == (
            "HTTP/1.1 431 Request Header Fields Too Large",
            "application/json",
            "close",
            {
                "error": {
                    "code": "headers_too_large",
                    "message": f"the request line and headers are over the limit of {HEAD_LIMIT} bytes",
                }
            },
        )
    # Ten 16 MiB heads used to grow the server by ~130 MiB; now each holds at most the limit
    # plus one socket read.
    assert grown_mib < 40, f"the server grew by {grown_mib:.0f} MiB"
    assert httpx.get(f"{kvmem_serve.url}/memory", headers={"X-Pad": "a" * 7000}).status_code == 200


def test_item3_a_head_just_over_the_limit_is_431_and_one_under_is_served(
    kvmem_serve: ServeProcess,
) -> None:
    base = b"GET /memory HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nX-Pad: "
    # The bound counts the request line and header lines as sent, without the final CRLF.
    overhead = len(b"GET /memory HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nX-Pad: \r\n")
    fits = exchange(kvmem_serve.port, base + b"a" * (HEAD_LIMIT - overhead) + b"\r\n\r\n")
    over = exchange(kvmem_serve.port, base + b"a" * (HEAD_LIMIT - overhead + 1) + b"\r\n\r\n")
    assert parse_answer(fits)[0] == "HTTP/1.1 200 OK"
    assert parse_answer(over)[0] == "HTTP/1.1 431 Request Header Fields Too Large"


# --- item 4: stale keep-alive connections to the upstream -----------------------------------

UPSTREAM_KEEPALIVE = 5.0


@pytest.fixture
def idle_dropping_upstream() -> Iterator[ScriptedUpstream]:
    """An upstream that ends connections idle for 5 s (uvicorn's and vLLM's keep-alive), and
    resets a request that arrives on one idle longer than that: the keep-alive race, certain."""
    server = ScriptedUpstream(
        keepalive_seconds=UPSTREAM_KEEPALIVE, drop_idle_after=UPSTREAM_KEEPALIVE
    ).start()
    yield server
    server.stop()


def test_item4_bursts_after_a_pause_longer_than_the_upstream_keepalive_never_fail(
    make_server: Callable[..., LiveServer],
    idle_dropping_upstream: ScriptedUpstream,
    chat_client: str,
) -> None:
    upstream = idle_dropping_upstream
    # Main model and agent share one key, so they share litellm's pooled client.
    server = make_server(
        chat={
            "model": f"openai/{MAIN_MODEL}",
            "api_base": upstream.url,
            "api_key": "shared",
            "timeout": 10,
            "client": chat_client,
        },
        memory={
            "agent": {
                "provider": "openai",
                "model": AGENT_MODEL,
                "api_base": upstream.url,
                "api_key": "shared",
            }
        },
    )
    upstream.default(AGENT_MODEL, Reply(content=None))

    async def bursts() -> list[list[int]]:
        statuses = []
        limits = httpx.Limits(max_connections=16)
        async with httpx.AsyncClient(base_url=server.url, timeout=30, limits=limits) as http:
            for burst in range(3):
                if burst:
                    await asyncio.sleep(UPSTREAM_KEEPALIVE + 0.3)
                replies = await asyncio.gather(
                    *(http.post("/v1/chat/completions", json=COMPLETION) for _ in range(16))
                )
                statuses.append([reply.status_code for reply in replies])
        return statuses

    assert asyncio.run(bursts()) == [[200] * 16] * 3
    assert upstream.dropped == 0  # no request was sent on a connection the upstream dropped


# --- item 5: control and invisible characters never reach the model raw ---------------------

INVISIBLE = "\x7f\x80\x9b\u200b\u200f\u202e\u2066\u2069\u2060\ufeff\U000e0041\U000e007f"


def test_item5_del_c1_and_invisible_format_characters_are_escaped_in_the_block(
    make_client: MakeClient, chat_sections: Any, upstream: ScriptedUpstream
) -> None:
    client = make_client(**chat_sections(agent={"enabled": False}))
    assert client.put("/memory/note", json={"value": f"a{INVISIBLE}b"}).status_code == 201
    assert client.post("/chat", json={"message": "hi"}).status_code == 200
    system = upstream.received(MAIN_MODEL)[0].system
    line = next(line for line in system.splitlines() if "note: " in line)
    assert line.split("note: ", 1)[1] == (
        "a\\u007f\\u0080\\u009b\\u200b\\u200f\\u202e\\u2066\\u2069\\u2060\\ufeff"
        "\\udb40\\udc41\\udb40\\udc7fb"
    )
    assert [c for c in system if c in INVISIBLE] == []


# --- item 6: no redirect to a host the client named -----------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("PUT", "/memory/abc/"),
        ("GET", "/memory/"),
        ("GET", "/preferences/"),
        ("POST", "/chat/"),
        ("GET", "/v1/models/"),
    ],
)
def test_item6_a_trailing_slash_is_404_never_a_redirect(
    make_client: MakeClient, method: str, path: str
) -> None:
    # Any Host reaches the routes here (a proxy's name, say), so the one a client names
    # could end up in a Location.
    client = make_client(server={"allowed_hosts": ["*"]})
    response = client.request(
        method, path, json={"value": "v"}, follow_redirects=False, headers={"Host": "evil.example"}
    )
    assert (response.status_code, response.json()) == (
        404,
        error(path, "not_found", f"no route {method} {path}"),
    )
    assert "location" not in response.headers
    assert client.get("/memory").json()["memories"] == []


# --- item 7: the upstream's refusals keep their status --------------------------------------

CONTEXT = "This model's maximum context length is 8192 tokens. However, you requested 9000 tokens."
UPSTREAM_REFUSAL = {
    "message": CONTEXT,
    "type": "invalid_request_error",
    "param": "messages",
    "code": "context_length_exceeded",
}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("status", [400, 413, 422])
def test_item7_an_upstream_4xx_refusal_keeps_its_status_and_object_on_v1(
    make_client: MakeClient,
    chat_sections: Any,
    upstream: ScriptedUpstream,
    status: int,
    stream: bool,
) -> None:
    client = make_client(**chat_sections(agent={"enabled": False}))
    upstream.script(MAIN_MODEL, Reply(status=status, error={"error": UPSTREAM_REFUSAL}))
    response = client.post("/v1/chat/completions", json={**COMPLETION, "stream": stream})
    assert (response.status_code, response.json()) == (status, {"error": UPSTREAM_REFUSAL})


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_item7_a_context_length_refusal_is_400_on_chat_and_stores_nothing(
    make_client: MakeClient, chat_sections: Any, upstream: ScriptedUpstream, stream: bool
) -> None:
    client = make_client(**chat_sections(agent={"enabled": False}))
    upstream.script(MAIN_MODEL, Reply(status=400, error={"error": UPSTREAM_REFUSAL}))
    response = client.post("/chat", json={"message": "a very long message", "stream": stream})
    assert (response.status_code, response.json()) == (
        400,
        {
            "error": {
                "code": "upstream_rejected",
                "message": f"the model refused the request: {CONTEXT}",
            }
        },
    )
    assert client.get("/conversations").json() == {"conversations": [], "next": None}


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (401, "AuthenticationError"),
        (403, "APIError"),
        (404, "NotFoundError"),
        (500, "InternalServerError"),
    ],
)
def test_item7_the_operators_faults_and_upstream_failures_stay_502(
    make_client: MakeClient,
    chat_sections: Any,
    upstream: ScriptedUpstream,
    status: int,
    kind: str,
    chat_client: str,
) -> None:
    """401/403: kvmem's own credentials were refused; 404: a model kvmem is configured with
    is missing; 5xx: the upstream failed. None is the client's to fix."""
    client = make_client(**chat_sections(agent={"enabled": False}))
    upstream.script(MAIN_MODEL, Reply(status=status, error={"error": {"message": "no"}}))
    response = client.post("/v1/chat/completions", json=COMPLETION)
    assert (response.status_code, response.json()) == (
        502,
        error("/v1/", "upstream_error", failed(chat_client, kind, "no"), upstream_status=status),
    )


# --- item 8: the HTTP parser's own refusals -------------------------------------------------

MALFORMED = [
    ("nul-in-header", b"GET /memory HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: a\x00b\r\n\r\n"),
    ("bare-lf", b"GET /memory HTTP/1.1\r\nHost: 127.0.0.1\nX-A: b\r\n\r\n"),
    (
        "length-and-chunked",
        b"PUT /memory/k HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 13\r\nTransfer-Encoding: chunked\r\n\r\n"
        b'd\r\n{"value":"v"}\r\n0\r\n\r\n',
    ),
    (
        "length-and-chunked-v1",
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    ),
]


@pytest.mark.parametrize(("kind", "request_bytes"), MALFORMED, ids=[k for k, _ in MALFORMED])
def test_item8_requests_the_http_parser_refuses_get_kvmems_error_shape(
    kvmem_serve: ServeProcess, kind: str, request_bytes: bytes
) -> None:
    status, headers, body = parse_answer(exchange(kvmem_serve.port, request_bytes))
    path = "/v1/" if kind.endswith("v1") else "/memory"
    assert (status, headers["content-type"], headers["connection"], body) == (
        "HTTP/1.1 400 Bad Request",
        "application/json",
        "close",
        error(
            path,
            "bad_request",
            "malformed HTTP request: the request line or headers could not be parsed",
        ),
    )
    assert httpx.get(f"{kvmem_serve.url}/memory/k").status_code == 404  # nothing was written


# --- item 9: a body must arrive within server.body_timeout_seconds --------------------------


@pytest.mark.parametrize("path", ["/memory/k", "/v1/chat/completions"])
def test_item9_a_body_dribbled_past_the_timeout_is_408_and_writes_nothing(
    make_server: Callable[..., LiveServer], path: str
) -> None:
    server = make_server(server={"body_timeout_seconds": 1})
    method = "PUT" if path.startswith("/memory") else "POST"
    body = json.dumps({"value": "v"} if method == "PUT" else COMPLETION).encode()
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    started = time.monotonic()
    # One byte every 0.2 s: the whole body would take far longer than the 1 s allowed.
    answer = exchange(server.port, head, dribble=body, every=0.2)
    elapsed = time.monotonic() - started
    status, headers, error_body = parse_answer(answer)
    assert (status, headers["connection"], error_body) == (
        "HTTP/1.1 408 Request Timeout",
        "close",
        error(
            path,
            "request_timeout",
            "the request body did not arrive within 1 s (server.body_timeout_seconds)",
        ),
    )
    assert 1 <= elapsed < 15
    assert httpx.get(f"{server.url}/memory").json()["memories"] == []


def test_item9_a_body_within_the_timeout_is_read_whole(
    make_server: Callable[..., LiveServer],
) -> None:
    server = make_server(server={"body_timeout_seconds": 10})
    body = b'{"value": "v"}'
    head = (
        f"PUT /memory/k HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    answer = exchange(server.port, head, dribble=body, every=0.01)
    assert parse_answer(answer)[0] == "HTTP/1.1 201 Created"


# --- item 10: user ids are case-sensitive ---------------------------------------------------


SERVICE_KEY = "svc-hardening-key"


def test_item10_user_ids_are_case_sensitive(make_client: MakeClient, database: Database) -> None:
    client = make_client(auth={"mode": "keys", "service_keys": [SERVICE_KEY]})
    service = {"Authorization": f"Bearer {SERVICE_KEY}"}
    assert (
        client.put(
            "/memory/name", json={"value": "Alice"}, headers={**service, "X-User-Id": "Alice"}
        ).status_code
        == 201
    )
    lower = client.get("/memory", headers={**service, "X-User-Id": "alice"}).json()
    upper = client.get("/memory", headers={**service, "X-User-Id": "Alice"}).json()
    assert (lower["memories"], [m["value"] for m in upper["memories"]]) == ([], ["Alice"])
    _, alice_key = KeyStore(database).create("alice")
    as_alice = {"Authorization": f"Bearer {alice_key}"}
    refused = client.get("/memory", headers={**as_alice, "X-User-Id": "Alice"})
    assert refused.status_code == 403
    assert client.get("/memory", headers=as_alice).json()["memories"] == []
