"""The database tables, as SQLAlchemy 2 models. Alembic migrations are the schema's source;
these models mirror them for queries (a test checks that the two agree)."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    text,
    true,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UtcDateTime(TypeDecorator[datetime]):
    """A timestamp stored in UTC and always read back timezone-aware (SQLite drops the zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetimes are not stored; pass an aware UTC datetime")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    """Base of kvmem's tables, with the naming convention Alembic's batch mode relies on."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class User(Base):
    """A user kvmem has seen; its row is also the lock that serializes the user's writes."""

    __tablename__ = "users"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    memories_enabled: Mapped[bool] = mapped_column(Boolean, server_default=true())
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    # Bumped in the same transaction as every change to the user's entries, so a reader
    # that sees an unchanged version may reuse the entries it read before.
    memory_version: Mapped[int] = mapped_column(Integer, server_default="0")
    # The user's own "review before remembering" switch, used under `memory.review: per_user`.
    review: Mapped[bool] = mapped_column(Boolean, server_default="0")


class MemoryEntry(Base):
    """One key/value memory of one user."""

    __tablename__ = "memory_entries"
    __table_args__ = (
        UniqueConstraint("user_id", "scope", "key", name="uq_memory_entries_user_scope_key"),
        # A turn's read: one layer's rows (two for a scoped turn) in the order they are shown.
        Index("ix_memory_entries_user_scope_updated", "user_id", "scope", "updated_at"),
        # The sweep's look for entries due to expire, in order, past those already expired.
        Index("ix_memory_entries_expiry", "expired", "expires_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    user_id: Mapped[str] = mapped_column(String(128), ForeignKey("users.id", ondelete="CASCADE"))
    key: Mapped[str] = mapped_column(String(128))
    value: Mapped[str] = mapped_column(Text)
    token_count: Mapped[int] = mapped_column(Integer)
    source: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime)
    # When the entry stops being memory (None: never); `expired` once its `expire` change is
    # recorded (an expired entry is kept, listed only with `include_expired`).
    expires_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)
    expired: Mapped[bool] = mapped_column(Boolean, server_default="0")
    # The layer: "" for the person's own (null in the API), else the scope's name. Not null, so
    # that the unique (user, scope, key) holds for the own layer on every database.
    scope: Mapped[str] = mapped_column(String(128), server_default=text("''"))


class ApiKey(Base):
    """A user's API key; only the sha256 of the secret is stored."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    user_id: Mapped[str] = mapped_column(
        String(128), ForeignKey("users.id", ondelete="CASCADE"), index=True
    )
    prefix: Mapped[str] = mapped_column(String(16))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)


class Conversation(Base):
    """A /chat conversation of one user."""

    __tablename__ = "conversations"
    __table_args__ = (Index("ix_conversations_user_updated", "user_id", "updated_at"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(128), ForeignKey("users.id", ondelete="CASCADE"))
    title: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime)


class Message(Base):
    """One message of a conversation; a turn's user and assistant messages are stored together."""

    __tablename__ = "messages"
    __table_args__ = (Index("ix_messages_conversation_id", "conversation_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    conversation_id: Mapped[str] = mapped_column(
        String(36), ForeignKey("conversations.id", ondelete="CASCADE")
    )
    role: Mapped[str] = mapped_column(String(16))
    content: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)


class MemoryChange(Base):
    """One change to one entry (a set that changed the value, or a delete), with provenance."""

    __tablename__ = "memory_changes"
    __table_args__ = (
        Index("ix_memory_changes_user_id", "user_id", "id"),
        Index("ix_memory_changes_user_key", "user_id", "key", "id"),
        Index("ix_memory_changes_user_scope", "user_id", "scope", "id"),
        Index("ix_memory_changes_at", "at"),
        # Ids are handed to clients (revert targets, page cursors): never reused on SQLite.
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    user_id: Mapped[str] = mapped_column(String(128), ForeignKey("users.id", ondelete="CASCADE"))
    key: Mapped[str] = mapped_column(String(128))
    op: Mapped[str] = mapped_column(String(8))  # "set" or "delete"
    old_value: Mapped[str | None] = mapped_column(Text, nullable=True)
    new_value: Mapped[str | None] = mapped_column(Text, nullable=True)
    source: Mapped[str] = mapped_column(String(16))
    conversation_id: Mapped[str | None] = mapped_column(String(200), nullable=True)
    at: Mapped[datetime] = mapped_column(UtcDateTime)
    scope: Mapped[str] = mapped_column(
        String(128), server_default=text("''")
    )  # as `MemoryEntry.scope`


class UserSession(Base):
    """A short-lived bearer token of one user; only the sha256 of the token is stored."""

    __tablename__ = "sessions"
    __table_args__ = (
        Index("ix_sessions_user_id", "user_id"),
        Index("ix_sessions_expires_at", "expires_at"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(128), ForeignKey("users.id", ondelete="CASCADE"))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime)


class AgentRunRecord(Base):
    """One memory agent run: its duration, model calls, tokens, cost, state and writes."""

    __tablename__ = "agent_runs"
    __table_args__ = (Index("ix_agent_runs_user_started", "user_id", "started_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    user_id: Mapped[str] = mapped_column(String(128), ForeignKey("users.id", ondelete="CASCADE"))
    conversation_id: Mapped[str | None] = mapped_column(String(200), nullable=True)
    started_at: Mapped[datetime] = mapped_column(UtcDateTime)
    duration_seconds: Mapped[float] = mapped_column(Float)
    model_calls: Mapped[int] = mapped_column(Integer)
    input_tokens: Mapped[int] = mapped_column(Integer)
    output_tokens: Mapped[int] = mapped_column(Integer)
    cost_usd: Mapped[float | None] = mapped_column(Float, nullable=True)
    state: Mapped[str] = mapped_column(String(16))
    writes: Mapped[int] = mapped_column(Integer)


class UserErasure(Base):
    """A user erased at `erased_at` (kept a day): work begun before it writes nothing for them.

    Not the user's data but the fence of their erasure: it holds the sha256 of the user id,
    not the id, has no foreign key to `users`, and the erasure does not delete it."""

    __tablename__ = "user_erasures"
    __table_args__ = (Index("ix_user_erasures_erased_at", "erased_at"),)

    user_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    erased_at: Mapped[datetime] = mapped_column(UtcDateTime)


class MemoryProposal(Base):
    """A write the memory agent proposed, waiting for the person to keep or dismiss it."""

    __tablename__ = "memory_proposals"
    __table_args__ = (
        Index("ix_memory_proposals_user_id", "user_id", "id"),
        # Ids are handed to clients (accept, reject targets): never reused on SQLite.
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    user_id: Mapped[str] = mapped_column(String(128), ForeignKey("users.id", ondelete="CASCADE"))
    key: Mapped[str] = mapped_column(String(128))
    op: Mapped[str] = mapped_column(String(8))  # "set" or "delete"
    value: Mapped[str | None] = mapped_column(Text, nullable=True)  # None for a delete
    conversation_id: Mapped[str | None] = mapped_column(String(200), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    expires_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)
    scope: Mapped[str] = mapped_column(
        String(128), server_default=text("''")
    )  # as `MemoryEntry.scope`
