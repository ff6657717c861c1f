"""Session tokens (CONTRACT section 14): minted by a key, short-lived, hashed at rest, accepted
on the user's own routes only, and ended on request."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text
from starlette.testclient import TestClient

from kvmem.config import Config
from kvmem.config_loader import parse_config
from kvmem.db.engine import Database
from kvmem.errors import ConfigError, Unauthorized
from kvmem.server.auth import accepts_session
from kvmem.server.credentials import KeyStore
from kvmem.server.sessions import SessionStore
from tests.support.apps import MAIN_MODEL
from tests.support.matchers import ISO_TIME, entry

MakeClient = Callable[..., TestClient]
SERVICE_KEY = "svc-sessions-9f8e7d6c5b"
KEYS_MODE = {"mode": "keys", "service_keys": [SERVICE_KEY]}
SESSION_ONLY_ROUTES = (
    "a session token works only on /memory, /preferences, /usage, /conversations, /me, /mcp, "
    "/sessions and starts no model call (POST /memory/agent); use an API key for this route"
)
NOT_VALID = {
    "error": {
        "code": "unauthorized",
        "message": "the session token is not valid (unknown, ended or expired)",
    }
}


def bearer(secret: str, user: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {secret}"}
    if user is not None:
        headers["X-User-Id"] = user
    return headers


def answer(response: Any) -> tuple[int, Any]:
    return response.status_code, (response.json() if response.content else None)


def mint(client: TestClient, headers: dict[str, str]) -> str:
    made = client.post("/sessions", headers=headers)
    assert made.status_code == 201, made.text
    return made.json()["token"]


@pytest.fixture
def keys(database: Database) -> KeyStore:
    return KeyStore(database)


def test_a_user_key_mints_a_session_that_acts_for_its_user(
    make_client: MakeClient, keys: KeyStore
) -> None:
    client = make_client(auth=KEYS_MODE)
    _, alice_key = keys.create("alice")
    before = datetime.now(UTC)
    made = client.post("/sessions", headers=bearer(alice_key))
    after = datetime.now(UTC)

    assert answer(made) == (201, {"token": made.json()["token"], "expires_at": ISO_TIME})
    token = made.json()["token"]
    assert token.startswith("kvs_") and len(token) == 4 + 43  # 256 random bits, base64url
    expires = datetime.fromisoformat(made.json()["expires_at"])
    assert before + timedelta(seconds=3600) <= expires <= after + timedelta(seconds=3600)

    session = bearer(token)
    assert answer(client.put("/memory/fact", json={"value": "likes tea"}, headers=session)) == (
        201,
        {"memory": entry("fact", "likes tea", 2), "total_tokens": 2, "token_limit": None},
    )
    assert answer(client.get("/memory/fact", headers=bearer(alice_key))) == (
        200,
        entry("fact", "likes tea", 2),
    )  # written as alice
    assert answer(client.patch("/preferences", json={"memories": False}, headers=session)) == (
        200,
        {"memories": False, "review": False},
    )
    assert answer(client.get("/conversations", headers=session)) == (
        200,
        {"conversations": [], "next": None},
    )
    assert answer(client.delete("/memory", headers=session)) == (200, {"deleted": 1})


def test_a_service_key_mints_a_session_for_the_user_it_names(
    make_client: MakeClient, keys: KeyStore
) -> None:
    client = make_client(auth=KEYS_MODE)
    assert answer(client.post("/sessions", headers=bearer(SERVICE_KEY))) == (
        400,
        {
            "error": {
                "code": "bad_request",
                "message": "a service key must name the user: send the X-User-Id header",
            }
        },
    )
    token = mint(client, bearer(SERVICE_KEY, "bob"))
    client.put("/memory/fact", json={"value": "bob's"}, headers=bearer(token))
    assert answer(client.get("/memory/fact", headers=bearer(SERVICE_KEY, "bob"))) == (
        200,
        entry("fact", "bob's", 2),
    )


def test_local_mode_mints_sessions_for_user_local(make_client: MakeClient) -> None:
    client = make_client()
    made = client.post("/sessions")
    assert answer(made) == (201, {"token": made.json()["token"], "expires_at": ISO_TIME})
    assert answer(client.delete("/sessions/current", headers=bearer(made.json()["token"]))) == (
        204,
        None,
    )
    assert answer(client.delete("/sessions/current")) == (
        400,
        {
            "error": {
                "code": "bad_request",
                "message": "this request is not made with a session token: send Authorization: Bearer <token>",
            }
        },
    )


def test_auth_session_seconds_sets_the_lifetime(make_client: MakeClient, keys: KeyStore) -> None:
    client = make_client(auth={**KEYS_MODE, "session_seconds": 90})
    before = datetime.now(UTC)
    made = client.post("/sessions", headers=bearer(SERVICE_KEY, "alice"))
    after = datetime.now(UTC)
    expires = datetime.fromisoformat(made.json()["expires_at"])
    assert before + timedelta(seconds=90) <= expires <= after + timedelta(seconds=90)


@pytest.mark.parametrize("value", [0, -5, "soon"])
def test_auth_session_seconds_must_be_a_positive_number(tmp_path: Any, value: Any) -> None:
    with pytest.raises(ConfigError, match=r"auth\.session_seconds"):
        parse_config({"auth": {"session_seconds": value}}, tmp_path / "memory.yaml", {})
    assert Config().auth.session_seconds == 3600


def test_an_expired_session_answers_401(make_client: MakeClient, database: Database) -> None:
    client = make_client(auth=KEYS_MODE)
    an_hour_ago = datetime.now(UTC) - timedelta(hours=1)
    expired = SessionStore(database, 3599, clock=lambda: an_hour_ago).create("alice")
    live = SessionStore(database, 3601, clock=lambda: an_hour_ago).create("alice")
    assert answer(client.get("/memory", headers=bearer(expired.token))) == (401, NOT_VALID)
    assert client.get("/memory", headers=bearer(live.token)).status_code == 200


def test_a_session_ends_at_its_expiry_to_the_microsecond(database: Database) -> None:
    now = [datetime(2026, 1, 1, tzinfo=UTC)]
    sessions = SessionStore(database, 60, clock=lambda: now[0])
    made = sessions.create("alice")
    assert made.expires_at == datetime(2026, 1, 1, 0, 1, tzinfo=UTC)
    now[0] = made.expires_at - timedelta(microseconds=1)
    assert sessions.user_for(made.token) == "alice"
    now[0] = made.expires_at
    assert sessions.user_for(made.token) is None
    # The user's expired sessions are dropped when the next one is made.
    sessions.create("alice")
    with database.reading() as session:
        rows = session.execute(text("SELECT token_hash FROM sessions")).all()
    assert [row.token_hash for row in rows] != [hashlib.sha256(made.token.encode()).hexdigest()]
    assert len(rows) == 1


def test_delete_sessions_current_ends_only_the_token_in_use(
    make_client: MakeClient, keys: KeyStore
) -> None:
    client = make_client(auth=KEYS_MODE)
    _, alice_key = keys.create("alice")
    first, second = mint(client, bearer(alice_key)), mint(client, bearer(alice_key))
    assert answer(client.delete("/sessions/current", headers=bearer(first))) == (204, None)
    assert answer(client.get("/memory", headers=bearer(first))) == (401, NOT_VALID)
    assert answer(client.delete("/sessions/current", headers=bearer(first))) == (401, NOT_VALID)
    assert client.get("/memory", headers=bearer(second)).status_code == 200
    # A key is not a session: there is nothing to end, and the key keeps working.
    assert answer(client.delete("/sessions/current", headers=bearer(alice_key)))[0] == 400
    assert client.get("/memory", headers=bearer(alice_key)).status_code == 200


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/chat", {"message": "hi"}),
        (
            "POST",
            "/v1/chat/completions",
            {"model": f"openai/{MAIN_MODEL}", "messages": [{"role": "user", "content": "hi"}]},
        ),
        ("GET", "/v1/models", None),
        (
            "POST",
            "/memory/agent",
            {"messages": [{"role": "user", "content": "remember I like tea"}]},
        ),
    ],
)
def test_a_session_is_refused_on_the_model_routes(
    make_client: MakeClient,
    chat_sections: Any,
    upstream: Any,
    keys: KeyStore,
    method: str,
    path: str,
    body: Any,
) -> None:
    client = make_client(**chat_sections(auth=KEYS_MODE))
    _, alice_key = keys.create("alice")
    token = mint(client, bearer(alice_key))
    refused = client.request(method, path, json=body, headers=bearer(token))
    assert (refused.status_code, refused.json()["error"]["code"]) == (403, "forbidden")
    assert SESSION_ONLY_ROUTES in refused.json()["error"]["message"]
    assert upstream.requests == []
    # The same request with the key goes through: the refusal is the token's.
    assert client.request(method, path, json=body, headers=bearer(alice_key)).status_code != 403


def test_a_session_cannot_mint_sessions(make_client: MakeClient, keys: KeyStore) -> None:
    client = make_client(auth=KEYS_MODE)
    _, alice_key = keys.create("alice")
    token = mint(client, bearer(alice_key))
    assert answer(client.post("/sessions", headers=bearer(token))) == (
        403,
        {
            "error": {
                "code": "forbidden",
                "message": "a session token cannot create sessions; use a user key or a service key",
            }
        },
    )


def test_which_routes_accept_a_session() -> None:
    accepted = [
        "/memory",
        "/memory/fact",
        "/memory/fact/history",
        "/memory/export",
        "/preferences",
        "/usage",
        "/conversations",
        "/conversations/abc",
        "/me",
        "/mcp",
        "/sessions",
        "/sessions/current",
    ]
    refused = [
        "/chat",
        "/v1/chat/completions",
        "/v1/models",
        "/api/chat",
        "/api/generate",
        "/api/tags",
        "/metrics",
        "/healthz",
        "/memoryx",
        "/mex",
        "/message",
        "/",
        "/sessionsx",
    ]
    assert [path for path in accepted if accepts_session(path)] == accepted
    assert [path for path in refused if accepts_session(path)] == []
    # POST /memory/agent starts model calls; the other methods there are the key "agent".
    assert [accepts_session("/memory/agent", method) for method in ("POST", "GET", "PUT")] == [
        False,
        True,
        True,
    ]


def test_revoking_a_key_ends_the_sessions_of_its_user(
    make_client: MakeClient, keys: KeyStore, database: Database
) -> None:
    client = make_client(auth=KEYS_MODE)
    info, alice_key = keys.create("alice")
    _, bob_key = keys.create("bob")
    with_key, from_front_end = (
        mint(client, bearer(alice_key)),
        mint(client, bearer(SERVICE_KEY, "alice")),
    )
    bob = mint(client, bearer(bob_key))
    assert client.get("/memory", headers=bearer(with_key)).status_code == 200

    keys.revoke(info.id)
    # The schema does not say which key minted a session: every one of alice's ends.
    assert answer(client.get("/memory", headers=bearer(with_key))) == (401, NOT_VALID)
    assert answer(client.get("/memory", headers=bearer(from_front_end))) == (401, NOT_VALID)
    assert client.get("/memory", headers=bearer(bob)).status_code == 200
    # A session cannot be minted with the revoked key, even by a request already past auth.
    with pytest.raises(Unauthorized, match="the API key is not valid"):
        SessionStore(database, 60).create("alice", minted_with=alice_key)
    assert answer(client.post("/sessions", headers=bearer(alice_key))) == (
        401,
        {
            "error": {
                "code": "unauthorized",
                "message": "the API key is not valid (unknown or revoked)",
            }
        },
    )
    with database.reading() as session:
        users = [row[0] for row in session.execute(text("SELECT user_id FROM sessions"))]
    assert users == ["bob"]


def test_only_a_hash_of_a_token_is_stored(
    make_client: MakeClient, keys: KeyStore, database: Database
) -> None:
    client = make_client(auth=KEYS_MODE)
    _, alice_key = keys.create("alice")
    token = mint(client, bearer(alice_key))
    with database.reading() as session:
        rows = [row._asdict() for row in session.execute(text("SELECT * FROM sessions"))]
    assert [(row["user_id"], row["token_hash"]) for row in rows] == [
        ("alice", hashlib.sha256(token.encode()).hexdigest())
    ]
    stored = " ".join(str(value) for row in rows for value in row.values())
    assert token not in stored and token[4:] not in stored


def test_a_session_acts_for_its_own_user_only(make_client: MakeClient, keys: KeyStore) -> None:
    client = make_client(auth=KEYS_MODE)
    _, alice_key = keys.create("alice")
    _, bob_key = keys.create("bob")
    client.put("/memory/diary", json={"value": "alice's diary"}, headers=bearer(alice_key))
    alice, bob = mint(client, bearer(alice_key)), mint(client, bearer(bob_key))

    assert answer(client.get("/memory/diary", headers=bearer(bob))) == (
        404,
        {"error": {"code": "not_found", "message": "no memory with key 'diary'"}},
    )
    assert answer(client.get("/memory", headers=bearer(bob, "alice"))) == (
        403,
        {
            "error": {
                "code": "forbidden",
                "message": "a session token acts only for its own user; drop X-User-Id",
            }
        },
    )
    assert answer(client.get("/memory", headers=bearer(bob, "bob")))[0] == 200
    assert answer(client.delete("/memory", headers=bearer(bob))) == (200, {"deleted": 0})
    # bob ending his session leaves alice's working, and her memory as it was.
    assert answer(client.delete("/sessions/current", headers=bearer(bob))) == (204, None)
    assert answer(client.get("/memory/diary", headers=bearer(alice))) == (
        200,
        entry("diary", "alice's diary", 3),
    )
    # A token that was never minted, of the right shape, is refused like an ended one.
    assert answer(client.get("/memory", headers=bearer("kvs_" + "A" * 43))) == (401, NOT_VALID)


def test_delete_me_with_a_session_erases_the_user_and_ends_every_session(
    make_client: MakeClient, keys: KeyStore
) -> None:
    client = make_client(auth=KEYS_MODE)
    _, alice_key = keys.create("alice")
    first, second = mint(client, bearer(alice_key)), mint(client, bearer(alice_key))
    client.put("/memory/fact", json={"value": "likes tea"}, headers=bearer(first))
    erased = client.delete("/me", headers=bearer(first))
    assert erased.status_code == 200, erased.text
    assert (erased.json()["deleted"]["memories"], erased.json()["deleted"]["sessions"]) == (1, 2)
    assert answer(client.get("/memory", headers=bearer(second))) == (401, NOT_VALID)
