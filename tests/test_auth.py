"""Who a request acts for: local mode, user keys, service keys; nobody sees another's data."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from starlette.testclient import TestClient

from kvmem import __version__
from kvmem.config import AuthConfig
from kvmem.db.engine import Database
from kvmem.errors import BadRequest, NotFound
from kvmem.memory.store import MemoryStore
from kvmem.server.auth import Authenticator, check_user_id
from kvmem.server.credentials import SECRET_PREFIX, KeyStore, hash_secret
from tests.support.matchers import ISO_TIME, entry

MakeClient = Callable[..., TestClient]
SERVICE_KEY = "svc-0123456789abcdef"
KEYS_MODE = {"mode": "keys", "service_keys": [SERVICE_KEY]}


def error(status: int, code: str, message: str) -> tuple[int, dict[str, Any]]:
    return status, {"error": {"code": code, "message": message}}


def answer(response: Any) -> tuple[int, Any]:
    return response.status_code, response.json()


def bearer(secret: str, user: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {secret}"}
    if user is not None:
        headers["X-User-Id"] = user
    return headers


MISSING = error(401, "unauthorized", "missing credentials: send Authorization: Bearer <key>")
NOT_BEARER = error(401, "unauthorized", "expected Authorization: Bearer <key>")
INVALID = error(401, "unauthorized", "the API key is not valid (unknown or revoked)")
OTHER_USER = error(
    403, "forbidden", "a user key acts only for its own user; drop X-User-Id or use a service key"
)
NO_USER = error(400, "bad_request", "a service key must name the user: send the X-User-Id header")


@pytest.fixture
def keys(database: Database) -> KeyStore:
    return KeyStore(database)


# -- local mode --------------------------------------------------------------------------------


@pytest.mark.slow
def test_local_mode_needs_no_credentials_and_is_user_local(
    make_client: MakeClient, make_store: Callable[..., MemoryStore]
) -> None:
    client = make_client()
    assert client.put("/memory/k", json={"value": "v"}).status_code == 201
    # X-User-Id and any Authorization are ignored: there is one user.
    assert (
        client.put("/memory/j", json={"value": "w"}, headers=bearer("whatever", "bob")).status_code
        == 201
    )
    store = make_store()
    assert [e.key for e in store.snapshot("local").entries] == ["k", "j"]
    assert store.snapshot("bob").entries == ()


# -- keys mode: credentials --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/memory"),
        ("DELETE", "/memory"),
        ("GET", "/memory/k"),
        ("PUT", "/memory/k"),
        ("DELETE", "/memory/k"),
        ("GET", "/preferences"),
        ("PATCH", "/preferences"),
        ("GET", "/memory/proposals"),
        ("DELETE", "/memory/proposals"),
        ("POST", "/memory/proposals/1/accept"),
        ("POST", "/memory/proposals/1/reject"),
    ],
)
def test_every_route_needs_a_key(make_client: MakeClient, method: str, path: str) -> None:
    client = make_client(auth=KEYS_MODE)
    body = {"value": "v"} if method == "PUT" else {"memories": False} if method == "PATCH" else None
    assert answer(client.request(method, path, json=body)) == MISSING
    assert (
        answer(client.request(method, path, json=body, headers={"X-User-Id": "alice"})) == MISSING
    )


@pytest.mark.parametrize(
    ("authorization", "expected"),
    [
        ("Basic YWxpY2U6cHc=", NOT_BEARER),
        ("Bearer", NOT_BEARER),
        ("Bearer    ", NOT_BEARER),
        ("Token kvm_abc", NOT_BEARER),
        ("Bearer kvm_not_a_real_key", INVALID),
        ("Bearer svc-0123456789abcdeF", INVALID),
    ],
)
def test_wrong_credentials_are_401(
    make_client: MakeClient, authorization: str, expected: Any
) -> None:
    client = make_client(auth=KEYS_MODE)
    assert answer(client.get("/memory", headers={"Authorization": authorization})) == expected


# /healthz's agent object when memory.yaml configures no agent.
NO_AGENT = {
    "enabled": False,
    "ready": False,
    "reason": "memory.agent is not configured",
    "last_error": None,
}


def test_healthz_is_open_without_a_key(make_client: MakeClient) -> None:
    response = make_client(auth=KEYS_MODE).get("/healthz")
    assert answer(response) == (
        200,
        {"status": "ok", "version": __version__, "store": "ok", "agent": NO_AGENT},
    )


# -- user keys ---------------------------------------------------------------------------------


def test_user_key_acts_for_its_user(make_client: MakeClient, keys: KeyStore) -> None:
    client = make_client(auth=KEYS_MODE)
    _, secret = keys.create("alice")
    assert client.put("/memory/k", json={"value": "v"}, headers=bearer(secret)).status_code == 201
    assert answer(client.get("/memory/k", headers=bearer(secret))) == (200, entry("k", "v", 1))
    # Naming oneself is fine; the scheme is case-insensitive.
    assert client.get("/memory/k", headers=bearer(secret, "alice")).status_code == 200
    assert client.get("/memory/k", headers={"Authorization": f"bearer {secret}"}).status_code == 200
    # Through a service key, alice's entry is there.
    assert answer(client.get("/memory/k", headers=bearer(SERVICE_KEY, "alice"))) == (
        200,
        entry("k", "v", 1),
    )


def test_user_key_naming_someone_else_is_403(make_client: MakeClient, keys: KeyStore) -> None:
    client = make_client(auth=KEYS_MODE)
    _, secret = keys.create("alice")
    keys.create("bob")
    for method, path in [("GET", "/memory"), ("PUT", "/memory/k"), ("DELETE", "/memory")]:
        body = {"value": "v"} if method == "PUT" else None
        response = client.request(method, path, json=body, headers=bearer(secret, "bob"))
        assert answer(response) == OTHER_USER
    assert answer(client.get("/memory", headers=bearer(SERVICE_KEY, "bob")))[1]["memories"] == []


def test_user_key_with_an_invalid_user_id_is_400(make_client: MakeClient, keys: KeyStore) -> None:
    client = make_client(auth=KEYS_MODE)
    _, secret = keys.create("alice")
    response = client.get("/memory", headers=bearer(secret, "not valid!"))
    assert answer(response) == error(
        400,
        "bad_request",
        "invalid user id 'not valid!': use 1-128 characters of A-Z, a-z, 0-9, . _ @ -",
    )


def test_revoked_key_is_401_at_once(make_client: MakeClient, keys: KeyStore) -> None:
    client = make_client(auth=KEYS_MODE)
    info, secret = keys.create("alice")
    _, other = keys.create("alice")
    assert client.get("/memory", headers=bearer(secret)).status_code == 200
    assert keys.revoke(info.id).revoked_at is not None
    assert answer(client.get("/memory", headers=bearer(secret))) == INVALID
    assert client.get("/memory", headers=bearer(other)).status_code == 200


def test_key_text_must_match_exactly(make_client: MakeClient, keys: KeyStore) -> None:
    client = make_client(auth=KEYS_MODE)
    _, secret = keys.create("alice")
    for wrong in [secret.upper(), secret[:-1], secret + "x", secret[len(SECRET_PREFIX) :]]:
        assert answer(client.get("/memory", headers=bearer(wrong))) == INVALID


# -- service keys ------------------------------------------------------------------------------


def test_service_key_needs_x_user_id(make_client: MakeClient) -> None:
    client = make_client(auth=KEYS_MODE)
    assert answer(client.get("/memory", headers=bearer(SERVICE_KEY))) == NO_USER
    assert answer(client.get("/memory", headers=bearer(SERVICE_KEY, ""))) == NO_USER


def test_service_key_acts_for_the_named_user(
    make_client: MakeClient, make_store: Callable[..., MemoryStore]
) -> None:
    client = make_client(auth=KEYS_MODE)
    assert (
        client.put(
            "/memory/k", json={"value": "bob's"}, headers=bearer(SERVICE_KEY, "bob")
        ).status_code
        == 201
    )
    assert (
        client.put(
            "/memory/k", json={"value": "eve's"}, headers=bearer(SERVICE_KEY, "eve@x.org")
        ).status_code
        == 201
    )
    store = make_store()
    assert [e.value for e in store.snapshot("bob").entries] == ["bob's"]
    assert [e.value for e in store.snapshot("eve@x.org").entries] == ["eve's"]


@pytest.mark.parametrize(
    "user_id",
    ["a b", "a/b", "ü", "x" * 129, "alice\u200b", "a,b", "<script>", "a\tb", "*"],
)
def test_invalid_user_ids_are_400(make_client: MakeClient, user_id: str) -> None:
    client = make_client(auth=KEYS_MODE)
    headers = {"Authorization": f"Bearer {SERVICE_KEY}", "X-User-Id": user_id}
    response = client.get("/memory", headers={k: v.encode("utf-8") for k, v in headers.items()})
    seen = user_id.encode("utf-8").decode("latin-1")  # HTTP header bytes, as the server reads them
    assert answer(response) == error(
        400,
        "bad_request",
        f"invalid user id {seen!r}: use 1-128 characters of A-Z, a-z, 0-9, . _ @ -",
    )


@pytest.mark.parametrize("user_id", ["a", "A.b_c-d@e", "x" * 128, "0", "user@example.com"])
def test_valid_user_ids(user_id: str) -> None:
    assert check_user_id(user_id) == user_id


def test_check_user_id_refuses_the_empty_id() -> None:
    with pytest.raises(BadRequest):
        check_user_id("")


# -- isolation ---------------------------------------------------------------------------------


def test_another_users_entries_are_invisible(make_client: MakeClient, keys: KeyStore) -> None:
    client = make_client(auth=KEYS_MODE)
    _, alice = keys.create("alice")
    _, bob = keys.create("bob")

    before = {
        "get": answer(client.get("/memory/diary", headers=bearer(bob))),
        "delete": answer(client.delete("/memory/diary", headers=bearer(bob))),
    }
    assert (
        client.put(
            "/memory/diary", json={"value": "alice's secret"}, headers=bearer(alice)
        ).status_code
        == 201
    )
    after = {
        "get": answer(client.get("/memory/diary", headers=bearer(bob))),
        "delete": answer(client.delete("/memory/diary", headers=bearer(bob))),
    }
    # Exactly as if the key did not exist at all.
    assert (
        after
        == before
        == {
            "get": error(404, "not_found", "no memory with key 'diary'"),
            "delete": error(404, "not_found", "no memory with key 'diary'"),
        }
    )
    listing = client.get("/memory", headers=bearer(bob)).json()
    assert (listing["memories"], listing["total_tokens"]) == ([], 0)
    assert answer(client.delete("/memory", headers=bearer(bob))) == (200, {"deleted": 0})
    # bob's own entry under the same key is his own.
    assert (
        client.put("/memory/diary", json={"value": "bob's"}, headers=bearer(bob)).status_code == 201
    )
    assert client.get("/memory/diary", headers=bearer(alice)).json()["value"] == "alice's secret"
    assert client.get("/memory/diary", headers=bearer(bob)).json()["value"] == "bob's"


def test_preferences_are_per_user(make_client: MakeClient, keys: KeyStore) -> None:
    client = make_client(auth=KEYS_MODE)
    _, alice = keys.create("alice")
    _, bob = keys.create("bob")
    assert answer(
        client.patch("/preferences", json={"memories": False}, headers=bearer(alice))
    ) == (
        200,
        {"memories": False, "review": False},
    )
    assert answer(client.get("/preferences", headers=bearer(bob))) == (
        200,
        {"memories": True, "review": False},
    )
    assert answer(client.get("/preferences", headers=bearer(alice))) == (
        200,
        {"memories": False, "review": False},
    )


# -- the key store -----------------------------------------------------------------------------


def test_keys_are_stored_as_hashes_only(keys: KeyStore, database: Database) -> None:
    info, secret = keys.create("alice")
    assert secret.startswith(SECRET_PREFIX) and len(secret) > 40
    assert info.as_json() == {
        "id": info.id,
        "user_id": "alice",
        "prefix": secret[:12],
        "created_at": ISO_TIME,
        "revoked_at": None,
    }
    with database.engine.connect() as connection:
        rows = connection.exec_driver_sql("SELECT * FROM api_keys").all()
    assert len(rows) == 1
    assert secret not in repr(rows)
    assert hash_secret(secret) in repr(rows)
    assert keys.user_for(secret) == "alice"
    assert keys.user_for(secret + "x") is None


def test_key_listing_and_revoking(keys: KeyStore) -> None:
    a1, _ = keys.create("alice")
    b1, _ = keys.create("bob")
    a2, _ = keys.create("alice")
    assert [k.id for k in keys.list()] == [a1.id, b1.id, a2.id]
    assert [k.id for k in keys.list("alice")] == [a1.id, a2.id]
    with pytest.raises(NotFound):
        keys.revoke(a1.id, user_id="bob")
    with pytest.raises(NotFound):
        keys.revoke("key_nope")
    revoked = keys.revoke(a1.id, user_id="alice")
    assert revoked.as_json()["revoked_at"] == ISO_TIME
    # Revoking twice keeps the first time.
    assert keys.revoke(a1.id).revoked_at == revoked.revoked_at


def test_authenticator_directly(keys: KeyStore) -> None:
    auth = Authenticator(AuthConfig(mode="keys", service_keys=[SERVICE_KEY]), keys)
    assert auth.identify({"authorization": f"Bearer {SERVICE_KEY}"}, body_user="carol") == "carol"
    # X-User-Id wins over the body's user.
    assert (
        auth.identify(
            {"authorization": f"Bearer {SERVICE_KEY}", "x-user-id": "dave"}, body_user="carol"
        )
        == "dave"
    )
    _, secret = keys.create("alice")
    # With a user key the body's user is ignored.
    assert auth.identify({"authorization": f"Bearer {secret}"}, body_user="mallory") == "alice"
    local = Authenticator(AuthConfig(), keys)
    assert local.identify({}) == "local"
    assert (local.needs_lookup, auth.needs_lookup) == (False, True)
