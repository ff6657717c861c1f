"""Who a request acts for: `local` mode's single user, a user key's owner, a session token's
user (on the routes that accept one), or the user a service key names in `X-User-Id` (or the
OpenAI body's `user`)."""

from __future__ import annotations

import hmac
import re
from collections.abc import Mapping

from kvmem.config import AuthConfig
from kvmem.errors import BadRequest, Forbidden, Unauthorized
from kvmem.server.credentials import KeyStore
from kvmem.server.sessions import SessionStore, is_session_token
from kvmem.server.signed_identity import SignedIdentity

LOCAL_USER = "local"
USER_ID_PATTERN = re.compile(r"[A-Za-z0-9._@-]{1,128}")
# The route families a session token acts on (CONTRACT section 14): the user's own data and
# the session itself. The model routes (/v1, /chat, /api) need a key, so that a token handed
# to a browser page cannot be spent on model calls.
SESSION_ROUTES = ("/memory", "/preferences", "/usage", "/conversations", "/me", "/mcp", "/sessions")
# Inside those families, the requests that start model calls (CONTRACT section 17).
MODEL_CALLS = frozenset({("POST", "/memory/agent")})


def accepts_session(path: str, method: str = "GET") -> bool:
    """Whether a `method` request to `path` may authenticate with a session token."""
    if (method, path) in MODEL_CALLS:
        return False
    return any(path == family or path.startswith(family + "/") for family in SESSION_ROUTES)


def check_user_id(user_id: str) -> str:
    """`user_id` if it is 1-128 characters of `[A-Za-z0-9._@-]`, else `BadRequest`."""
    if not USER_ID_PATTERN.fullmatch(user_id):
        raise BadRequest(
            f"invalid user id {user_id[:140]!r}: use 1-128 characters of A-Z, a-z, 0-9, . _ @ -"
        )
    return user_id


class Authenticator:
    """Resolves a request's user from its headers under the configured auth mode."""

    def __init__(
        self, config: AuthConfig, keys: KeyStore, sessions: SessionStore | None = None
    ) -> None:
        self.mode = config.mode
        self._service_keys = [key.get_secret_value().encode() for key in config.service_keys]
        self._user_headers = [name.lower() for name in config.user_id_headers]
        self._keys = keys
        self.sessions = sessions
        self._signed = SignedIdentity(config.jwt, USER_ID_PATTERN) if config.jwt else None

    @property
    def needs_lookup(self) -> bool:
        """Whether identifying a request may read the database (so run it off the loop)."""
        return self.mode == "keys"

    def identify(
        self,
        headers: Mapping[str, str],
        body_user: str | None = None,
        *,
        session_ok: bool = False,
    ) -> str:
        """The user id the request acts for, or the auth error it deserves.

        `session_ok`: the route is one of `SESSION_ROUTES`, so a session token is accepted.
        """
        if self.mode == "local":
            return LOCAL_USER
        secret = _bearer(headers.get("authorization"))
        if self._is_service_key(secret):
            if self._signed is not None:
                signed = self._signed_user(headers, body_user)
                if signed is not None:
                    return signed
            named = next((headers[h] for h in self._user_headers if h in headers), None)
            user_id = named or body_user
            if not user_id:
                raise BadRequest("a service key must name the user: send the X-User-Id header")
            return check_user_id(user_id)
        # A user key acts for its owner; only X-User-Id naming someone else is refused (a
        # front end's forwarded headers, like Open WebUI's, are not a claim of identity).
        named = headers.get("x-user-id")
        if self.sessions is not None and is_session_token(secret):
            return self._session_user(secret, named, session_ok)
        owner = self._keys.user_for(secret)
        if owner is None:
            raise Unauthorized("the API key is not valid (unknown or revoked)")
        if named is not None and check_user_id(named) != owner:
            raise Forbidden(
                "a user key acts only for its own user; drop X-User-Id or use a service key"
            )
        return owner

    def _signed_user(self, headers: Mapping[str, str], body_user: str | None) -> str | None:
        """The user a service-key request's signed token names (`auth.jwt`); None when it
        carries none and none is required. A token that does not verify is 401, whatever the
        plain headers say; a plain header or the body's `user` naming someone else is 403."""
        assert self._signed is not None
        token = headers.get(self._signed.header)
        if token is None:
            if self._signed.required:
                raise Unauthorized(
                    f"a service-key request must carry the signed {self._signed.header_name} "
                    "token (auth.jwt.required is true)"
                )
            return None
        user_id = self._signed.user_of(token.strip())
        named = [headers[h] for h in self._user_headers if h in headers]
        if any(other != user_id for other in [*named, *([body_user] if body_user else [])]):
            raise Forbidden(
                f"the {self._signed.header_name} token names another user than the user-id "
                "header or the body's user: drop them, the token names the user"
            )
        return user_id

    def _session_user(self, token: str, named: str | None, session_ok: bool) -> str:
        assert self.sessions is not None
        owner = self.sessions.user_for(token)
        if owner is None:
            raise Unauthorized("the session token is not valid (unknown, ended or expired)")
        if not session_ok:
            raise Forbidden(
                "a session token works only on "
                + ", ".join(SESSION_ROUTES)
                + " and starts no model call (POST /memory/agent); use an API key for this route"
            )
        if named is not None and check_user_id(named) != owner:
            raise Forbidden("a session token acts only for its own user; drop X-User-Id")
        return owner

    def session_token(self, headers: Mapping[str, str]) -> str | None:
        """The session token this request carries, if its bearer secret is one (not checked)."""
        authorization = headers.get("authorization")
        if not authorization:
            return None
        secret = _bearer(authorization)
        return secret if is_session_token(secret) and not self._is_service_key(secret) else None

    def user_key(self, headers: Mapping[str, str]) -> str | None:
        """The user API key this request carries (`keys` mode), if its bearer secret is one
        (not checked): neither a service key nor a session token."""
        authorization = headers.get("authorization")
        if self.mode != "keys" or not authorization:
            return None
        secret = _bearer(authorization)
        if is_session_token(secret) or self._is_service_key(secret):
            return None
        return secret

    def holds_service_key(self, headers: Mapping[str, str]) -> bool:
        """Whether the request carries one of the configured service keys (`keys` mode)."""
        authorization = headers.get("authorization")
        if not authorization:
            return False
        scheme, _, secret = authorization.partition(" ")
        return scheme.lower() == "bearer" and self._is_service_key(secret.strip())

    def _is_service_key(self, secret: str) -> bool:
        candidate = secret.encode("utf-8", "surrogatepass")
        # Compare against every key, in constant time each, so timing reveals nothing.
        matches = [hmac.compare_digest(candidate, key) for key in self._service_keys]
        return any(matches)


def _bearer(authorization: str | None) -> str:
    if not authorization:
        raise Unauthorized("missing credentials: send Authorization: Bearer <key>")
    scheme, _, secret = authorization.partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise Unauthorized("expected Authorization: Bearer <key>")
    return secret.strip()
