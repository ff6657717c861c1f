"""The /memory and /preferences routes: every answer and every error code of CONTRACT section 3."""

from __future__ import annotations

import asyncio
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from kvmem import __version__
from kvmem.config import Config
from kvmem.db.engine import Database
from kvmem.entries import Snapshot
from kvmem.memory.overview import memory_overview, usage_percentage
from kvmem.server.app import create_app
from kvmem.tokens import TokenCounter
from tests.support.apps import LOCAL_URL
from tests.support.matchers import entry

MakeClient = Callable[..., TestClient]
MakeValue = Callable[[int], str]

EMPTY_LISTING = {
    "memories": [],
    "total_tokens": 0,
    "token_limit": None,
    "char_limit": 10000,
    "usage_percentage": None,
    "valid_keys": None,
    "enabled": True,
}


def invalid_key(key: str) -> dict[str, Any]:
    return {
        "error": {
            "code": "invalid_key",
            "message": (
                f"invalid key {key!r}: a key is 1-128 characters of a-z, 0-9 and _, "
                "starts with a letter, and is not 'export', 'history', 'nothing', 'proposals' or 'scopes'"
            ),
        }
    }


def bad_request(message: str) -> dict[str, Any]:
    return {"error": {"code": "bad_request", "message": message}}


def not_found(key: str) -> dict[str, Any]:
    return {"error": {"code": "not_found", "message": f"no memory with key {key!r}"}}


# -- the happy paths ---------------------------------------------------------------------------


def test_empty_listing(make_client: MakeClient) -> None:
    response = make_client().get("/memory")
    assert (response.status_code, response.json()) == (200, EMPTY_LISTING)


def test_put_creates_with_201_then_replaces_with_200(make_client: MakeClient) -> None:
    client = make_client(memory={"tokenLimit": 100})
    created = client.put("/memory/user_preferences", json={"value": " Prefers short answers. \n"})
    assert (created.status_code, created.json()) == (
        201,
        {
            "memory": entry("user_preferences", "Prefers short answers.", 5),
            "total_tokens": 5,
            "token_limit": 100,
        },
    )
    replaced = client.put("/memory/user_preferences", json={"value": "Prefers long answers"})
    assert (replaced.status_code, replaced.json()) == (
        200,
        {
            "memory": entry("user_preferences", "Prefers long answers", 4),
            "total_tokens": 4,
            "token_limit": 100,
        },
    )
    first, second = created.json()["memory"], replaced.json()["memory"]
    assert second["created_at"] == first["created_at"]
    assert second["updated_at"] > first["updated_at"]


def test_get_one_entry(make_client: MakeClient) -> None:
    client = make_client()
    put = client.put("/memory/facts", json={"value": "Lives in Lyon"})
    response = client.get("/memory/facts")
    assert (response.status_code, response.json()) == (200, put.json()["memory"])
    assert response.json() == entry("facts", "Lives in Lyon", 3)


def test_get_missing_entry_is_404(make_client: MakeClient) -> None:
    response = make_client().get("/memory/facts")
    assert (response.status_code, response.json()) == (404, not_found("facts"))


def test_delete_one_entry(make_client: MakeClient) -> None:
    client = make_client()
    client.put("/memory/facts", json={"value": "x"})
    client.put("/memory/other", json={"value": "y"})
    response = client.delete("/memory/facts")
    assert (response.status_code, response.content) == (204, b"")
    again = client.delete("/memory/facts")
    assert (again.status_code, again.json()) == (404, not_found("facts"))
    assert [m["key"] for m in client.get("/memory").json()["memories"]] == ["other"]


def test_clear_all(make_client: MakeClient) -> None:
    client = make_client()
    for key in ["a", "b", "c"]:
        client.put(f"/memory/{key}", json={"value": key})
    response = client.delete("/memory")
    assert (response.status_code, response.json()) == (200, {"deleted": 3})
    assert client.get("/memory").json() == EMPTY_LISTING
    again = client.delete("/memory")
    assert (again.status_code, again.json()) == (200, {"deleted": 0})


def test_listing_is_newest_first_with_usage(make_client: MakeClient, make_value: MakeValue) -> None:
    client = make_client(memory={"tokenLimit": 30, "validKeys": ["a", "b", "c"], "charLimit": 500})
    client.put("/memory/a", json={"value": make_value(2)})
    client.put("/memory/b", json={"value": make_value(1)})
    client.put("/memory/c", json={"value": make_value(1)})
    client.put("/memory/a", json={"value": make_value(3)})  # rewriting moves it to the top
    response = client.get("/memory")
    assert (response.status_code, response.json()) == (
        200,
        {
            "memories": [
                entry("a", make_value(3), 3),
                entry("c", make_value(1), 1),
                entry("b", make_value(1), 1),
            ],
            "total_tokens": 5,
            "token_limit": 30,
            "char_limit": 500,
            "usage_percentage": 16.7,
            "valid_keys": ["a", "b", "c"],
            "enabled": True,
        },
    )


def test_usage_percentage() -> None:
    assert usage_percentage(0, None) is None
    assert usage_percentage(5, 30) == 16.7
    assert usage_percentage(30, 30) == 100.0
    assert usage_percentage(0, 0) == 0.0
    assert usage_percentage(3, 0) == 100.0
    assert usage_percentage(45, 30) == 150.0  # the limit was lowered below what is stored


def test_overview_enabled_reflects_disabled_and_opt_out() -> None:
    def enabled(disabled: bool, opted_in: bool) -> bool:
        config = Config.model_validate({"memory": {"disabled": disabled}})
        return memory_overview(Snapshot(entries=(), memories_enabled=opted_in), config)["enabled"]

    assert [
        enabled(d, o) for d, o in [(False, True), (False, False), (True, True), (True, False)]
    ] == [
        True,
        False,
        False,
        False,
    ]


def test_preferences(make_client: MakeClient) -> None:
    client = make_client()
    initial = client.get("/preferences")
    assert (initial.status_code, initial.json()) == (200, {"memories": True, "review": False})
    off = client.patch("/preferences", json={"memories": False})
    assert (off.status_code, off.json()) == (200, {"memories": False, "review": False})
    assert client.get("/preferences").json() == {"memories": False, "review": False}
    assert client.get("/memory").json() == {**EMPTY_LISTING, "enabled": False}
    on = client.patch("/preferences", json={"memories": True})
    assert (on.status_code, on.json()) == (200, {"memories": True, "review": False})
    assert client.get("/memory").json()["enabled"] is True


def test_opted_out_user_can_still_edit(make_client: MakeClient) -> None:
    client = make_client()
    client.patch("/preferences", json={"memories": False})
    assert client.put("/memory/k", json={"value": "v"}).status_code == 201
    assert client.put("/memory/k", json={"value": "w"}).status_code == 200
    assert client.get("/memory/k").json() == entry("k", "w", 1)
    assert client.get("/memory").json()["memories"] == [entry("k", "w", 1)]
    assert client.delete("/memory/k").status_code == 204
    client.put("/memory/k", json={"value": "v"})
    assert client.delete("/memory").json() == {"deleted": 1}
    assert client.get("/preferences").json() == {"memories": False, "review": False}


def test_personalize_false_forbids_changing_the_switch(make_client: MakeClient) -> None:
    client = make_client(memory={"personalize": False})
    response = client.patch("/preferences", json={"memories": False})
    assert (response.status_code, response.json()) == (
        403,
        {
            "error": {
                "code": "personalize_disabled",
                "message": "users cannot turn memory off on this server (memory.personalize is false)",
            }
        },
    )
    assert client.get("/preferences").json() == {"memories": True, "review": False}
    assert client.get("/memory").json()["enabled"] is True


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/memory", None),
        ("DELETE", "/memory", None),
        ("GET", "/memory/k", None),
        ("PUT", "/memory/k", {"value": "v"}),
        ("DELETE", "/memory/k", None),
        ("GET", "/preferences", None),
        ("PATCH", "/preferences", {"memories": False}),
    ],
)
def test_memory_disabled_answers_403_everywhere(
    make_client: MakeClient, method: str, path: str, body: Any
) -> None:
    response = make_client(memory={"disabled": True}).request(method, path, json=body)
    assert (response.status_code, response.json()) == (
        403,
        {
            "error": {
                "code": "memory_disabled",
                "message": "memory is disabled on this server (memory.disabled is true)",
            }
        },
    )


# -- 422: the write rules ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "key"),
    [
        ("/memory/Bad", "Bad"),
        ("/memory/nothing", "nothing"),
        ("/memory/1abc", "1abc"),
        ("/memory/a-b", "a-b"),
        ("/memory/a%20b", "a b"),
        ("/memory/caf%C3%A9", "café"),
        ("/memory/" + "a" * 129, "a" * 129),
    ],
)
@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
def test_malformed_key_in_any_route_is_422(
    make_client: MakeClient, method: str, path: str, key: str
) -> None:
    response = make_client().request(method, path, json={"value": "v"} if method == "PUT" else None)
    assert (response.status_code, response.json()) == (422, invalid_key(key))


def test_key_of_128_characters_is_fine(make_client: MakeClient) -> None:
    client = make_client()
    key = "k" * 128
    assert client.put(f"/memory/{key}", json={"value": "v"}).status_code == 201
    assert client.get(f"/memory/{key}").json() == entry(key, "v", 1)


def test_key_not_allowed_names_the_valid_keys(make_client: MakeClient) -> None:
    client = make_client(memory={"validKeys": ["preferences", "facts"]})
    response = client.put("/memory/context", json={"value": "v"})
    assert (response.status_code, response.json()) == (
        422,
        {
            "error": {
                "code": "key_not_allowed",
                "message": "key 'context' is not allowed; valid keys: preferences, facts",
                "valid_keys": ["preferences", "facts"],
            }
        },
    )
    assert client.put("/memory/facts", json={"value": "v"}).status_code == 201


@pytest.mark.parametrize("value", ["", "   ", "\n\t "])
def test_empty_value_is_422(make_client: MakeClient, value: str) -> None:
    response = make_client().put("/memory/k", json={"value": value})
    assert (response.status_code, response.json()) == (
        422,
        {"error": {"code": "empty_value", "message": "the value is empty"}},
    )


def test_value_too_long_is_422(make_client: MakeClient) -> None:
    client = make_client(memory={"charLimit": 5})
    assert client.put("/memory/k", json={"value": "  12345  "}).status_code == 201
    response = client.put("/memory/k", json={"value": "123456"})
    assert (response.status_code, response.json()) == (
        422,
        {
            "error": {
                "code": "value_too_long",
                "message": "the value is 6 characters; the limit is 5",
                "char_limit": 5,
                "length": 6,
            }
        },
    )
    assert client.get("/memory/k").json()["value"] == "12345"


def test_nul_in_value_is_400(make_client: MakeClient) -> None:
    response = make_client().put("/memory/k", json={"value": "a\u0000b"})
    assert (response.status_code, response.json()) == (
        400,
        bad_request("the value contains a NUL character, which cannot be stored"),
    )


# -- 409: tokenLimit -----------------------------------------------------------------------------


def test_memory_full_with_details(make_client: MakeClient, make_value: MakeValue) -> None:
    client = make_client(memory={"tokenLimit": 10})
    assert client.put("/memory/a", json={"value": make_value(6)}).json()["total_tokens"] == 6
    at_limit = client.put("/memory/b", json={"value": make_value(4)})
    assert (at_limit.status_code, at_limit.json()["total_tokens"]) == (201, 10)
    over = client.put("/memory/c", json={"value": make_value(1)})
    assert (over.status_code, over.json()) == (
        409,
        {
            "error": {
                "code": "memory_full",
                "message": "storing 1 tokens would take memory to 11 tokens, over the limit of 10",
                "token_limit": 10,
                "total_tokens": 10,
                "requested_tokens": 1,
            }
        },
    )
    # Replacing counts as a replacement: b (4) -> 4 fits, b -> 5 does not.
    assert client.put("/memory/b", json={"value": make_value(4)}).status_code == 200
    grown = client.put("/memory/b", json={"value": make_value(5)})
    assert (grown.status_code, grown.json()["error"]["total_tokens"]) == (409, 10)
    listing = client.get("/memory").json()
    assert [(m["key"], m["token_count"]) for m in listing["memories"]] == [("b", 4), ("a", 6)]
    assert (listing["total_tokens"], listing["usage_percentage"]) == (10, 100.0)


def test_concurrent_puts_never_pass_the_token_limit(
    make_client: MakeClient, make_value: MakeValue, tokens: TokenCounter
) -> None:
    client = make_client(memory={"tokenLimit": 50})
    barrier = threading.Barrier(40)
    statuses: dict[str, int] = {}
    lock = threading.Lock()

    def put(i: int) -> None:
        key = f"k{i:02d}"
        barrier.wait()
        response = client.put(f"/memory/{key}", json={"value": make_value(3 + i % 3)})
        with lock:
            statuses[key] = response.status_code

    threads = [threading.Thread(target=put, args=(i,)) for i in range(40)]  # 160 tokens asked
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)

    assert set(statuses.values()) == {201, 409}
    listing = client.get("/memory").json()
    stored = {m["key"] for m in listing["memories"]}
    assert stored == {key for key, status in statuses.items() if status == 201}
    assert listing["total_tokens"] == sum(m["token_count"] for m in listing["memories"])
    assert 45 <= listing["total_tokens"] <= 50  # refused writes were all 3-5 tokens
    assert all(m["token_count"] == tokens.count(m["value"]) for m in listing["memories"])


# -- 400: bodies -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"value":', "malformed JSON body: Expecting value at line 1 column 10"),
        (b"", "malformed JSON body: Expecting value at line 1 column 1"),
        (
            b"{'value': 'x'}",
            "malformed JSON body: Expecting property name enclosed in double quotes at line 1 column 2",
        ),
        (b'{"value": "\xff"}', "the body is not valid UTF-8 (byte 11)"),
        (b'{"value": 5}', "invalid request body: value: Input should be a valid string"),
        (b'{"value": null}', "invalid request body: value: Input should be a valid string"),
        (b'{"value": ["x"]}', "invalid request body: value: Input should be a valid string"),
        (
            b'{"value": "x", "source": "agent"}',
            "invalid request body: source: Extra inputs are not permitted",
        ),
        (b"{}", "invalid request body: value: Field required"),
        (
            b'"just a string"',
            "invalid request body: body: Input should be a valid dictionary or instance of MemoryValue",
        ),
        (b"[" * 100_000, "the JSON body is nested too deeply"),
    ],
)
def test_bad_put_bodies_are_400(make_client: MakeClient, content: bytes, message: str) -> None:
    client = make_client()
    response = client.put(
        "/memory/k", content=content, headers={"content-type": "application/json"}
    )
    assert (response.status_code, response.json()) == (400, bad_request(message))
    assert client.get("/memory").json() == EMPTY_LISTING


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"memories": "false"}, "invalid request body: memories: Input should be a valid boolean"),
        ({"memories": 0}, "invalid request body: memories: Input should be a valid boolean"),
        ({"memories": True, "x": 1}, "invalid request body: x: Extra inputs are not permitted"),
        ({}, "invalid request body: give memories, review or both"),
    ],
)
def test_bad_preferences_bodies_are_400(make_client: MakeClient, body: Any, message: str) -> None:
    client = make_client()
    response = client.patch("/preferences", json=body)
    assert (response.status_code, response.json()) == (400, bad_request(message))
    assert client.get("/preferences").json() == {"memories": True, "review": False}


# -- 413: body size ------------------------------------------------------------------------------


def test_declared_body_over_the_limit_is_413(make_client: MakeClient) -> None:
    client = make_client(server={"max_body_bytes": 100})
    response = client.put("/memory/k", content=b'{"value": "' + b"x" * 200 + b'"}')
    assert (response.status_code, response.json()) == (
        413,
        {
            "error": {
                "code": "body_too_large",
                "message": "the request body is 213 bytes; the limit is 100",
            }
        },
    )
    exact = b'{"value": "' + b"x" * 87 + b'"}'
    assert len(exact) == 100
    assert client.put("/memory/k", content=exact).status_code == 201


def test_chunked_body_over_the_limit_is_413(make_client: MakeClient) -> None:
    client = make_client(server={"max_body_bytes": 100})

    def chunks() -> Iterator[bytes]:
        yield b'{"value": "'
        yield b"x" * 100
        yield b'"}'

    response = client.put("/memory/k", content=chunks())
    assert response.request.headers.get("content-length") is None
    assert response.request.headers["transfer-encoding"] == "chunked"
    assert (response.status_code, response.json()) == (
        413,
        {
            "error": {
                "code": "body_too_large",
                "message": "the request body is over the limit of 100 bytes",
            }
        },
    )
    assert client.get("/memory").json() == EMPTY_LISTING


def test_a_huge_chunked_body_is_refused_without_being_read_whole(
    make_config: Callable[..., Config], database: Database, tokens: TokenCounter
) -> None:
    """Drive the ASGI app directly with an endless body and count what the server pulls."""
    app = create_app(
        make_config(server={"max_body_bytes": 100_000}), database=database, tokens=tokens
    )
    chunk = b"x" * 65_536
    pulled = 0
    sent: list[dict[str, Any]] = []

    async def scenario() -> None:
        nonlocal pulled
        lifespan_in: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        lifespan_out: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        state: dict[str, Any] = {}
        lifespan = asyncio.create_task(
            app(
                {"type": "lifespan", "asgi": {"version": "3.0"}, "state": state},
                lifespan_in.get,
                lifespan_out.put,
            )
        )
        await lifespan_in.put({"type": "lifespan.startup"})
        assert (await lifespan_out.get()) == {"type": "lifespan.startup.complete"}

        async def receive() -> dict[str, Any]:
            nonlocal pulled
            pulled += 1
            if pulled > 10_000:  # 640 MB: far past any sane limit; end so a bug cannot hang
                return {"type": "http.request", "body": b"", "more_body": False}
            return {"type": "http.request", "body": chunk, "more_body": True}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "PUT",
            "scheme": "http",
            "path": "/memory/k",
            "raw_path": b"/memory/k",
            "query_string": b"",
            "root_path": "",
            "headers": [(b"host", b"127.0.0.1"), (b"transfer-encoding", b"chunked")],
            "client": ("127.0.0.1", 50000),
            "server": ("testserver", 80),
            "state": dict(state),
        }
        await app(scope, receive, send)
        await lifespan_in.put({"type": "lifespan.shutdown"})
        assert (await lifespan_out.get()) == {"type": "lifespan.shutdown.complete"}
        await lifespan

    asyncio.run(scenario())
    assert sent[0]["type"] == "http.response.start"
    assert sent[0]["status"] == 413
    assert b"body_too_large" in b"".join(m.get("body", b"") for m in sent[1:])
    assert pulled == 2  # 65,536 bytes, then 131,072 > 100,000: refused at once


# -- 404 / 405 ---------------------------------------------------------------------------------


def test_unknown_route_is_404(make_client: MakeClient) -> None:
    response = make_client().get("/memories")
    assert (response.status_code, response.json()) == (
        404,
        {"error": {"code": "not_found", "message": "no route GET /memories"}},
    )


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("POST", "/memory", {"GET", "HEAD", "DELETE"}),
        ("PUT", "/memory", {"GET", "HEAD", "DELETE"}),
        ("POST", "/memory/k", {"GET", "HEAD", "PUT", "DELETE"}),
        ("PATCH", "/memory/k", {"GET", "HEAD", "PUT", "DELETE"}),
        ("PUT", "/preferences", {"GET", "HEAD", "PATCH"}),
        ("POST", "/healthz", {"GET", "HEAD"}),
        ("PUT", "/conversations", {"GET", "HEAD"}),
        ("POST", "/conversations/some-id", {"GET", "HEAD", "DELETE"}),
        ("PATCH", "/conversations/some-id", {"GET", "HEAD", "DELETE"}),
    ],
)
def test_wrong_method_is_405_with_allow(
    make_client: MakeClient, method: str, path: str, allowed: set[str]
) -> None:
    response = make_client().request(method, path)
    assert (response.status_code, response.json()) == (
        405,
        {"error": {"code": "method_not_allowed", "message": f"{method} is not allowed on {path}"}},
    )
    assert set(response.headers["allow"].split(", ")) == allowed


# -- 503: the store is down --------------------------------------------------------------------


# /healthz's agent object when memory.yaml configures no agent.
NO_AGENT = {
    "enabled": False,
    "ready": False,
    "reason": "memory.agent is not configured",
    "last_error": None,
}


def test_healthz(make_client: MakeClient) -> None:
    response = make_client().get("/healthz")
    assert (response.status_code, response.json()) == (
        200,
        {"status": "ok", "version": __version__, "store": "ok", "agent": NO_AGENT},
    )


@pytest.mark.sqlite_only  # SQLite's own files and URI modes
def test_broken_database_is_503_and_healthz_says_so(
    make_client: MakeClient, database: Database, tmp_path: Path
) -> None:
    client = make_client()
    assert client.put("/memory/k", json={"value": "kept"}).status_code == 201

    # Take the database file away and put a folder where it was: SQLite cannot open it.
    database.dispose()
    aside = tmp_path / "aside"
    aside.mkdir()
    files = [p for p in tmp_path.iterdir() if p.name.startswith("kvmem.db")]
    for path in files:
        shutil.move(path, aside / path.name)
    (tmp_path / "kvmem.db").mkdir()

    for method, path, body in [
        ("GET", "/memory", None),
        ("GET", "/memory/k", None),
        ("PUT", "/memory/k", {"value": "v"}),
        ("DELETE", "/memory/k", None),
        ("DELETE", "/memory", None),
        ("GET", "/preferences", None),
        ("PATCH", "/preferences", {"memories": False}),
    ]:
        response = client.request(method, path, json=body)
        assert response.status_code == 503, (method, path)
        error = response.json()["error"]
        assert (set(error), error["code"]) == ({"code", "message"}, "store_unavailable")
        assert error["message"].startswith("the memory store is unavailable: ")
    health = client.get("/healthz")
    assert (health.status_code, health.json()) == (
        200,
        {"status": "ok", "version": __version__, "store": "unavailable", "agent": NO_AGENT},
    )

    # Put it back: the store answers again, with its data.
    (tmp_path / "kvmem.db").rmdir()
    for path in files:
        shutil.move(aside / path.name, path)
    assert client.get("/memory/k").json() == entry("k", "kept", 2)
    assert client.get("/healthz").json()["store"] == "ok"


@pytest.mark.sqlite_only  # SQLite's own files and URI modes
def test_read_only_database_refuses_writes_with_503(
    database: Database, database_url: str, tokens: TokenCounter
) -> None:
    path = database_url.removeprefix("sqlite:///")
    config = Config.model_validate({"database": {"url": f"sqlite:///file:{path}?mode=ro&uri=true"}})
    read_only = Database.from_config(config.database)
    app = create_app(config, database=read_only, tokens=tokens)
    with TestClient(app, base_url=LOCAL_URL, raise_server_exceptions=False) as client:
        assert client.get("/memory").json() == EMPTY_LISTING
        response = client.put("/memory/k", json={"value": "v"})
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "store_unavailable"
        assert response.json()["error"]["message"] == (
            "the memory store is unavailable: attempt to write a readonly database"
        )
        assert client.patch("/preferences", json={"memories": False}).status_code == 503
    read_only.dispose()
