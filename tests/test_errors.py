"""The error tree: every class answers with a status, a code and an OpenAI `type`, and one
function chooses the body's shape for every handler, unexpected errors included."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

import kvmem.errors
from kvmem.errors import KvmemError, openai_error_body, openai_error_type
from tests.support.apps import LOCAL_URL, MAIN_MODEL

OPENAI_TYPES = {
    "invalid_request_error",
    "authentication_error",
    "permission_error",
    "rate_limit_error",
    "api_error",
}


def error_classes() -> Iterator[type[KvmemError]]:
    """KvmemError and every subclass, however deep."""
    pending: list[type[KvmemError]] = [KvmemError]
    while pending:
        cls = pending.pop()
        yield cls
        pending.extend(cls.__subclasses__())


def test_the_tree_is_complete() -> None:
    """Every error class defined in kvmem.errors is part of the tree this test walks."""
    defined = {
        value
        for value in vars(kvmem.errors).values()
        if isinstance(value, type) and issubclass(value, KvmemError)
    }
    assert defined <= set(error_classes())
    assert len(defined) >= 20


@pytest.mark.parametrize(
    "cls", sorted(error_classes(), key=lambda c: c.__name__), ids=lambda c: c.__name__
)
def test_every_error_class_has_a_status_a_code_and_an_openai_type(cls: type[KvmemError]) -> None:
    error = cls("what went wrong")
    assert 400 <= error.status <= 599
    assert error.code and error.code == error.code.lower()
    assert openai_error_type(error) in OPENAI_TYPES
    if error.status >= 500:
        assert openai_error_type(error) == "api_error"
    body = openai_error_body(error)
    assert body == {
        "error": {
            "code": error.code,
            "message": "what went wrong",
            "type": openai_error_type(error),
            "param": None,
        }
    }


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/chat", {"error": "upstream said no"}),
        ("/api/tags", {"error": "upstream said no"}),
        (
            "/v1/chat/completions",
            {
                "error": {
                    "code": "upstream_rejected",
                    "message": "upstream said no",
                    "type": "invalid_request_error",
                    "param": "messages",
                }
            },
        ),
        ("/chat", {"error": {"code": "upstream_rejected", "message": "upstream said no"}}),
        ("/memory/k", {"error": {"code": "upstream_rejected", "message": "upstream said no"}}),
        ("", {"error": {"code": "upstream_rejected", "message": "upstream said no"}}),
        ("/apis", {"error": {"code": "upstream_rejected", "message": "upstream said no"}}),
    ],
)
def test_error_body_takes_the_shape_of_the_paths_api(path: str, body: dict[str, Any]) -> None:
    """Ollama's string under /api/, OpenAI's object (the upstream's own fields) under /v1/,
    kvmem's everywhere else, the protocol's refusals before any route (no path) included."""
    error = kvmem.errors.UpstreamRejected(
        "upstream said no", upstream={"type": "invalid_request_error", "param": "messages"}
    )
    assert kvmem.errors.error_body(path, error) == body


def test_codes_are_unique_per_class() -> None:
    """Two classes with one code would make clients unable to tell them apart."""
    seen: dict[str, type[KvmemError]] = {}
    for cls in error_classes():
        if cls.code in seen and cls.status != seen[cls.code].status:
            pytest.fail(f"{cls.__name__} and {seen[cls.code].__name__} share {cls.code!r}")
        seen.setdefault(cls.code, cls)


class ExplodingClient:
    """A model client with a bug: every call raises something kvmem does not know."""

    async def complete(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        raise ZeroDivisionError("a bug")

    async def aclose(self) -> None:
        pass


@pytest.fixture
def exploding(make_config: Callable[..., Any], database: Any, tokens: Any) -> Iterator[TestClient]:
    from kvmem.server.app import create_app

    config = make_config(chat={"model": f"openai/{MAIN_MODEL}"})
    app = create_app(config, database=database, tokens=tokens, client=ExplodingClient())  # type: ignore[arg-type]
    with TestClient(app, base_url=LOCAL_URL, raise_server_exceptions=False) as client:
        yield client


def test_an_unexpected_error_under_v1_has_openai_fields(exploding: TestClient) -> None:
    response = exploding.post(
        "/v1/chat/completions",
        json={"model": f"openai/{MAIN_MODEL}", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert (response.status_code, response.json()) == (
        500,
        {
            "error": {
                "code": "internal_error",
                "message": "internal error; the server log has the details",
                "type": "api_error",
                "param": None,
            }
        },
    )


def test_an_unexpected_error_elsewhere_has_kvmem_fields(exploding: TestClient) -> None:
    response = exploding.post("/chat", json={"message": "hi", "memory": False})
    assert (response.status_code, response.json()) == (
        500,
        {
            "error": {
                "code": "internal_error",
                "message": "internal error; the server log has the details",
            }
        },
    )
    # Answered by Starlette's outermost layer, outside the middleware that adds these.
    assert (response.headers["x-content-type-options"], response.headers["cache-control"]) == (
        "nosniff",
        "no-store",
    )
