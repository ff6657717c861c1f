"""Bad input on every route that takes a body, a path or headers: each gets its error code,
nothing is written, no model is called, and the server keeps serving. The memory agent's
input stays within maxInputTokens whatever the message size."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from kvmem.db.engine import Database
from kvmem.errors import InvalidKey, MemoryFull
from kvmem.memory.store import MemoryStore
from kvmem.server.credentials import KeyStore
from kvmem.tokens import TokenCounter
from tests.support.apps import AGENT_MODEL, MAIN_MODEL, LiveServer, wait_agents_idle
from tests.support.upstream import Reply

MakeClient = Callable[..., TestClient]
COMPLETION = {"model": f"openai/{MAIN_MODEL}", "messages": [{"role": "user", "content": "hi"}]}
# Every route that reads a body, with a body it would accept.
BODY_ROUTES = [
    ("PUT", "/memory/k", {"value": "v"}),
    ("PATCH", "/preferences", {"memories": False}),
    ("POST", "/chat", {"message": "hi"}),
    ("POST", "/v1/chat/completions", COMPLETION),
    (
        "POST",
        "/api/chat",
        {"model": f"openai/{MAIN_MODEL}", "messages": [{"role": "user", "content": "hi"}]},
    ),
    ("POST", "/api/generate", {"model": f"openai/{MAIN_MODEL}", "prompt": "hi"}),
    ("POST", "/api/show", {"model": f"openai/{MAIN_MODEL}"}),
]
ROUTE_IDS = [
    "put",
    "preferences",
    "chat",
    "completions",
    "ollama-chat",
    "ollama-generate",
    "ollama-show",
]


class AnyString:
    """Equal to any string (for messages the fix will word)."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and other != ""

    def __repr__(self) -> str:
        return "<any message>"


ANY_MESSAGE: Any = AnyString()


def error(path: str, code: str, message: Any, **details: Any) -> dict[str, Any]:
    """The error body for `path` (OpenAI's `type` and `param` under /v1; Ollama's
    `{"error": message}` under /api)."""
    if path.startswith("/api/"):
        return {"error": message}
    body = {"code": code, "message": message, **details}
    if path.startswith("/v1/"):
        body.setdefault("type", "invalid_request_error")
        body.setdefault("param", None)
    return {"error": body}


def nothing_changed(client: TestClient, upstream: Any) -> None:
    """No entry, no conversation, the switch untouched, and no model called."""
    listing = client.get("/memory").json()
    assert (listing["memories"], listing["total_tokens"]) == ([], 0)
    assert client.get("/conversations").json() == {"conversations": [], "next": None}
    assert client.get("/preferences").json() == {"memories": True, "review": False}
    assert upstream.requests == []


@pytest.fixture
def client(make_client: MakeClient, chat_sections: Any) -> TestClient:
    return make_client(**chat_sections(server={"max_body_bytes": 1000}))


# --- size ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path", "good"), BODY_ROUTES, ids=ROUTE_IDS)
def test_a_body_over_the_limit_is_413_declared_or_chunked(
    client: TestClient, upstream: Any, method: str, path: str, good: dict[str, Any]
) -> None:
    padded = {**good, "pad": "x" * 2000} if path.startswith("/v1/") else None
    declared = json.dumps(padded or {**good, next(iter(good)): "x" * 2000}).encode()

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(declared), 300):
            yield declared[start : start + 300]

    first = client.request(method, path, content=declared)
    second = client.request(method, path, content=chunks())
    assert (first.status_code, first.json()) == (
        413,
        error(
            path, "body_too_large", f"the request body is {len(declared)} bytes; the limit is 1000"
        ),
    )
    assert (second.status_code, second.json()) == (
        413,
        error(path, "body_too_large", "the request body is over the limit of 1000 bytes"),
    )
    nothing_changed(client, upstream)


def test_a_10_mb_value_is_413_by_default_and_422_under_a_raised_limit(
    make_client: MakeClient, upstream: Any
) -> None:
    value = "x" * (10 * 1024 * 1024)
    default = make_client()
    refused = default.put("/memory/k", json={"value": value})
    assert (refused.status_code, refused.json()) == (
        413,
        error(
            "/memory/k",
            "body_too_large",
            "the request body is 10485772 bytes; the limit is 1048576",
        ),
    )
    raised = make_client(server={"max_body_bytes": 11 * 1024 * 1024})
    too_long = raised.put("/memory/k", json={"value": value})
    assert (too_long.status_code, too_long.json()) == (
        422,
        error(
            "/memory/k",
            "value_too_long",
            "the value is 10485760 characters; the limit is 10000",
            char_limit=10000,
            length=10485760,
        ),
    )
    for client in (default, raised):
        assert client.get("/memory").json()["memories"] == []


# --- shape and encoding ---------------------------------------------------------------------

DEEP = [
    ("arrays", b"[" * 100_000),
    ("objects", b'{"a":' * 100_000),
]


@pytest.mark.parametrize(("method", "path", "good"), BODY_ROUTES, ids=ROUTE_IDS)
@pytest.mark.parametrize(("kind", "content"), DEEP, ids=[k for k, _ in DEEP])
def test_deeply_nested_json_is_400(
    make_client: MakeClient,
    chat_sections: Any,
    upstream: Any,
    method: str,
    path: str,
    good: Any,
    kind: str,
    content: bytes,
) -> None:
    client = make_client(**chat_sections())
    response = client.request(method, path, content=content)
    assert (response.status_code, response.json()) == (
        400,
        error(path, "bad_request", "the JSON body is nested too deeply"),
    )
    nothing_changed(client, upstream)


INVALID_UTF8 = [
    ("a stray byte", b"\xff", 13),
    ("an overlong slash", b"\xc0\xaf", 13),
    ("an encoded surrogate", b"\xed\xa0\x80", 13),
    ("a cut sequence", b"\xe2\x82", 13),
]


@pytest.mark.parametrize(("method", "path", "good"), BODY_ROUTES, ids=ROUTE_IDS)
@pytest.mark.parametrize(("kind", "bad", "at"), INVALID_UTF8, ids=[k for k, _, _ in INVALID_UTF8])
def test_invalid_utf8_is_400(
    make_client: MakeClient,
    chat_sections: Any,
    upstream: Any,
    method: str,
    path: str,
    good: Any,
    kind: str,
    bad: bytes,
    at: int,
) -> None:
    client = make_client(**chat_sections())
    content = b'{"message": "' + bad + b'"}'
    response = client.request(method, path, content=content)
    assert (response.status_code, response.json()) == (
        400,
        error(path, "bad_request", f"the body is not valid UTF-8 (byte {at})"),
    )
    nothing_changed(client, upstream)


@pytest.mark.parametrize(
    ("method", "path", "content"),
    [
        ("PUT", "/memory/k", b'{"value": "a\\ud800b"}'),
        ("PUT", "/memory/k", b'{"value": "\\udfff"}'),
        ("PATCH", "/preferences", b'{"memories": true, "\\ud800": 1}'),
        ("POST", "/chat", b'{"message": "hi \\ud83d"}'),
        ("POST", "/chat", b'{"message": "hi", "conversation_id": "\\udc00"}'),
        (
            "POST",
            "/v1/chat/completions",
            b'{"model": "openai/main-model", "messages": [{"role": "user", "content": "\\ud800"}]}',
        ),
        (
            "POST",
            "/api/chat",
            b'{"model": "openai/main-model", "messages": [{"role": "user", "content": "\\ud800"}]}',
        ),
        ("POST", "/api/generate", b'{"model": "openai/main-model", "prompt": "hi \\udc00"}'),
    ],
    ids=[
        "value",
        "value-low-half",
        "preferences-field",
        "chat-message",
        "chat-conversation-id",
        "completions-message",
        "ollama-chat-message",
        "ollama-generate-prompt",
    ],
)
def test_a_lone_surrogate_escape_is_400(
    make_client: MakeClient,
    chat_sections: Any,
    upstream: Any,
    method: str,
    path: str,
    content: bytes,
) -> None:
    """JSON can spell half a UTF-16 pair (`\\ud800`); no UTF-8 text holds it, so it is a bad
    request like invalid UTF-8, refused before any model call or write."""
    client = make_client(**chat_sections())
    response = client.request(method, path, content=content)
    assert (response.status_code, response.json()) == (400, error(path, "bad_request", ANY_MESSAGE))
    nothing_changed(client, upstream)


def test_a_valid_surrogate_pair_escape_is_an_ordinary_character(client: TestClient) -> None:
    response = client.put("/memory/k", content=b'{"value": "smile \\ud83d\\ude00"}')
    assert (response.status_code, response.json()["memory"]["value"]) == (201, "smile \U0001f600")


CHAT_WRONG_TYPES = [
    ({"message": 5}, "message: Input should be a valid string"),
    ({"message": None}, "message: Input should be a valid string"),
    ({"message": ["hi"]}, "message: Input should be a valid string"),
    ({}, "message: Field required"),
    ({"message": "hi", "conversation_id": 7}, "conversation_id: Input should be a valid string"),
    ({"message": "hi", "max_turns": "3"}, "max_turns: Input should be a valid integer"),
    ({"message": "hi", "max_turns": -1}, "max_turns: Input should be greater than or equal to 0"),
    ({"message": "hi", "max_turns": 1.5}, "max_turns: Input should be a valid integer"),
    ({"message": "hi", "max_turns": True}, "max_turns: Input should be a valid integer"),
    ({"message": "hi", "memory": "yes"}, "memory: Input should be a valid boolean"),
    ({"message": "hi", "stream": 1}, "stream: Input should be a valid boolean"),
    ({"message": "hi", "user": "bob"}, "user: Extra inputs are not permitted"),
    (["hi"], "body: Input should be a valid dictionary or instance of ChatRequest"),
    ("hi", "body: Input should be a valid dictionary or instance of ChatRequest"),
    (3, "body: Input should be a valid dictionary or instance of ChatRequest"),
]


@pytest.mark.parametrize(("body", "problem"), CHAT_WRONG_TYPES)
def test_chat_bodies_of_the_wrong_types_are_400(
    client: TestClient, upstream: Any, body: Any, problem: str
) -> None:
    response = client.post("/chat", json=body)
    assert (response.status_code, response.json()) == (
        400,
        error("/chat", "bad_request", f"invalid request body: {problem}"),
    )
    nothing_changed(client, upstream)


COMPLETION_WRONG_TYPES = [
    (["x"], "the body must be a JSON object", None),
    ({"model": 5, "messages": []}, "'model' is required and must be a string", "model"),
    ({**COMPLETION, "messages": []}, "'messages' must be a non-empty array", "messages"),
    ({**COMPLETION, "messages": "hi"}, "'messages' must be a non-empty array", "messages"),
    (
        {**COMPLETION, "messages": [{"content": "x"}]},
        "messages[0] must be an object with a 'role'",
        "messages[0]",
    ),
    (
        {**COMPLETION, "messages": [{"role": 1}]},
        "messages[0] must be an object with a 'role'",
        "messages[0]",
    ),
    ({**COMPLETION, "stream": "yes"}, "'stream' must be a boolean", "stream"),
]


@pytest.mark.parametrize(("body", "message", "param"), COMPLETION_WRONG_TYPES)
def test_completion_bodies_of_the_wrong_types_are_400(
    client: TestClient, upstream: Any, body: Any, message: str, param: str | None
) -> None:
    response = client.post("/v1/chat/completions", json=body)
    assert (response.status_code, response.json()) == (
        400,
        {
            "error": {
                "code": "bad_request",
                "message": message,
                "type": "invalid_request_error",
                "param": param,
            }
        },
    )
    nothing_changed(client, upstream)


OLLAMA_MODEL = f"openai/{MAIN_MODEL}"
OLLAMA_WRONG_TYPES = [
    ("/api/chat", ["x"], "body: Input should be a valid dictionary or instance of ChatBody"),
    ("/api/chat", {"messages": []}, "model: Field required"),
    ("/api/chat", {"model": 5}, "model: Input should be a valid string"),
    ("/api/chat", {"model": ""}, "model: String should have at least 1 character"),
    (
        "/api/chat",
        {"model": OLLAMA_MODEL, "messages": "hi"},
        "messages: Input should be a valid list",
    ),
    (
        "/api/chat",
        {"model": OLLAMA_MODEL, "messages": [{"content": "x"}]},
        "messages.0.role: Field required",
    ),
    (
        "/api/chat",
        {"model": OLLAMA_MODEL, "messages": [{"role": "user", "content": 3}]},
        "messages.0.content: Input should be a valid string",
    ),
    (
        "/api/chat",
        {"model": OLLAMA_MODEL, "messages": [{"role": "user", "images": "abc"}]},
        "messages.0.images: Input should be a valid list",
    ),
    ("/api/chat", {"model": OLLAMA_MODEL, "stream": 1}, "stream: Input should be a valid boolean"),
    ("/api/chat", {"model": OLLAMA_MODEL, "tools": {}}, "tools: Input should be a valid list"),
    (
        "/api/chat",
        {"model": OLLAMA_MODEL, "options": {"temperature": "hot"}},
        "options.temperature: Input should be a valid number",
    ),
    (
        "/api/chat",
        {"model": OLLAMA_MODEL, "options": {"num_predict": 1.5}},
        "options.num_predict: Input should be a valid integer",
    ),
    (
        "/api/generate",
        {"model": OLLAMA_MODEL, "prompt": ["hi"]},
        "prompt: Input should be a valid string",
    ),
    (
        "/api/generate",
        {"model": OLLAMA_MODEL, "prompt": "hi", "system": 1},
        "system: Input should be a valid string",
    ),
    (
        "/api/generate",
        {"model": OLLAMA_MODEL, "prompt": "hi", "format": 1},
        'format: Value error, format must be "json" or a JSON schema object',
    ),
    ("/api/show", {"model": 1}, "model: Input should be a valid string"),
]


@pytest.mark.parametrize(("path", "body", "problem"), OLLAMA_WRONG_TYPES)
def test_ollama_bodies_of_the_wrong_types_are_400(
    client: TestClient, upstream: Any, path: str, body: Any, problem: str
) -> None:
    response = client.post(path, json=body)
    assert (response.status_code, response.json()) == (
        400,
        {"error": f"invalid request body: {problem}"},
    )
    nothing_changed(client, upstream)


@pytest.mark.parametrize(("method", "path", "good"), BODY_ROUTES[:3], ids=ROUTE_IDS[:3])
def test_ten_thousand_unknown_fields_are_400_with_a_bounded_answer(
    make_client: MakeClient, chat_sections: Any, upstream: Any, method: str, path: str, good: Any
) -> None:
    client = make_client(**chat_sections())
    body = {**good, **{f"f{i}": i for i in range(10_000)}}
    content = json.dumps(body).encode()
    response = client.request(method, path, content=content)
    assert response.status_code == 400
    assert response.json() == error(path, "bad_request", ANY_MESSAGE)
    assert response.json()["error"]["message"].startswith(
        "invalid request body: f0: Extra inputs are not permitted"
    )
    # An error names the problem; it does not echo every field back (a 145 KB body should
    # not buy a 390 KB answer).
    assert len(response.content) <= 4096, f"a {len(response.content)}-byte error body"
    nothing_changed(client, upstream)


def test_an_import_of_ten_thousand_keys_is_all_or_nothing(
    make_store: Callable[..., MemoryStore], tokens: TokenCounter
) -> None:
    store = make_store(tokenLimit=15_000)
    items = [(f"k{i:05d}", "hello") for i in range(10_000)]
    with pytest.raises(InvalidKey):
        store.import_document("alice", [*items, ("Bad", "x")])
    with pytest.raises(MemoryFull):
        store.import_document("alice", [*items, *((f"j{i:05d}", "hello") for i in range(5_001))])
    assert store.snapshot("alice").entries == ()
    assert store.import_document("alice", items).imported == 10_000
    snapshot = store.snapshot("alice")
    assert (len(snapshot.entries), snapshot.total_tokens) == (10_000, 10_000)


# --- NUL characters -------------------------------------------------------------------------


def test_a_nul_in_a_chat_message_is_refused_or_kept_exactly(
    client: TestClient, upstream: Any
) -> None:
    """No 500 whatever the database: either a 400 before any model call, or the turn stored
    with the message exactly as sent."""
    message = "before\x00after"
    response = client.post("/chat", json={"message": message})
    if response.status_code == 400:
        assert response.json() == error("/chat", "bad_request", ANY_MESSAGE)
        nothing_changed(client, upstream)
        return
    assert response.status_code == 200, response.text
    conversation = client.get(f"/conversations/{response.json()['conversation_id']}").json()
    assert [m["content"] for m in conversation["messages"]] == [message, "ok"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_nul_in_a_conversation_id_is_404_like_any_unknown_id(
    client: TestClient, upstream: Any, stream: bool
) -> None:
    for conversation_id in ("\x00", "abc\x00def", "\x00" * 36):
        response = client.post(
            "/chat", json={"message": "hi", "conversation_id": conversation_id, "stream": stream}
        )
        assert (response.status_code, response.json()) == (
            404,
            error("/chat", "not_found", f"no conversation with id {conversation_id!r}"),
        )
    for path in ("/conversations/%00", "/conversations/abc%00def"):
        conversation_id = path.removeprefix("/conversations/").replace("%00", "\x00")
        for method in ("GET", "DELETE"):
            response = client.request(method, path)
            assert (response.status_code, response.json()) == (
                404,
                error(path, "not_found", f"no conversation with id {conversation_id!r}"),
            )
    nothing_changed(client, upstream)


# --- keys in paths --------------------------------------------------------------------------

PATH_KEYS = [
    ("%61bc", 201, "abc"),  # percent-encoded ASCII is the plain key
    ("caf%C3%A9", 422, "café"),
    ("%EF%BD%81", 422, "ａ"),  # fullwidth a: never folded to "a"
    ("%E2%84%AA", 422, "\u212a"),  # the Kelvin sign, which lower-cases to "k"
    ("k%CC%81", 422, "k\u0301"),  # k + combining acute
    ("abc%0A", 422, "abc\n"),
    ("abc%20", 422, "abc "),
    ("%20abc", 422, " abc"),
    ("%00", 422, "\x00"),
    ("%", 422, "%"),
    ("%zz", 422, "%zz"),
    ("%ff", 422, "\ufffd"),
    ("a" * 129, 422, "a" * 129),
    ("%C3%A9" * 1000, 422, "é" * 1000),
    ("nothing", 422, "nothing"),
]


@pytest.mark.parametrize(("segment", "status", "key"), PATH_KEYS)
def test_unicode_and_percent_encoded_keys_in_paths(
    client: TestClient, segment: str, status: int, key: str
) -> None:
    put = client.put(f"/memory/{segment}", json={"value": "v"})
    get = client.get(f"/memory/{segment}")
    delete = client.delete(f"/memory/{segment}")
    listing = client.get("/memory").json()["memories"]
    if status == 201:
        assert (put.status_code, get.json()["key"], delete.status_code) == (201, key, 204)
        assert listing == []
        return
    invalid = error(
        "/memory/k",
        "invalid_key",
        (
            f"invalid key {key!r}: a key is 1-128 characters of a-z, 0-9 and _, "
            "starts with a letter, and is not 'export', 'history', 'nothing', 'proposals' or 'scopes'"
        ),
    )
    for response in (put, get, delete):
        assert (response.status_code, response.json()) == (status, invalid)
    assert listing == []


def test_an_encoded_slash_is_another_path_not_a_key(client: TestClient) -> None:
    response = client.put("/memory/a%2Fb", json={"value": "v"})
    assert (response.status_code, response.json()) == (
        404,
        error("/memory/a/b", "not_found", "no route PUT /memory/a/b"),
    )
    assert client.get("/memory").json()["memories"] == []


# --- headers (a real server: the HTTP parser is uvicorn's) ----------------------------------

SERVICE_KEY = "svc-bad-input-key"


@pytest.fixture
def server(make_server: Callable[..., LiveServer], database: Database) -> LiveServer:
    return make_server(auth={"mode": "keys", "service_keys": [SERVICE_KEY]})


def as_service(user: str = "alice") -> dict[str, str]:
    return {"Authorization": f"Bearer {SERVICE_KEY}", "X-User-Id": user}


HEADERS_TOO_LARGE = {
    "error": {
        "code": "headers_too_large",
        "message": "the request line and headers are over the limit of 65536 bytes",
    }
}


@pytest.mark.parametrize(
    "headers",
    [
        {"X-Big": "a" * 65_536},
        {"X-Big": "a" * 1_000_000},
        {f"X-Header-{i}": "v" for i in range(10_000)},
        {"Cookie": "; ".join(f"c{i}=v" for i in range(20_000))},
    ],
    ids=["64KB", "1MB", "10k-headers", "20k-cookies"],
)
def test_oversized_headers_are_431_and_the_server_keeps_serving(
    server: LiveServer, headers: dict[str, str]
) -> None:
    """Headers past `server.max_header_bytes` (default 64 KiB) are refused by the HTTP
    protocol before the app sees them, in kvmem's error shape.

    Sent through httpx's transport, not its client: the client's cookie jar looks up each
    of the request's headers by a scan of all of them, 10 s of CPU for 10,000 headers."""
    request = httpx.Request(
        "GET",
        f"{server.url}/memory",
        headers={**as_service(), **headers},
        extensions={"timeout": httpx.Timeout(20).as_dict()},
    )
    with httpx.HTTPTransport() as transport:
        response = transport.handle_request(request)
        response.read()
    assert (response.status_code, response.json()) == (431, HEADERS_TOO_LARGE)
    assert response.headers["connection"] == "close"
    with httpx.Client(base_url=server.url, timeout=20) as http:
        put = http.put("/memory/k", json={"value": "v"}, headers=as_service())
        assert put.status_code == 201
        assert http.get("/healthz").json()["status"] == "ok"


def test_a_huge_user_id_header_is_400_with_a_bounded_message(server: LiveServer) -> None:
    with httpx.Client(base_url=server.url, timeout=20) as http:
        response = http.get("/memory", headers=as_service("a" * 60_000))
        assert (response.status_code, response.json()) == (
            400,
            {
                "error": {
                    "code": "bad_request",
                    "message": f"invalid user id {'a' * 140!r}: use 1-128 characters of A-Z, a-z, 0-9, . _ @ -",
                }
            },
        )
        wrong_key = http.get("/memory", headers={"Authorization": "Bearer " + "k" * 60_000})
        assert wrong_key.status_code == 401
        assert http.get("/memory", headers=as_service()).status_code == 200


def test_a_huge_request_line_is_refused_and_the_server_keeps_serving(server: LiveServer) -> None:
    import socket

    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"GET /memory/" + b"a" * 200_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = sock.recv(64)
    assert answer.startswith(b"HTTP/1.1 4"), answer
    with httpx.Client(base_url=server.url, timeout=20) as http:
        assert http.get("/memory", headers=as_service()).status_code == 200


# --- the memory agent's input ---------------------------------------------------------------


# aiohttp (under litellm) warns about any request body over 1 MB; the 5 MB message must go
# upstream all the same.
@pytest.mark.filterwarnings("ignore:Sending a large body directly:ResourceWarning")
def test_the_agent_reads_at_most_max_input_tokens_of_a_5_mb_message(
    make_client: MakeClient,
    chat_sections: Any,
    upstream: Any,
    tokens: TokenCounter,
    database: Database,
) -> None:
    client = make_client(**chat_sections(server={"max_body_bytes": 6_000_000}))
    tail = "and please remember that I drink green tea"
    message = ("Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 90_000)[:5_000_000]
    message += tail
    assert len(message.encode()) > 5_000_000
    response = client.post("/chat", json={"message": message})
    assert response.status_code == 200, response.text[:300]
    wait_agents_idle(client, timeout=30)

    (agent,) = upstream.received(AGENT_MODEL)
    prompt = agent.messages[1]["content"]
    chat = prompt.split("# Current Chat:\n", 1)[1]
    assert 11_000 <= tokens.count(chat) <= 12_000  # maxInputTokens' default
    assert chat.endswith(tail)
    assert ("Human: " + message).endswith(chat)
    assert len(json.dumps(agent.body)) < 200_000
    # The main model gets the whole message, and the turn is stored whole.
    assert upstream.received(MAIN_MODEL)[0].messages[-1] == {"role": "user", "content": message}
    stored = client.get(f"/conversations/{response.json()['conversation_id']}").json()
    assert stored["messages"][0]["content"] == message
    assert KeyStore(database).list() == []  # (nothing else was written on the way)


# --- numbers (issue 22, item 9) -------------------------------------------------------------

BAD_NUMBERS = [
    ("nan", b"NaN", "the JSON body holds NaN, which is not a JSON number"),
    ("infinity", b"Infinity", "the JSON body holds Infinity, which is not a JSON number"),
    ("minus-infinity", b"-Infinity", "the JSON body holds -Infinity, which is not a JSON number"),
    ("overflowing-float", b"1e999", "the JSON body holds a number out of range (1e999)"),
    (
        "int-over-64-bits",
        b"9223372036854775808",
        "the JSON body holds an integer outside the signed 64-bit range (9223372036854775808)",
    ),
    (
        "int-under-64-bits",
        b"-9223372036854775809",
        "the JSON body holds an integer outside the signed 64-bit range (-9223372036854775809)",
    ),
]
# Each route's accepted body with a number spliced in where the route would read it, or
# where it would pass it on (`options` of /api/chat, `temperature` of /v1).
NUMBER_BODIES = [
    ("PUT", "/memory/k", b'{"value": "v", "n": %s}'),
    ("PATCH", "/preferences", b'{"memories": [%s]}'),
    ("POST", "/chat", b'{"message": "hi", "max_turns": %s}'),
    (
        "POST",
        "/v1/chat/completions",
        b'{"model": "openai/main-model", "temperature": %s, '
        b'"messages": [{"role": "user", "content": "hi"}]}',
    ),
    (
        "POST",
        "/api/chat",
        b'{"model": "openai/main-model", "options": {"temperature": %s}, '
        b'"messages": [{"role": "user", "content": "hi"}]}',
    ),
    ("POST", "/api/generate", b'{"model": "openai/main-model", "prompt": "hi", "keep_alive": %s}'),
    ("POST", "/api/show", b'{"model": "openai/main-model", "verbose": %s}'),
    ("POST", "/memory/context", b'{"messages": [], "n": %s}'),
    (
        "POST",
        "/memory/agent",
        b'{"messages": [{"role": "user", "content": "hi"}], "deadline_seconds": %s}',
    ),
    ("POST", "/memory/import", b'{"format": "kvmem.memory.v1", "memories": [%s]}'),
]


@pytest.mark.parametrize(
    ("method", "path", "template"), NUMBER_BODIES, ids=[path for _, path, _ in NUMBER_BODIES]
)
@pytest.mark.parametrize(
    ("kind", "number", "message"), BAD_NUMBERS, ids=[kind for kind, _, _ in BAD_NUMBERS]
)
def test_nan_infinity_and_integers_outside_64_bits_are_400_on_every_route(
    make_client: MakeClient,
    chat_sections: Any,
    upstream: Any,
    method: str,
    path: str,
    template: bytes,
    kind: str,
    number: bytes,
    message: str,
) -> None:
    """One check of every body's numbers: refused with kvmem's (or Ollama's, or OpenAI's)
    400 before any validation, model call or write, and never forwarded upstream."""
    client = make_client(**chat_sections())
    response = client.request(method, path, content=template % number)
    assert (response.status_code, response.json()) == (400, error(path, "bad_request", message))
    nothing_changed(client, upstream)


@pytest.mark.parametrize("number", [-(2**63), 2**63 - 1])
def test_both_ends_of_the_64_bit_range_are_accepted_and_passed_on(
    make_client: MakeClient, chat_sections: Any, upstream: Any, number: int
) -> None:
    client = make_client(**chat_sections(memory={"agent": None}))
    body = (
        b'{"model": "openai/main-model", "seed": %d, '
        b'"messages": [{"role": "user", "content": "hi"}]}' % number
    )
    response = client.post("/v1/chat/completions", content=body)
    assert response.status_code == 200, response.text
    assert upstream.received(MAIN_MODEL)[0].body["seed"] == number


def test_mcp_refuses_nan_before_its_transport_parses_the_body(
    make_client: MakeClient, chat_sections: Any, upstream: Any
) -> None:
    client = make_client(**chat_sections())
    call = (
        b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": '
        b'"set_memory", "arguments": {"key": "k", "value": "v", "n": NaN}}}'
    )
    response = client.post(
        "/mcp",
        content=call,
        headers={
            "content-type": "application/json",
            "accept": "application/json, text/event-stream",
        },
    )
    assert (response.status_code, response.json()) == (
        400,
        error("/mcp", "bad_request", "the JSON body holds NaN, which is not a JSON number"),
    )
    nothing_changed(client, upstream)


def test_max_turns_of_2_to_the_62_reads_the_whole_conversation(
    client: TestClient, upstream: Any
) -> None:
    """Inside 64 bits, but twice it is not: the history query stays within the range."""
    upstream.script(MAIN_MODEL, Reply(content="first"), Reply(content="second"))
    first = client.post("/chat", json={"message": "hi", "memory": False})
    second = client.post(
        "/chat",
        json={
            "message": "again",
            "conversation_id": first.json()["conversation_id"],
            "max_turns": 2**62,
            "memory": False,
        },
    )
    assert (second.status_code, second.json()["response"]) == (200, "second")
    assert [m["content"] for m in upstream.received(MAIN_MODEL)[-1].messages[1:]] == [
        "hi",
        "first",
        "again",
    ]
