"""A user named by a signed token (`auth.jwt`), instead of a plain header anyone may set.

Open WebUI, with `FORWARD_USER_INFO_HEADER_JWT_SECRET` set, forwards its user as one HS256
token in `X-OpenWebUI-User-Jwt` (`sub`: the user id, `iss: open-webui`, `exp`: five minutes
on; `_mint_forward_user_jwt` in its `utils/headers.py`). PyJWT verifies it: the signature
with the shared secret, only the listed algorithms (never `none`), `exp` and `iss` required
and checked, with `leeway_seconds` for clocks that differ. Every refusal is 401 `unauthorized`
saying why, in kvmem's words (never the library's), and never falls back to plain headers.

PyJWT is imported when the first verifier is made, so a server without `auth.jwt` never
loads it.
"""

from __future__ import annotations

import re
from typing import Any

from kvmem.config import JwtConfig
from kvmem.errors import Unauthorized

MAX_TOKEN_BYTES = 8192  # far above a forwarded user's token; a header bound already holds


class SignedIdentity:
    """Verifies the token of `auth.jwt` and reads the user id from its claim."""

    def __init__(self, config: JwtConfig, user_id: re.Pattern[str]) -> None:
        """`user_id`: what a user id looks like (a claim that is not one is refused)."""
        import jwt
        import jwt.exceptions

        self._jwt = jwt
        self.header = config.header.lower()
        self.header_name = config.header
        self.required = config.required
        self._secret = config.secret.get_secret_value()
        self._algorithms = list(config.algorithms)
        self._issuer = config.issuer
        self._claim = config.user_claim
        self._leeway = config.leeway_seconds
        self._user_id_pattern = user_id

    def user_of(self, token: str) -> str:
        """The user id the token names, or `Unauthorized` saying why it does not verify."""
        jwt = self._jwt
        if not token or len(token) > MAX_TOKEN_BYTES or not token.isascii():
            raise self._refused("it is not a JSON Web Token")
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                self._secret,
                algorithms=self._algorithms,
                issuer=self._issuer,
                leeway=self._leeway,
                options={"require": ["exp", "iss", self._claim]},
            )
        except jwt.exceptions.ExpiredSignatureError as exc:
            raise self._refused("it has expired (exp)") from exc
        except jwt.exceptions.InvalidIssuerError as exc:
            raise self._refused(f"its issuer (iss) is not {self._issuer!r}") from exc
        except jwt.exceptions.MissingRequiredClaimError as exc:
            raise self._refused(f"it has no {exc.claim!r} claim") from exc
        except jwt.exceptions.InvalidSignatureError as exc:
            raise self._refused("its signature does not match auth.jwt.secret") from exc
        except jwt.exceptions.InvalidAlgorithmError as exc:
            raise self._refused(
                f"it is not signed with {' or '.join(self._algorithms)} (auth.jwt.algorithms)"
            ) from exc
        except jwt.exceptions.InvalidSubjectError as exc:  # `sub` not a string
            raise self._refused(self._not_a_user_id) from exc
        except jwt.exceptions.ImmatureSignatureError as exc:
            raise self._refused("it is not valid yet (nbf or iat in the future)") from exc
        # Malformed: not three parts, bad base64 or JSON, claims of the wrong type.
        except jwt.exceptions.InvalidTokenError as exc:
            raise self._refused("it is not a well-formed JSON Web Token") from exc
        return self._user_id(claims.get(self._claim))

    def _user_id(self, value: Any) -> str:
        if not isinstance(value, str) or not self._user_id_pattern.fullmatch(value):
            raise self._refused(self._not_a_user_id)
        return value

    @property
    def _not_a_user_id(self) -> str:
        return f"its {self._claim!r} claim is not a user id (1-128 characters of A-Z, a-z, 0-9, . _ @ -)"

    def _refused(self, why: str) -> Unauthorized:
        return Unauthorized(f"the {self.header_name} token does not verify: {why}")
