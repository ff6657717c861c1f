"""Review before remembering: the memory agent's writes held as proposals until the person
keeps or dismisses them, and each user's own review switch.

With `memory.review: on` (or `per_user` and the user's switch on) the agent's `set_memory`
and `delete_memory` calls become rows of `memory_proposals` instead of writes. A proposal is
checked as the write would be (key, `validKeys`, `charLimit`; a delete needs the key to exist)
when it is made; `tokenLimit` and every other rule are checked when it is accepted, which is a
write with source `agent` under `MemoryStore`'s rules, in the same transaction that drops the
proposal: a refused accept leaves it pending, and of two accepts of one proposal (two
replicas, say) one applies it and the other finds it gone. A newer proposal for a key
replaces a pending older one; at most `MAX_PENDING` are kept per user, the oldest dropped.
A proposal belongs to one layer of the user's memory (their own, or a scope: `scope`), and
each call acts on one layer. Every query is scoped by `user_id`. It knows nothing of HTTP nor of the agent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import delete, func, insert, select, update

from kvmem.config import MemoryConfig
from kvmem.db.engine import rowcount
from kvmem.db.erasure import check_not_erased
from kvmem.db.tables import MemoryEntry, MemoryProposal, User
from kvmem.entries import Entry, iso, utcnow
from kvmem.errors import NotFound
from kvmem.memory.expiry import check_future
from kvmem.memory.store import MemoryStore

MAX_PENDING = 50
ProposalOp = Literal["set", "delete"]


@dataclass(frozen=True)
class Proposal:
    """One pending write of the agent's: a set (with its value) or a delete."""

    id: int
    key: str
    op: ProposalOp
    value: str | None
    conversation_id: str | None
    created_at: datetime
    expires_at: datetime | None = None  # when the entry a kept set makes expires
    scope: str = ""  # the layer it writes to: "" the person's own, else the scope

    def as_json(self) -> dict[str, Any]:
        """The proposal as the API shows it."""
        return {
            "id": self.id,
            "key": self.key,
            "op": self.op,
            "value": self.value,
            "conversation_id": self.conversation_id,
            "created_at": iso(self.created_at),
            "expires_at": iso(self.expires_at) if self.expires_at is not None else None,
        }


@dataclass(frozen=True)
class Accepted:
    """The outcome of accepting a proposal: the entry now (None once deleted) and the total."""

    entry: Entry | None
    total_tokens: int


def review_in_effect(memory: MemoryConfig, user_review: bool) -> bool:
    """Whether the agent's writes become proposals for a user whose own switch is
    `user_review` (which counts only under `memory.review: per_user`)."""
    return memory.review == "on" or (memory.review == "per_user" and user_review)


_PENDING = select(
    MemoryProposal.id,
    MemoryProposal.key,
    MemoryProposal.op,
    MemoryProposal.value,
    MemoryProposal.conversation_id,
    MemoryProposal.created_at,
    MemoryProposal.expires_at,
    MemoryProposal.scope,
)


def _proposal(row: Sequence[Any]) -> Proposal:
    """A `_PENDING` row as a `Proposal` (its `op` holds only what `propose` writes)."""
    proposal_id, key, op, value, conversation_id, created_at, expires_at, scope = row
    return Proposal(proposal_id, key, op, value, conversation_id, created_at, expires_at, scope)


def _of_layer(user_id: str, scope: str) -> Any:
    """The condition: a proposal of this user's layer `scope`."""
    return (MemoryProposal.user_id == user_id) & (MemoryProposal.scope == scope)


class ProposalStore:
    """Makes, lists, accepts and rejects a user's proposals (and keeps their switch)."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.database = store.database

    def propose(
        self,
        user_id: str,
        key: str,
        value: str | None,
        *,
        conversation_id: str | None = None,
        guard: Callable[[], None] | None = None,
        since: datetime | None = None,
        expires_at: datetime | None = None,
        scope: str = "",
    ) -> Proposal:
        """Hold a set of `key` of the layer `scope` to `value` (a delete when `value` is
        None) for review; a set may carry the moment its entry will expire (`expires_at`, in
        the future).

        Refused as the write would be: a bad or not allowed key, an empty or too long value,
        a delete of a key that holds nothing. `guard` runs just before the commit, and
        `since` (when the agent run began) refuses it with `UserErased` if the user was
        erased since, as for `MemoryStore.set`.
        """
        rules = self.store.rules.layer(scope)
        if value is None:
            rules.check_key_format(key)
        else:
            rules.check_key(key)
            value = rules.clean_value(value)
            if expires_at is not None:
                check_future(expires_at, self.store.clock())
        expires_at = expires_at if value is not None else None
        with self.database.writing() as session:
            self.database.lock_user(session, user_id)
            if since is not None:
                check_not_erased(session.connection(), user_id, since)
            if (
                value is None
                and session.scalar(
                    select(MemoryEntry.id).where(
                        MemoryEntry.user_id == user_id,
                        MemoryEntry.scope == scope,
                        MemoryEntry.key == key,
                    )
                )
                is None
            ):
                raise NotFound(f"no memory with key {key!r}")
            mine = MemoryProposal.user_id == user_id
            session.execute(
                delete(MemoryProposal).where(_of_layer(user_id, scope), MemoryProposal.key == key)
            )
            now = utcnow()
            proposal_id = session.execute(
                insert(MemoryProposal)
                .values(
                    user_id=user_id,
                    key=key,
                    op="set" if value is not None else "delete",
                    value=value,
                    conversation_id=conversation_id,
                    created_at=now,
                    expires_at=expires_at,
                    scope=scope,
                )
                .returning(MemoryProposal.id)
            ).scalar_one()
            kept = (
                select(MemoryProposal.id)
                .where(mine)
                .order_by(MemoryProposal.id.desc())
                .limit(MAX_PENDING)
            )
            session.execute(
                delete(MemoryProposal).where(mine, MemoryProposal.id.not_in(kept.scalar_subquery()))
            )
            if guard is not None:
                guard()
        op: ProposalOp = "set" if value is not None else "delete"
        return Proposal(proposal_id, key, op, value, conversation_id, now, expires_at, scope)

    def pending(self, user_id: str, scope: str = "") -> tuple[Proposal, ...]:
        """The pending proposals of one layer of the user, newest first."""
        with self.database.reading() as session:
            rows = session.execute(
                _PENDING.where(_of_layer(user_id, scope)).order_by(MemoryProposal.id.desc())
            ).all()
        return tuple(_proposal(row) for row in rows)

    def pending_count(self, user_id: str) -> int:
        """How many proposals of the user are pending in every layer (`MAX_PENDING` is a
        cap on them all)."""
        with self.database.reading() as session:
            count = session.scalar(select(func.count()).where(MemoryProposal.user_id == user_id))
        return count or 0

    def accept(self, user_id: str, proposal_id: int, scope: str = "") -> Accepted:
        """Apply the proposal as a write with source `agent` and its conversation, under every
        write rule at this moment, and drop it; `NotFound` when it is not this user's pending
        one. A refused write (`MemoryFull`, `InvalidMemory`) leaves it pending. Accepting a
        delete of a key that no longer holds anything changes nothing and drops it."""
        with self.database.writing() as session:
            self.database.lock_user(session, user_id)
            row = session.execute(
                _PENDING.where(_of_layer(user_id, scope), MemoryProposal.id == proposal_id)
            ).first()
            if row is None:
                raise NotFound(f"no pending proposal {proposal_id}")
            proposal = _proposal(row)
            if proposal.expires_at is not None:  # an expiry passed while pending: refused
                check_future(proposal.expires_at, self.store.clock())
            entry, total = self.store.write_locked(
                session,
                user_id,
                proposal.key,
                proposal.value,
                "agent",
                conversation_id=proposal.conversation_id,
                expires_at=proposal.expires_at,
                scope=scope,
            )
            session.execute(delete(MemoryProposal).where(MemoryProposal.id == proposal_id))
        return Accepted(entry, total)

    def reject(self, user_id: str, proposal_id: int, scope: str = "") -> None:
        """Drop the proposal; `NotFound` when it is not a pending one of this user's layer."""
        with self.database.writing() as session:
            self.database.lock_user(session, user_id)
            dropped = rowcount(
                session.execute(
                    delete(MemoryProposal).where(
                        _of_layer(user_id, scope), MemoryProposal.id == proposal_id
                    )
                )
            )
        if not dropped:
            raise NotFound(f"no pending proposal {proposal_id}")

    def reject_all(self, user_id: str, scope: str = "") -> int:
        """Drop every pending proposal of one layer of the user; how many."""
        with self.database.writing() as session:
            self.database.lock_user(session, user_id)
            return rowcount(
                session.execute(delete(MemoryProposal).where(_of_layer(user_id, scope)))
            )

    def user_review(self, user_id: str) -> bool:
        """The user's own review switch (false until they turn it on)."""
        with self.database.reading() as session:
            review = session.scalar(select(User.review).where(User.id == user_id))
        return bool(review)

    def set_user_review(self, user_id: str, review: bool) -> bool:
        """Turn the user's own review switch on or off."""
        with self.database.writing() as session:
            self.database.lock_user(session, user_id)
            session.execute(update(User).where(User.id == user_id).values(review=review))
        return review
