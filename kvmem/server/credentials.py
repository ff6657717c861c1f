"""User API keys: created by the CLI, shown once, stored only as a sha256 hash.

Revoking a key also ends its user's session tokens (CONTRACT section 17): a session lives on
a key's authority, and the schema does not record which key minted which session, so every
session of that user ends (a front end mints new ones when its user next opens the page).

Keys are 256-bit random secrets, so a plain sha256 (not a slow password hash) is the right
tool: the lookup is by hash, and nothing about the secret can be guessed from it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select

from kvmem.db.engine import Database
from kvmem.db.tables import ApiKey, UserSession
from kvmem.entries import iso, utcnow
from kvmem.errors import NotFound

SECRET_PREFIX = "kvm_"
SHOWN_PREFIX_LENGTH = 12


@dataclass(frozen=True)
class KeyInfo:
    """What may be shown of a key: never the secret itself."""

    id: str
    user_id: str
    prefix: str
    created_at: datetime
    revoked_at: datetime | None

    def as_json(self) -> dict[str, Any]:
        """The key as `kvmem keys list` prints it."""
        return {
            "id": self.id,
            "user_id": self.user_id,
            "prefix": self.prefix,
            "created_at": iso(self.created_at),
            "revoked_at": iso(self.revoked_at) if self.revoked_at else None,
        }


def hash_secret(secret: str) -> str:
    """The stored form of a key."""
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


class KeyStore:
    """Creates, lists, revokes and checks user API keys."""

    def __init__(self, database: Database) -> None:
        self.database = database

    def create(self, user_id: str) -> tuple[KeyInfo, str]:
        """A new key for `user_id`: its info and the secret, which is not stored."""
        secret = SECRET_PREFIX + secrets.token_urlsafe(32)
        row = ApiKey(
            id="key_" + secrets.token_hex(8),
            user_id=user_id,
            prefix=secret[:SHOWN_PREFIX_LENGTH],
            key_hash=hash_secret(secret),
            created_at=utcnow(),
            revoked_at=None,
        )
        with self.database.writing() as session:
            self.database.lock_user(session, user_id)
            session.add(row)
            session.flush()
            return _info(row), secret

    def list(self, user_id: str | None = None) -> list[KeyInfo]:
        """Every key, or one user's, oldest first."""
        query = select(ApiKey).order_by(ApiKey.created_at, ApiKey.id)
        if user_id is not None:
            query = query.where(ApiKey.user_id == user_id)
        with self.database.reading() as session:
            return [_info(row) for row in session.scalars(query)]

    def revoke(self, key_id: str, user_id: str | None = None) -> KeyInfo:
        """Revoke a key (for good) and end every session of its user; `NotFound` if there is
        no such key (of that user)."""
        with self.database.writing() as session:
            row = session.get(ApiKey, key_id)
            if row is None or (user_id is not None and row.user_id != user_id):
                raise NotFound(f"no API key with id {key_id!r}")
            # Held until commit: a session being minted with this key right now either
            # commits first (and is deleted here) or sees the key revoked (sessions.py).
            self.database.lock_user(session, row.user_id)
            if row.revoked_at is None:
                row.revoked_at = utcnow()
            session.execute(delete(UserSession).where(UserSession.user_id == row.user_id))
            return _info(row)

    def user_for(self, secret: str) -> str | None:
        """The user a live key belongs to, or None."""
        digest = hash_secret(secret)
        with self.database.reading() as session:
            row = session.scalar(select(ApiKey).where(ApiKey.key_hash == digest))
            if row is None or row.revoked_at is not None:
                return None
            # The lookup is by hash; compare again in constant time all the same.
            return row.user_id if hmac.compare_digest(row.key_hash, digest) else None


def _info(row: ApiKey) -> KeyInfo:
    return KeyInfo(
        id=row.id,
        user_id=row.user_id,
        prefix=row.prefix,
        created_at=row.created_at,
        revoked_at=row.revoked_at,
    )
