"""What `kvmem import --from` prints: a plain table, a row per user as each is done, the
refusals under the user they belong to, and a closing line; or the `--json` document.

Plain text on purpose (no terminal library): it reads the same in a terminal, a log or a pipe.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kvmem.importers.run import UserOutcome

USER_WIDTH = 36
HEADER = f"{'user':<{USER_WIDTH}}  {'added':>7}  {'updated':>7}  {'unchanged':>9}  {'refused':>7}"


def printable(text: str) -> str:
    """`text` with control characters escaped (a user id or a reason from a hostile file)."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def table_row(outcome: UserOutcome) -> str:
    """The user's row and, under it, one line per refused memory."""
    user = printable(outcome.user_id)
    row = (
        f"{user:<{USER_WIDTH}}  {outcome.added:>7}  {outcome.updated:>7}  "
        f"{outcome.unchanged:>9}  {len(outcome.refused):>7}"
    )
    lines = [row]
    for refusal in outcome.refused:
        where = f" ({printable(refusal.where)})" if refusal.where else ""
        lines.append(f"  refused {refusal.key}{where}: {printable(refusal.reason)}")
    return "\n".join(lines)


@dataclass
class Totals:
    """The sums over every user, for the closing line."""

    users: int = 0
    added: int = 0
    updated: int = 0
    unchanged: int = 0
    refused_users: int = 0
    proposed: int = 0

    def add(self, outcome: UserOutcome) -> None:
        """Count one user's outcome."""
        self.users += 1
        self.added += outcome.added
        self.updated += outcome.updated
        self.unchanged += outcome.unchanged
        self.refused_users += bool(outcome.refused)
        self.proposed += outcome.proposed

    def summary(self, *, dry_run: bool, review: bool) -> str:
        """The closing line: what was done, or what a dry run would do."""
        line = (
            f"{self.users} user{'s' * (self.users != 1)}: {self.added} added, "
            f"{self.updated} updated, {self.unchanged} unchanged"
        )
        if review and not dry_run:
            line += f", as {self.proposed} proposals for review"
        if self.refused_users:
            line += f"; {self.refused_users} refused (nothing stored for them)"
        return f"dry run, nothing written: {line}" if dry_run else line


def json_document(outcomes: Iterable[UserOutcome], *, review: bool) -> dict[str, Any]:
    """`{"users": [{"user_id", "added", "updated", "unchanged", "refused": [...]}]}`."""
    return {"users": [outcome.as_json(review=review) for outcome in outcomes]}
