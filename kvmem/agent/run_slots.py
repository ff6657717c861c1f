"""The bounds on memory agent runs in flight: per user and per process.

A request takes a `RunSlot` before it reads the user's daily token budget and holds it until
its run ends (or until it learns that the agent does not run). So at most
`memory.agent.max_runs_per_user` runs of one user, and `memory.agent.max_concurrent_runs` of
the process, are in flight at once, and every run that starts read the budget while holding
its slot: the budget is overshot by at most the runs one user may have in flight. The bounds
are per process (each replica has its own). Used on the event loop only; it knows nothing of
models, HTTP or the database.
"""

from __future__ import annotations

from collections import Counter


class RunSlot:
    """One run's place among the runs in flight; `release` gives it back (once)."""

    def __init__(self, slots: RunSlots, user_id: str) -> None:
        self._slots = slots
        self.user_id = user_id
        self._held = True

    def release(self) -> None:
        """Give the place back (idempotent)."""
        if self._held:
            self._held = False
            self._slots._release(self.user_id)


class RunSlots:
    """Hands out at most `per_user` slots per user and `total` in all."""

    def __init__(self, per_user: int, total: int) -> None:
        self.per_user = per_user
        self.total = total
        self._by_user: Counter[str] = Counter()
        self._taken = 0

    def take(self, user_id: str) -> RunSlot | None:
        """A slot for one of the user's runs, or None when either bound is reached."""
        if self._taken >= self.total or self._by_user[user_id] >= self.per_user:
            return None
        self._taken += 1
        self._by_user[user_id] += 1
        return RunSlot(self, user_id)

    @property
    def taken(self) -> int:
        """How many slots are held now."""
        return self._taken

    def _release(self, user_id: str) -> None:
        self._taken -= 1
        self._by_user[user_id] -= 1
        if not self._by_user[user_id]:
            del self._by_user[user_id]
