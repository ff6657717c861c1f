"""Stored /chat conversations: their messages survive restarts and are scoped by user.

A turn is stored whole or not at all: the user message and the assistant reply are written in
one transaction after the upstream answered, so a failed call never leaves half a turn.
"""

from __future__ import annotations

import builtins
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import and_, delete, func, or_, select

from kvmem.db.engine import Database
from kvmem.db.erasure import check_not_erased
from kvmem.db.tables import Conversation, Message
from kvmem.entries import iso, utcnow
from kvmem.errors import BadRequest, NotFound

TITLE_CHARS = 80


@dataclass(frozen=True)
class ChatMessage:
    """One stored message."""

    role: str
    content: str
    created_at: datetime

    def as_json(self) -> dict[str, Any]:
        """The message as `GET /conversations/{id}` shows it."""
        return {"role": self.role, "content": self.content, "created_at": iso(self.created_at)}


@dataclass(frozen=True)
class ConversationInfo:
    """A conversation without its messages."""

    id: str
    title: str
    created_at: datetime
    updated_at: datetime
    message_count: int

    def as_json(self) -> dict[str, Any]:
        """The conversation as `GET /conversations` lists it."""
        return {
            "id": self.id,
            "title": self.title,
            "created_at": iso(self.created_at),
            "updated_at": iso(self.updated_at),
            "message_count": self.message_count,
        }


@dataclass(frozen=True)
class ConversationPage:
    """Conversations most recently updated first, and the `before` cursor of the next page
    (None on the last)."""

    conversations: tuple[ConversationInfo, ...]
    next: str | None

    def as_json(self) -> dict[str, Any]:
        """The body of `GET /conversations`."""
        return {
            "conversations": [info.as_json() for info in self.conversations],
            "next": self.next,
        }


def _cursor(info: ConversationInfo) -> str:
    """Where a page ended: the last conversation's `updated_at` and id (`<time>_<id>`)."""
    return f"{iso(info.updated_at)}_{info.id}"


def _cursor_position(cursor: str) -> tuple[datetime, str]:
    """A `_cursor` read back; `BadRequest` for anything else."""
    moment, _, conversation_id = cursor.partition("_")
    try:
        if not moment.endswith("Z") or not is_conversation_id(conversation_id):
            raise ValueError(cursor)
        updated_at = datetime.fromisoformat(moment[:-1]).replace(tzinfo=UTC)
    except ValueError:
        raise BadRequest(
            f"before must be the next value of a GET /conversations page, not {cursor[:80]!r}"
        ) from None
    return updated_at, conversation_id


def new_conversation_id() -> str:
    """A fresh, unguessable conversation id."""
    return str(uuid.uuid4())


def is_conversation_id(value: str) -> bool:
    """Whether `value` is a conversation id as kvmem makes them (a canonical UUID)."""
    try:
        return str(uuid.UUID(value)) == value
    except ValueError:
        return False


def title_for(message: str) -> str:
    """A conversation's title: its first message, on one line, cut to 80 characters."""
    line = " ".join(message.split())
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1] + "…"


class ConversationStore:
    """Creates, reads, extends and deletes a user's conversations."""

    def __init__(self, database: Database) -> None:
        self.database = database

    def list(self, user_id: str, limit: int = 50, before: str | None = None) -> ConversationPage:
        """The user's conversations, most recently updated first, `limit` at a time after the
        `before` cursor (a page's `next`); each message count is read by the conversation's
        index, so the cost is that of the page, not of the table."""
        position = _cursor_position(before) if before is not None else None
        count = (
            select(func.count(Message.id))
            .where(Message.conversation_id == Conversation.id)
            .scalar_subquery()
        )
        query = select(Conversation, count).where(Conversation.user_id == user_id)
        if position is not None:
            updated_at, last_id = position
            query = query.where(
                or_(
                    Conversation.updated_at < updated_at,
                    and_(Conversation.updated_at == updated_at, Conversation.id > last_id),
                )
            )
        query = query.order_by(Conversation.updated_at.desc(), Conversation.id).limit(limit + 1)
        with self.database.reading() as session:
            infos = [_info(row, n) for row, n in session.execute(query)]
        more = len(infos) > limit
        infos = infos[:limit]
        return ConversationPage(
            conversations=tuple(infos), next=_cursor(infos[-1]) if more else None
        )

    def get(
        self, user_id: str, conversation_id: str
    ) -> tuple[ConversationInfo, builtins.list[ChatMessage]]:
        """A conversation and all its messages; `NotFound` if it is not this user's."""
        with self.database.reading() as session:
            row = self._owned(session, user_id, conversation_id)
            messages = [
                ChatMessage(m.role, m.content, m.created_at)
                for m in session.scalars(
                    select(Message)
                    .where(Message.conversation_id == conversation_id)
                    .order_by(Message.id)
                )
            ]
        return _info(row, len(messages)), messages

    def recent(
        self, user_id: str, conversation_id: str, count: int
    ) -> builtins.list[ChatMessage]:  # `list` here is the method
        """The last `count` messages, oldest first; `NotFound` if the conversation is not owned."""
        with self.database.reading() as session:
            self._owned(session, user_id, conversation_id)
            if count <= 0:
                return []
            rows = session.scalars(
                select(Message)
                .where(Message.conversation_id == conversation_id)
                .order_by(Message.id.desc())
                .limit(count)
            ).all()
        return [ChatMessage(m.role, m.content, m.created_at) for m in reversed(rows)]

    def record_turn(
        self,
        user_id: str,
        conversation_id: str,
        user_text: str,
        reply: str,
        *,
        new: bool,
        began: datetime | None = None,
    ) -> bool:
        """Store a finished turn (creating the conversation when `new`).

        False if an existing conversation was deleted meanwhile: it is not brought back.
        `UserErased` (nothing stored) if the user was erased after the turn `began`.
        """
        now = utcnow()
        with self.database.writing() as session:
            self.database.lock_user(session, user_id)
            if began is not None:
                check_not_erased(session.connection(), user_id, began)
            if new:
                session.add(
                    Conversation(
                        id=conversation_id,
                        user_id=user_id,
                        title=title_for(user_text),
                        created_at=now,
                        updated_at=now,
                    )
                )
            else:
                row = session.get(Conversation, conversation_id)
                if row is None or row.user_id != user_id:
                    return False
                row.updated_at = now
            session.add(
                Message(
                    conversation_id=conversation_id, role="user", content=user_text, created_at=now
                )
            )
            session.add(
                Message(
                    conversation_id=conversation_id, role="assistant", content=reply, created_at=now
                )
            )
        return True

    def delete(self, user_id: str, conversation_id: str) -> None:
        """Delete a conversation and its messages; `NotFound` if it is not this user's."""
        with self.database.writing() as session:
            self._owned(session, user_id, conversation_id)
            session.execute(delete(Message).where(Message.conversation_id == conversation_id))
            session.execute(delete(Conversation).where(Conversation.id == conversation_id))

    @staticmethod
    def _owned(session: Any, user_id: str, conversation_id: str) -> Conversation:
        # Ids are UUIDs; anything else cannot exist (and may not even be storable text).
        row = (
            session.get(Conversation, conversation_id)
            if is_conversation_id(conversation_id)
            else None
        )
        if row is None or row.user_id != user_id:
            # Another user's conversation is answered exactly like a missing one.
            raise NotFound(f"no conversation with id {conversation_id!r}")
        return row


def _info(row: Conversation, count: int) -> ConversationInfo:
    return ConversationInfo(
        id=row.id,
        title=row.title,
        created_at=row.created_at,
        updated_at=row.updated_at,
        message_count=count,
    )
