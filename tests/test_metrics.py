"""`GET /metrics`: names, labels and increments after real requests, route templates, auth."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from kvmem.metrics import BUCKETS
from tests.support.apps import (
    AGENT_MODEL,
    LOCAL_URL,
    MAIN_MODEL,
    services,
    set_memory,
    wait_agents_idle,
    wait_until,
)
from tests.support.upstream import Reply

MakeClient = Callable[..., TestClient]
SERVICE_KEY = "metrics-service-key"
KEYS_MODE = {"mode": "keys", "service_keys": [SERVICE_KEY]}
CHAT = {
    "model": f"openai/{MAIN_MODEL}",
    "messages": [{"role": "user", "content": "I live in Berlin"}],
}


def scrape(client: TestClient | httpx.Client, **headers: str) -> str:
    response = client.get("/metrics", headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=")
    return response.text


def series(text: str, sample: str) -> dict[tuple[str, ...], float]:
    """Every sample called `sample`, keyed by its label values (in declared order)."""
    found = {}
    for family in text_string_to_metric_families(text):
        for name, labels, value, *_ in family.samples:
            if name == sample:
                found[tuple(labels.values())] = value
    return found


def test_every_metric_counts_real_requests(
    make_client: MakeClient, chat_sections: Callable[..., dict[str, Any]], upstream: Any
) -> None:
    upstream.script(
        AGENT_MODEL,
        Reply(
            content=None,
            tool_calls=[set_memory("city", "Berlin")],
            usage={"prompt_tokens": 120, "completion_tokens": 30},
        ),
    )
    client = make_client(**chat_sections())
    assert client.put("/memory/food", json={"value": "pizza"}).status_code == 201
    assert client.get("/memory/food").status_code == 200
    assert client.get("/memory/missing").status_code == 404
    assert client.delete("/memory/food").status_code == 204
    assert client.get("/no/such/page").status_code == 404
    assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
    wait_agents_idle(client)

    text = scrape(client)
    assert series(text, "kvmem_http_requests_total") == {
        ("/memory/{key}", "PUT", "201"): 1,
        ("/memory/{key}", "GET", "200"): 1,
        ("/memory/{key}", "GET", "404"): 1,
        ("/memory/{key}", "DELETE", "204"): 1,
        ("unmatched", "GET", "404"): 1,
        ("/v1/chat/completions", "POST", "200"): 1,
    }
    assert series(text, "kvmem_http_request_duration_seconds_count") == {
        ("/memory/{key}",): 4,
        ("unmatched",): 1,
        ("/v1/chat/completions",): 1,
    }
    buckets = series(text, "kvmem_http_request_duration_seconds_bucket")
    assert sorted(float(le) for route, le in buckets if route == "unmatched") == [
        *BUCKETS,
        float("inf"),
    ]
    assert series(text, "kvmem_upstream_duration_seconds_count") == {("main",): 1, ("agent",): 1}
    assert series(text, "kvmem_agent_runs_total") == {("done",): 1}
    assert series(text, "kvmem_agent_tokens_total") == {("input",): 120, ("output",): 30}
    assert series(text, "kvmem_memory_writes_total") == {
        ("manual", "set"): 1,
        ("manual", "delete"): 1,
        ("agent", "set"): 1,
    }
    assert series(text, "kvmem_errors_total") == {("not_found",): 2}
    assert series(text, "kvmem_agent_runs_in_flight") == {(): 0}


def test_the_route_label_is_the_template_whatever_the_path(make_client: MakeClient) -> None:
    client = make_client()
    for index in range(5):
        client.put(f"/memory/key_{index}", json={"value": "v"})
        client.get(f"/conversations/{index}")
        client.get(f"/missing/{index}")
    client.request("BREW", "/memory")  # a method nobody serves: one label for all of them

    assert series(scrape(client), "kvmem_http_requests_total") == {
        ("/memory/{key}", "PUT", "201"): 5,
        ("/conversations/{conversation_id}", "GET", "404"): 5,
        ("unmatched", "GET", "404"): 5,
        ("/memory", "other", "405"): 1,
    }


def test_agent_states_that_never_ran_are_counted_too(
    make_client: MakeClient, chat_sections: Callable[..., dict[str, Any]]
) -> None:
    client = make_client(**chat_sections())
    skipped = client.post("/v1/chat/completions", json=CHAT, headers={"X-Memory": "off"})
    assert skipped.status_code == 200
    assert client.post("/chat", json={"message": "hi", "memory": False}).status_code == 200
    assert series(scrape(client), "kvmem_agent_runs_total") == {("skipped",): 2}


def test_upstream_failure_counts_its_error_code(
    make_client: MakeClient, chat_sections: Callable[..., dict[str, Any]], upstream: Any
) -> None:
    upstream.script(MAIN_MODEL, Reply(status=500, error={"error": {"message": "down"}}))
    client = make_client(**chat_sections(agent={"enabled": False}))
    assert client.post("/v1/chat/completions", json=CHAT).status_code == 502
    text = scrape(client)
    assert series(text, "kvmem_errors_total") == {("upstream_error",): 1}
    assert series(text, "kvmem_upstream_duration_seconds_count") == {("main",): 1}


def test_two_apps_in_one_process_keep_their_own_counters(make_client: MakeClient) -> None:
    first, second = make_client(), make_client()
    first.put("/memory/k", json={"value": "v"})
    assert series(scrape(first), "kvmem_http_requests_total") == {
        ("/memory/{key}", "PUT", "201"): 1
    }
    assert series(scrape(second), "kvmem_http_requests_total") == {}


def test_a_stream_is_timed_until_it_ends(
    make_server: Callable[..., Any], chat_sections: Callable[..., dict[str, Any]], upstream: Any
) -> None:
    # Four chunks 0.25 s apart: the response cannot end before 0.75 s after its first byte.
    upstream.script(MAIN_MODEL, Reply(chunks=["a", "b", "c"], chunk_delay=0.25))
    server = make_server(**chat_sections(agent={"enabled": False}))
    with httpx.Client(base_url=server.url, timeout=30) as http:
        with http.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as reply:
            assert reply.status_code == 200
            body = "".join(reply.iter_text())
        assert body.endswith("data: [DONE]\n\n")
        # The request is noted once the response has ended, just after its last byte left.
        wait_until(
            lambda: (
                ("/v1/chat/completions",)
                in series(scrape(http), "kvmem_http_request_duration_seconds_sum")
            ),
            what="the stream noted",
        )
        text = scrape(http)
    seconds = series(text, "kvmem_http_request_duration_seconds_sum")[("/v1/chat/completions",)]
    assert seconds >= 0.75
    upstream_seconds = series(text, "kvmem_upstream_duration_seconds_sum")[("main",)]
    assert upstream_seconds >= 0.75


def test_keys_mode_needs_a_service_key(make_client: MakeClient) -> None:
    client = make_client(auth=KEYS_MODE)
    _, user_key = services(client).keys.create("alice")

    assert client.get("/metrics").status_code == 401
    wrong = client.get("/metrics", headers={"Authorization": "Bearer nope"})
    assert (wrong.status_code, wrong.json()) == (
        401,
        {
            "error": {
                "code": "unauthorized",
                "message": "the API key is not valid (unknown or revoked)",
            }
        },
    )
    user = client.get("/metrics", headers={"Authorization": f"Bearer {user_key}"})
    assert (user.status_code, user.json()) == (
        403,
        {
            "error": {
                "code": "forbidden",
                "message": "/metrics needs a service key; a user's key cannot read it",
            }
        },
    )
    text = scrape(client, Authorization=f"Bearer {SERVICE_KEY}")
    assert series(text, "kvmem_http_requests_total") == {
        ("/metrics", "GET", "401"): 2,
        ("/metrics", "GET", "403"): 1,
    }


def test_local_mode_metrics_are_open(make_client: MakeClient) -> None:
    client = make_client()
    scrape(client)
    assert series(scrape(client), "kvmem_http_requests_total") == {("/metrics", "GET", "200"): 1}


def test_scrape_benchmark_runs_in_its_short_mode() -> None:
    from tests.bench.metrics_scrape import measure

    result = measure(series=100, scrapes=5)
    assert result["series"] >= 100
    assert result["scrapes"] == 5


def test_runs_in_flight_is_a_live_gauge(
    make_client: MakeClient, chat_sections: Callable[..., dict[str, Any]], upstream: Any
) -> None:
    upstream.script(AGENT_MODEL, Reply(hang=True))
    client = make_client(**chat_sections(agent={"grace_seconds": 30}, server={"drain_seconds": 0}))
    assert client.post("/chat", json={"message": "hi"}).json()["memory"]["agent"] == "running"
    upstream.wait_for(AGENT_MODEL)
    assert series(scrape(client), "kvmem_agent_runs_in_flight") == {(): 1}


class ExplodingClient:
    """A model client with a bug: every call raises something kvmem does not know."""

    async def complete(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        raise ZeroDivisionError("a bug")

    async def aclose(self) -> None:
        pass


def test_a_bug_is_counted_as_a_500(
    make_config: Callable[..., Any], database: Any, tokens: Any
) -> None:
    from kvmem.server.app import create_app

    config = make_config(chat={"model": f"openai/{MAIN_MODEL}"})
    client: Any = ExplodingClient()
    app = create_app(config, database=database, tokens=tokens, client=client)
    with TestClient(app, base_url=LOCAL_URL, raise_server_exceptions=False) as http:
        assert http.post("/chat", json={"message": "hi"}).status_code == 500
        text = scrape(http)
    assert series(text, "kvmem_http_requests_total") == {("/chat", "POST", "500"): 1}
    assert series(text, "kvmem_errors_total") == {("internal_error",): 1}


def test_routes_inside_mounts_are_labelled_with_the_whole_template() -> None:
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.responses import PlainTextResponse
    from starlette.routing import Mount, Route

    from kvmem.metrics import Metrics, MetricsMiddleware

    async def hello(request: Any) -> PlainTextResponse:
        return PlainTextResponse("hi")

    async def plain_asgi(scope: Any, receive: Any, send: Any) -> None:
        await PlainTextResponse("asset")(scope, receive, send)

    metrics = Metrics()
    app = Starlette(
        routes=[
            Mount("/api", routes=[Route("/items/{item_id}", hello)]),
            Mount("/static", app=plain_asgi),
        ],
        middleware=[Middleware(MetricsMiddleware, metrics=metrics)],
    )
    with TestClient(app) as client:
        for path in ("/api/items/1", "/api/items/2", "/static/a.css", "/static/js/b.js"):
            assert client.get(path).status_code == 200
    assert series(metrics.render().decode(), "kvmem_http_requests_total") == {
        ("/api/items/{item_id}", "GET", "200"): 2,
        ("/static", "GET", "200"): 2,
    }


def mcp_call(client: Any, tool: str, arguments: dict[str, Any]) -> Any:
    """One MCP tools/call over /mcp (stateless JSON mode, as an MCP client sends it)."""
    response = client.post(
        "/mcp",
        json={
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": tool, "arguments": arguments},
        },
        headers={"Accept": "application/json, text/event-stream"},
    )
    assert response.status_code == 200, response.text
    return response.json()["result"]


def test_every_write_path_is_counted_with_its_source(make_client: MakeClient) -> None:
    client = make_client()
    assert client.put("/memory/food", json={"value": "pizza"}).status_code == 201
    assert client.put("/memory/food", json={"value": "pasta"}).status_code == 200
    first = client.get("/memory/food/history").json()["changes"][-1]["id"]
    assert client.post("/memory/food/revert", json={"to": first}).status_code == 200
    document = {"memories": [{"key": "city", "value": "Rome"}, {"key": "pet", "value": "cat"}]}
    assert client.post("/memory/import?mode=replace", json=document).status_code == 200
    assert mcp_call(client, "memory_set", {"key": "tea", "value": "green"})["isError"] is False
    assert mcp_call(client, "memory_delete", {"key": "tea"})["isError"] is False

    assert series(scrape(client), "kvmem_memory_writes_total") == {
        ("manual", "set"): 2,
        ("revert", "set"): 1,
        ("import", "set"): 2,
        ("import", "delete"): 1,  # replace dropped "food"
        ("mcp", "set"): 1,
        ("mcp", "delete"): 1,
    }
