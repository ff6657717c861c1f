"""Session tokens: short-lived bearer tokens that act for one user (CONTRACT section 14).

A front end that holds a service key mints one per user (`POST /sessions`) and sends the
user to the memory page with it, instead of handing out a long-lived key. Tokens are 256-bit
random secrets and only their sha256 is stored, as with user API keys (`credentials.py`).
Which routes accept a session token is the authenticator's business, not this module's.
A session minted with a user key lives no longer than the key: revoking it ends the user's
sessions (`credentials.py`), and `create` refuses a key revoked while the request was on
its way.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, select

from kvmem.db.engine import Database, rowcount
from kvmem.db.tables import ApiKey, UserSession
from kvmem.entries import utcnow
from kvmem.errors import Unauthorized
from kvmem.server.credentials import hash_secret

TOKEN_PREFIX = "kvs_"


@dataclass(frozen=True)
class NewSession:
    """A session just made: the token (shown once, not stored) and when it stops working."""

    token: str
    user_id: str
    expires_at: datetime


def is_session_token(secret: str) -> bool:
    """Whether `secret` has the shape of a session token (user keys start with `kvm_`)."""
    return secret.startswith(TOKEN_PREFIX)


class SessionStore:
    """Creates, checks and ends session tokens."""

    def __init__(
        self, database: Database, seconds: int, clock: Callable[[], datetime] = utcnow
    ) -> None:
        self.database = database
        self.lifetime = timedelta(seconds=seconds)
        self._clock = clock

    def create(self, user_id: str, minted_with: str | None = None) -> NewSession:
        """A new token for `user_id`, valid for the configured lifetime; `minted_with` is the
        user key the request came with, which must still be live when the session is made."""
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        now = self._clock()
        row = UserSession(
            id="ses_" + secrets.token_hex(8),
            user_id=user_id,
            token_hash=hash_secret(token),
            created_at=now,
            expires_at=now + self.lifetime,
        )
        with self.database.writing() as session:
            self.database.lock_user(session, user_id)
            if (
                minted_with is not None
                and session.scalar(
                    select(ApiKey.id).where(
                        ApiKey.key_hash == hash_secret(minted_with), ApiKey.revoked_at.is_(None)
                    )
                )
                is None
            ):
                raise Unauthorized("the API key is not valid (unknown or revoked)")
            # Expired tokens can never be used again: drop this user's as new ones are made,
            # so the table holds about one row per active page, not one per page ever opened.
            session.execute(
                delete(UserSession).where(
                    UserSession.user_id == user_id, UserSession.expires_at <= now
                )
            )
            session.add(row)
        return NewSession(token=token, user_id=user_id, expires_at=row.expires_at)

    def user_for(self, token: str) -> str | None:
        """The user a live token acts for; None when it is unknown, ended or expired."""
        digest = hash_secret(token)
        with self.database.reading() as session:
            row = session.scalar(select(UserSession).where(UserSession.token_hash == digest))
        if row is None or row.expires_at <= self._clock():
            return None
        # The lookup is by hash; compare again in constant time all the same.
        return row.user_id if hmac.compare_digest(row.token_hash, digest) else None

    def end(self, token: str) -> bool:
        """End the session of `token` now; False if there was no such session."""
        with self.database.writing() as session:
            result = session.execute(
                delete(UserSession).where(UserSession.token_hash == hash_secret(token))
            )
            return bool(rowcount(result))
