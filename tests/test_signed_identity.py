"""`auth.jwt` (CONTRACT section 22): a service-key request names its user with a signed token,
as Open WebUI sends it with `FORWARD_USER_INFO_HEADER_JWT_SECRET`; every token that does not
verify is 401 saying why, never a fall-back to the plain user-id headers."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jwt
import pytest
from starlette.testclient import TestClient

from kvmem.config_loader import ConfigError, parse_config
from kvmem.db.engine import Database
from kvmem.server.credentials import KeyStore

MakeClient = Callable[..., TestClient]
SERVICE_KEY = "svc-0123456789abcdef"
SECRET = "open-webui-forwarding-secret-0123456789"  # 39 bytes: enough for HS256
HEADER = "X-OpenWebUI-User-Jwt"


@pytest.fixture
def keys(database: Database) -> KeyStore:
    return KeyStore(database)


def keys_mode(**jwt_config: Any) -> dict[str, Any]:
    return {
        "mode": "keys",
        "service_keys": [SERVICE_KEY],
        "jwt": {"secret": SECRET, **jwt_config},
    }


def now() -> int:
    return int(time.time())


def open_webui_token(
    user_id: Any = "3f2c9a1e-5b7d-4e8f-9a0b-1c2d3e4f5a6b",
    *,
    secret: str = SECRET,
    algorithm: str = "HS256",
    drop: tuple[str, ...] = (),
    **claims: Any,
) -> str:
    """A token as Open WebUI 0.12.4 mints it (`_mint_forward_user_jwt`, utils/headers.py)."""
    now = int(time.time())
    payload = {
        "sub": user_id,
        "email": "ada@example.com",
        "name": "Ada",
        "role": "user",
        "iss": "open-webui",
        "iat": now,
        "exp": now + 300,
        **claims,
    }
    for claim in drop:
        payload.pop(claim)
    return jwt.encode(payload, secret, algorithm=algorithm)


def unsigned(payload: dict[str, Any]) -> str:
    """An `alg: none` token: a header, a payload and no signature."""

    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part(payload)}."


def service(token: str | None = None, **headers: str) -> dict[str, str]:
    sent = {"Authorization": f"Bearer {SERVICE_KEY}", **headers}
    if token is not None:
        sent[HEADER] = token
    return sent


def refusal(response: Any) -> tuple[int, str, str]:
    error = response.json()["error"]
    return response.status_code, error["code"], error["message"]


def test_a_signed_user_is_the_user_the_request_acts_for(make_client: MakeClient) -> None:
    client = make_client(auth=keys_mode())
    user = "3f2c9a1e-5b7d-4e8f-9a0b-1c2d3e4f5a6b"
    put = client.put("/memory/city", json={"value": "Lisbon"}, headers=service(open_webui_token()))
    assert put.status_code == 201, put.text
    # The same user named by the plain header (not required) sees the entry; another does not.
    assert client.get("/memory/city", headers=service(**{"X-User-Id": user})).status_code == 200
    assert client.get("/memory/city", headers=service(**{"X-User-Id": "bob"})).status_code == 404
    # Naming the same user in a plain header beside the token is fine.
    same = service(open_webui_token(), **{"X-OpenWebUI-User-Id": user})
    assert client.get("/memory/city", headers=same).status_code == 200


REFUSED = [
    pytest.param(
        lambda: open_webui_token(exp=now() - 3600, iat=now() - 3900),
        "it has expired (exp)",
        id="expired",
    ),
    pytest.param(
        lambda: open_webui_token(secret="another-secret-of-enough-length-0123456789"),
        "its signature does not match auth.jwt.secret",
        id="bad-signature",
    ),
    pytest.param(
        lambda: open_webui_token(iss="someone-else"),
        "its issuer (iss) is not 'open-webui'",
        id="wrong-issuer",
    ),
    pytest.param(
        lambda: unsigned({"sub": "alice", "iss": "open-webui", "exp": now() + 300}),
        "it is not signed with HS256 (auth.jwt.algorithms)",
        id="alg-none",
    ),
    pytest.param(
        lambda: open_webui_token(algorithm="HS512", secret=SECRET * 2),
        "it is not signed with HS256 (auth.jwt.algorithms)",
        id="unlisted-algorithm",
    ),
    pytest.param(lambda: "not-a-token", "it is not a well-formed JSON Web Token", id="malformed"),
    pytest.param(lambda: "a.b.c", "it is not a well-formed JSON Web Token", id="malformed-parts"),
    pytest.param(lambda: "", "it is not a JSON Web Token", id="empty"),
    pytest.param(
        lambda: open_webui_token(drop=("sub",)), "it has no 'sub' claim", id="missing-sub"
    ),
    pytest.param(
        lambda: open_webui_token(drop=("exp",)), "it has no 'exp' claim", id="missing-exp"
    ),
    pytest.param(
        lambda: open_webui_token(drop=("iss",)), "it has no 'iss' claim", id="missing-iss"
    ),
    pytest.param(
        lambda: open_webui_token("bob smith!"),
        "its 'sub' claim is not a user id (1-128 characters of A-Z, a-z, 0-9, . _ @ -)",
        id="invalid-user-id",
    ),
    pytest.param(
        lambda: open_webui_token(12345),
        "its 'sub' claim is not a user id (1-128 characters of A-Z, a-z, 0-9, . _ @ -)",
        id="user-id-not-a-string",
    ),
    pytest.param(
        lambda: open_webui_token(nbf=now() + 3600),
        "it is not valid yet (nbf or iat in the future)",
        id="not-yet-valid",
    ),
]


@pytest.mark.parametrize(("mint", "why"), REFUSED)
def test_a_token_that_does_not_verify_is_401_saying_why_with_no_fall_back(
    make_client: MakeClient, mint: Callable[[], str], why: str
) -> None:
    """Each token is made when the test runs (a token made at collection would expire on a
    long run)."""
    token = mint()
    client = make_client(auth=keys_mode())
    # The plain headers name a valid user: they must not be used instead.
    headers = service(token, **{"X-User-Id": "alice", "X-OpenWebUI-User-Id": "alice"})
    for response in (
        client.get("/memory", headers=headers),
        client.put("/memory/city", json={"value": "Rome"}, headers=headers),
        client.post(
            "/v1/chat/completions",
            json={"model": "x", "messages": [{"role": "user", "content": "hi"}]},
            headers=headers,
        ),
    ):
        status, code, message = refusal(response)
        assert (status, code, message) == (
            401,
            "unauthorized" if not response.url.path.startswith("/v1") else code,
            f"the {HEADER} token does not verify: {why}",
        )
    alice = client.get("/memory", headers=service(**{"X-User-Id": "alice"}))
    assert alice.json()["memories"] == []  # nothing was written for anyone


def test_the_leeway_admits_a_clock_a_little_behind(make_client: MakeClient) -> None:
    client = make_client(auth=keys_mode(leeway_seconds=60))
    late = open_webui_token(exp=int(time.time()) - 30)
    assert client.get("/memory", headers=service(late)).status_code == 200
    strict = make_client(auth=keys_mode(leeway_seconds=0))
    assert strict.get("/memory", headers=service(late)).status_code == 401


def test_a_plain_header_naming_someone_else_is_403(make_client: MakeClient) -> None:
    client = make_client(auth=keys_mode())
    for other in ({"X-User-Id": "mallory"}, {"X-OpenWebUI-User-Id": "mallory"}):
        status, code, message = refusal(
            client.get("/memory", headers=service(open_webui_token(), **other))
        )
        assert (status, code) == (403, "forbidden")
        assert message.startswith(f"the {HEADER} token names another user")


def test_required_refuses_a_service_key_request_without_the_token(
    make_client: MakeClient,
) -> None:
    client = make_client(auth=keys_mode(required=True))
    for headers in (service(), service(**{"X-User-Id": "alice"})):
        assert refusal(client.get("/memory", headers=headers)) == (
            401,
            "unauthorized",
            f"a service-key request must carry the signed {HEADER} token "
            "(auth.jwt.required is true)",
        )
    assert client.get("/memory", headers=service(open_webui_token())).status_code == 200


def test_without_required_plain_headers_still_work(make_client: MakeClient) -> None:
    client = make_client(auth=keys_mode())
    assert client.get("/memory", headers=service(**{"X-User-Id": "alice"})).status_code == 200


def test_a_user_key_ignores_the_token(make_client: MakeClient, keys: KeyStore) -> None:
    client = make_client(auth=keys_mode(required=True))
    _, secret = keys.create("alice")
    headers = {"Authorization": f"Bearer {secret}", HEADER: "garbage"}
    assert client.put("/memory/k", json={"value": "v"}, headers=headers).status_code == 201
    assert client.get("/memory/k", headers=service(**{"X-User-Id": "alice"})).status_code == 401
    assert client.get("/memory/k", headers={"Authorization": f"Bearer {secret}"}).status_code == 200


def test_a_custom_header_claim_and_issuer(make_client: MakeClient) -> None:
    client = make_client(
        auth=keys_mode(header="X-Signed-User", user_claim="uid", issuer="my-front-end")
    )
    token = jwt.encode(
        {"uid": "carol", "iss": "my-front-end", "exp": int(time.time()) + 60}, SECRET, "HS256"
    )
    headers = {"Authorization": f"Bearer {SERVICE_KEY}", "X-Signed-User": token}
    assert client.put("/memory/k", json={"value": "v"}, headers=headers).status_code == 201
    assert client.get("/memory/k", headers=service(**{"X-User-Id": "carol"})).status_code == 200


@pytest.mark.parametrize(
    ("jwt_config", "problem"),
    [
        ({"secret": "short"}, "auth.jwt.secret must be at least 32 bytes for HS256"),
        (
            {"secret": SECRET, "algorithms": ["HS256", "HS512"]},
            "auth.jwt.secret must be at least 64 bytes for HS256, HS512",
        ),
        ({"secret": SECRET, "algorithms": ["none"]}, "auth.jwt.algorithms"),
        ({"secret": SECRET, "algorithms": ["RS256"]}, "auth.jwt.algorithms"),
        ({"secret": SECRET, "algorithms": []}, "auth.jwt.algorithms"),
        ({"header": HEADER}, "auth.jwt.secret"),
    ],
)
def test_a_bad_jwt_config_is_refused_naming_the_field_and_hiding_the_secret(
    tmp_path: Path, jwt_config: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config({"auth": {"mode": "keys", "jwt": jwt_config}}, tmp_path / "memory.yaml", {})
    assert problem in str(raised.value)
    assert "short" not in str(raised.value).replace("at least", "")
    assert SECRET not in str(raised.value)
