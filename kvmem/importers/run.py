"""Running an import: each user's memories planned against their entries and written (or
proposed, or only counted), one user at a time, all or nothing per user.

The write is `MemoryStore.import_document` (every rule, `tokenLimit`, history with source
`import`, nothing recorded for what is unchanged), given the values the plan was made from:
if the user's entries changed in between (the memory agent wrote meanwhile), nothing is
written and the user is planned again from their entries now. With `review`, each key that
would change becomes one proposal (`ProposalStore.propose`), unless the same is pending already.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvmem.errors import KvmemError
from kvmem.importers.plan import Refusal, UserPlan, plan_user
from kvmem.importers.records import UserMemories
from kvmem.memory.imports import ChangedMeanwhile
from kvmem.memory.proposals import MAX_PENDING, ProposalStore
from kvmem.memory.store import MemoryStore
from kvmem.server.auth import check_user_id

ATTEMPTS = 3


@dataclass(frozen=True)
class UserOutcome:
    """What one user's import did (or, in a dry run, would do)."""

    user_id: str
    added: int
    updated: int
    unchanged: int
    refused: tuple[Refusal, ...]
    proposed: int = 0

    def as_json(self, *, review: bool = False) -> dict[str, Any]:
        """The user's line of `--json` (with `proposed` under `--review`)."""
        body: dict[str, Any] = {
            "user_id": self.user_id,
            "added": self.added,
            "updated": self.updated,
            "unchanged": self.unchanged,
            "refused": [refusal.as_json() for refusal in self.refused],
        }
        if review:
            body["proposed"] = self.proposed
        return body


class ForeignImport:
    """Imports users' foreign memories into the store under its rules."""

    def __init__(
        self,
        store: MemoryStore,
        *,
        free_key: str,
        review: bool = False,
        dry_run: bool = False,
    ) -> None:
        self.store = store
        self.free_key = free_key
        self.review = ProposalStore(store) if review else None
        self.dry_run = dry_run

    def import_user(self, user: UserMemories) -> UserOutcome:
        """Plan the user's import and, unless refused or a dry run, write or propose it."""
        try:
            check_user_id(user.user_id)
        except KvmemError as exc:
            refusal = Refusal(self.free_key, user.memories[0].where, exc.message)
            return UserOutcome(user.user_id[:140], 0, 0, 0, (refusal,))
        for _ in range(ATTEMPTS):
            plan = self._plan(user)
            if plan.refused or self.dry_run or not plan.writes:
                return _outcome(user, plan)
            try:
                proposed = self._apply(user.user_id, plan)
            except ChangedMeanwhile:
                continue
            except KvmemError as exc:  # a rule the plan did not foresee: nothing was written
                plan.refused.append(Refusal(next(iter(plan.writes)), None, exc.message))
                return _outcome(user, plan)
            return _outcome(user, plan, proposed)
        refusal = Refusal(
            self.free_key, None, "the memory kept changing during the import; run it again"
        )
        return UserOutcome(user.user_id, 0, 0, 0, (refusal,))

    def _plan(self, user: UserMemories) -> UserPlan:
        entries = {entry.key: entry for entry in self.store.snapshot(user.user_id).entries}
        return plan_user(user, entries, self.store.rules, self.store.tokens, self.free_key)

    def _apply(self, user_id: str, plan: UserPlan) -> int:
        """Write the plan (or propose it); how many proposals were made. A plan refused here
        (too many proposals) has written nothing."""
        if self.review is None:
            self.store.import_document(user_id, plan.writes.items(), expected=plan.expected)
            return 0
        pending = {p.key: p.value for p in self.review.pending(user_id)}
        # The cap counts the proposals waiting in the user's scopes too (their own layer is
        # where an import goes, and where a proposal for one of its keys replaces another).
        in_scopes = self.review.pending_count(user_id) - len(pending)
        if len(plan.writes.keys() | pending.keys()) + in_scopes > MAX_PENDING:
            # More would push the oldest out of the list unseen: refuse the user, say why.
            waiting = f"{in_scopes} proposals pending in the user's scopes, " if in_scopes else ""
            reason = (
                f"{len(plan.writes)} keys to propose, {waiting}and at most {MAX_PENDING} "
                "proposals are kept per user: import without --review, or review the pending "
                "ones first"
            )
            plan.refused.append(Refusal(next(iter(plan.writes)), None, reason))
            return 0
        proposed = 0
        for key, value in plan.writes.items():
            if pending.get(key) != value:
                self.review.propose(user_id, key, value)
                proposed += 1
        return proposed


def _outcome(user: UserMemories, plan: UserPlan, proposed: int = 0) -> UserOutcome:
    if plan.refused:
        # All or nothing: a refused user's import stored nothing.
        return UserOutcome(user.user_id, 0, 0, 0, tuple(plan.refused))
    return UserOutcome(
        user.user_id, plan.added, plan.updated, plan.unchanged, (), proposed=proposed
    )
