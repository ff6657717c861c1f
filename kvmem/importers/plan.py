"""What one user's import would change: their foreign memories merged into their entries.

Free text (Open WebUI, mem0) goes into one key, one line each, oldest first, after the lines
the key already holds; a memory already there as a line is unchanged, so an import run twice
adds nothing the second time. A memory that would take the key past `charLimit`, or the user's
total past `tokenLimit`, is refused and named; keyed entries (LibreChat) map one to one under
every write rule. Any refusal refuses the user's whole import: each user's import is all or
nothing. It reads no database and writes nothing: `run` gives it the user's entries.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvmem.entries import Entry
from kvmem.errors import KvmemError
from kvmem.importers.records import ForeignMemory, UserMemories
from kvmem.memory.rules import MemoryRules
from kvmem.tokens import TokenCounter


@dataclass(frozen=True)
class Refusal:
    """A memory that cannot be stored, and why."""

    key: str
    where: str | None
    reason: str

    def as_json(self) -> dict[str, Any]:
        """The refusal as `--json` prints it."""
        return {"key": self.key, "where": self.where, "reason": self.reason}


@dataclass
class UserPlan:
    """The writes one user's import makes (each key's new value) and what it counted.

    `expected` holds each written key's value when the plan was made (None: no entry), so that
    the write can tell whether the entries changed in between."""

    writes: dict[str, str] = field(default_factory=dict)
    expected: dict[str, str | None] = field(default_factory=dict)
    added: int = 0
    updated: int = 0
    unchanged: int = 0
    refused: list[Refusal] = field(default_factory=list)


def shortened(text: str, limit: int = 200) -> str:
    """`text`, cut to `limit` characters with an ellipsis (a key or a message from a hostile
    file, kept readable in a report)."""
    return text if len(text) <= limit else f"{text[: limit - 1]}…"


def one_line(text: str) -> str:
    """A memory as one line: its whitespace, line breaks included, made single spaces."""
    return " ".join(text.split())


def plan_user(
    user: UserMemories,
    entries: Mapping[str, Entry],
    rules: MemoryRules,
    tokens: TokenCounter,
    free_key: str,
) -> UserPlan:
    """The user's import against their `entries` (by key): writes, counts and refusals."""
    plan = UserPlan()
    free = [memory for memory in user.memories if memory.key is None]
    if free:
        _plan_free_text(plan, free, entries.get(free_key), rules, free_key)
    keyed = {memory.key: memory for memory in user.memories if memory.key is not None}
    for key, memory in keyed.items():  # the newest of a key twice wins (oldest first)
        _plan_entry(plan, key, memory, entries.get(key), rules)
    if not plan.refused:
        _check_token_limit(plan, user, entries, rules, tokens, free_key)
    return plan


def _plan_free_text(
    plan: UserPlan,
    memories: list[ForeignMemory],
    entry: Entry | None,
    rules: MemoryRules,
    key: str,
) -> None:
    value = entry.value if entry is not None else ""
    present = {line.strip() for line in value.splitlines()}
    for memory in memories:
        line = one_line(memory.text)
        if not line:
            continue  # an empty memory holds nothing to remember
        if line in present:
            plan.unchanged += 1
            continue
        if "\x00" in line:
            plan.refused.append(Refusal(key, memory.where, "it contains a NUL character"))
            continue
        grown = f"{value}\n{line}" if value else line
        if len(grown) > rules.char_limit:
            plan.refused.append(
                Refusal(
                    key,
                    memory.where,
                    f"does not fit: {key} would be {len(grown)} characters, over charLimit "
                    f"{rules.char_limit}",
                )
            )
            continue
        value = grown
        present.add(line)
        plan.added += 1
    if entry is None or value != entry.value:
        plan.writes[key] = value
        plan.expected[key] = entry.value if entry is not None else None


def _plan_entry(
    plan: UserPlan, key: str, memory: ForeignMemory, entry: Entry | None, rules: MemoryRules
) -> None:
    try:
        rules.check_key(key)
        value = rules.clean_value(memory.text)
    except KvmemError as exc:
        plan.refused.append(Refusal(shortened(key), memory.where, shortened(exc.message, 500)))
        return
    if entry is not None and entry.value == value:
        plan.unchanged += 1
        return
    if entry is None:
        plan.added += 1
    else:
        plan.updated += 1
    plan.writes[key] = value
    plan.expected[key] = entry.value if entry is not None else None


def _check_token_limit(
    plan: UserPlan,
    user: UserMemories,
    entries: Mapping[str, Entry],
    rules: MemoryRules,
    tokens: TokenCounter,
    free_key: str,
) -> None:
    """Refuse the plan, naming the memory that passes the limit, when the user's total after
    it would be over `tokenLimit`."""
    limit = rules.token_limit
    if limit is None or not plan.writes:
        return
    kept = sum(entry.token_count for key, entry in entries.items() if key not in plan.writes)
    written = {key: tokens.count(value) for key, value in plan.writes.items()}
    total = kept + sum(written.values())
    if total <= limit:
        return
    where = _passing_memory(plan, user, entries, tokens, free_key, kept, written, limit)
    plan.refused.append(
        Refusal(
            free_key if free_key in plan.writes else next(iter(plan.writes)),
            where,
            f"does not fit: the user's memory would be {total} tokens, over tokenLimit {limit}",
        )
    )


def _passing_memory(
    plan: UserPlan,
    user: UserMemories,
    entries: Mapping[str, Entry],
    tokens: TokenCounter,
    free_key: str,
    kept: int,
    written: dict[str, int],
    limit: int,
) -> str | None:
    """Where the memory is whose addition first takes the total over `limit`."""
    running = kept
    for key, count in written.items():
        if key != free_key:
            running += count
            if running > limit:
                return next(m.where for m in user.memories if m.key == key)
    if free_key not in plan.writes:
        return None
    # The free-text key grows a line at a time: find the first line that passes the limit
    # by halving (a few token counts, not one per line).
    entry = entries.get(free_key)
    old = entry.value if entry is not None else ""
    lines = plan.writes[free_key].split("\n")
    start = len(old.split("\n")) if old else 0
    low, high = start + 1, len(lines)
    while low < high:
        middle = (low + high) // 2
        if running + tokens.count("\n".join(lines[:middle])) > limit:
            high = middle
        else:
            low = middle + 1
    passing = lines[low - 1]
    free = (m for m in user.memories if m.key is None and one_line(m.text) == passing)
    return next((m.where for m in free), None)
