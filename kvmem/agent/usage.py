"""What the memory agent costs: one `agent_runs` row per run, and sums of them per UTC day.

`UsageStore` writes runs' records (tokens from the upstream's `usage`, cost in USD or null)
and reads them back for `GET /usage`, `kvmem usage` and the daily token budget, which is read
from the database so that it holds across replicas. It knows nothing of HTTP or litellm, nor
of the records still on their way: `kvmem.agent.ledger` batches them, prices runs (from
`model_client.token_prices`) and keeps the budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import UTC, date, datetime, time, timedelta
from typing import Any, cast

from sqlalchemy import ColumnElement, Table, func, insert, select

from kvmem.db.engine import Database
from kvmem.db.erasure import erasure_times
from kvmem.db.tables import AgentRunRecord

MAX_DAYS = 366
DEFAULT_DAYS = 30


@dataclass(frozen=True)
class RunUsage:
    """One finished agent run, as it is recorded."""

    user_id: str
    conversation_id: str | None
    started_at: datetime
    duration_seconds: float
    model_calls: int
    input_tokens: int
    output_tokens: int
    cost_usd: float | None
    state: str
    writes: int

    def as_row(self) -> dict[str, Any]:
        """The run's `agent_runs` columns."""
        return {name: getattr(self, name) for name in _RUN_FIELDS}


_RUN_FIELDS = tuple(field.name for field in fields(RunUsage))


@dataclass(frozen=True)
class UsageSum:
    """Runs, tokens, cost and writes summed over some runs (a day, a user, a window)."""

    agent_runs: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None  # null when no run in the sum had a price
    writes: int = 0

    @property
    def tokens(self) -> int:
        """Input plus output tokens."""
        return self.input_tokens + self.output_tokens

    def __add__(self, other: UsageSum) -> UsageSum:
        costs = [c for c in (self.cost_usd, other.cost_usd) if c is not None]
        return UsageSum(
            self.agent_runs + other.agent_runs,
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            sum(costs) if costs else None,
            self.writes + other.writes,
        )

    def as_json(self) -> dict[str, Any]:
        """The sum's fields as `/usage` shows them."""
        return {
            "agent_runs": self.agent_runs,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            # Summed floats drift in the last digits (0.1 + 0.2); a millionth of a cent is plenty.
            "cost_usd": None if self.cost_usd is None else round(self.cost_usd, 10),
            "writes": self.writes,
        }


@dataclass(frozen=True)
class DailyUsage:
    """One user's usage per UTC day (newest first, only days that had runs) and in total."""

    days: tuple[tuple[date, UsageSum], ...]

    @property
    def totals(self) -> UsageSum:
        """The sum over all the days."""
        total = UsageSum()
        for _, day in self.days:
            total += day
        return total

    def as_json(self) -> dict[str, Any]:
        """The body of `GET /usage`."""
        return {
            "days": [{"date": day.isoformat(), **used.as_json()} for day, used in self.days],
            "totals": self.totals.as_json(),
        }


def day_start(moment: datetime, days_back: int = 0) -> datetime:
    """Midnight UTC of `moment`'s UTC day, `days_back` days earlier."""
    day = moment.astimezone(UTC).date() - timedelta(days=days_back)
    return datetime.combine(day, time(), tzinfo=UTC)


_SUMS = (
    func.count(AgentRunRecord.id),
    func.coalesce(func.sum(AgentRunRecord.input_tokens), 0),
    func.coalesce(func.sum(AgentRunRecord.output_tokens), 0),
    func.sum(AgentRunRecord.cost_usd),  # SUM skips nulls; all null gives null
    func.coalesce(func.sum(AgentRunRecord.writes), 0),
)


class _Fenced(Exception):
    """Records of runs that began before their user's erasure (raised to roll back)."""

    def __init__(self, runs: Sequence[RunUsage]) -> None:
        super().__init__(f"{len(runs)} records of erased users")
        self.runs = runs


class UsageStore:
    """Writes agent run records and sums them by user and UTC day."""

    def __init__(self, database: Database) -> None:
        self.database = database

    def record(self, *runs: RunUsage) -> None:
        """Store these runs' records, in one transaction. The record of a run that began
        before its user was erased is dropped: it must not bring the user back."""
        while runs:
            try:
                self._record(runs)
                return
            except _Fenced as fenced:  # rolled back, the user rows it made with it
                runs = tuple(run for run in runs if run not in fenced.runs)

    def _record(self, runs: Sequence[RunUsage]) -> None:
        with self.database.writing() as session:
            # A row references its user, who may never have written a memory yet (sorted:
            # on PostgreSQL the users are locked, always in the same order).
            users = sorted({run.user_id for run in runs})
            for user_id in users:
                self.database.lock_user(session, user_id)
            # Read under the users' locks: an erasure that held one has committed its fence.
            erased = erasure_times(session.connection(), users)
            if erased:
                fenced = [
                    run
                    for run in runs
                    if run.user_id in erased and run.started_at <= erased[run.user_id]
                ]
                if fenced:
                    raise _Fenced(fenced)
            # Core's executemany on the table (typed as a FromClause, a Table at run time).
            table = cast(Table, AgentRunRecord.__table__)
            session.execute(insert(table), [run.as_row() for run in runs])

    def tokens_today(self, user_id: str, now: datetime) -> int:
        """Input plus output tokens of the user's runs since midnight UTC (for the budget)."""
        with self.database.reading() as session:
            used = session.scalar(
                select(
                    func.coalesce(
                        func.sum(AgentRunRecord.input_tokens + AgentRunRecord.output_tokens), 0
                    )
                ).where(
                    AgentRunRecord.user_id == user_id,
                    AgentRunRecord.started_at >= day_start(now),
                )
            )
        return int(used or 0)

    def daily(self, user_id: str, days: int, now: datetime) -> DailyUsage:
        """The user's usage per UTC day over the last `days` days (today included)."""
        day = self._utc_day()
        with self.database.reading() as session:
            rows = session.execute(
                select(day, *_SUMS)
                .where(
                    AgentRunRecord.user_id == user_id,
                    AgentRunRecord.started_at >= day_start(now, days - 1),
                )
                .group_by(day)
                .order_by(day.desc())
            ).all()
        return DailyUsage(tuple((date.fromisoformat(row[0]), _sum(row[1:])) for row in rows))

    def by_user(self, days: int, now: datetime) -> list[tuple[str, UsageSum]]:
        """Every user's usage over the last `days` days, most tokens first."""
        with self.database.reading() as session:
            rows = session.execute(
                select(AgentRunRecord.user_id, *_SUMS)
                .where(AgentRunRecord.started_at >= day_start(now, days - 1))
                .group_by(AgentRunRecord.user_id)
            ).all()
        sums = [(row[0], _sum(row[1:])) for row in rows]
        return sorted(sums, key=lambda item: (-item[1].tokens, item[0]))

    def _utc_day(self) -> ColumnElement[str]:
        """`started_at`'s UTC date as `YYYY-MM-DD`, in this database's SQL."""
        column = AgentRunRecord.started_at
        if self.database.dialect == "postgresql":
            return func.to_char(func.timezone("UTC", column), "YYYY-MM-DD")
        return func.substr(column, 1, 10)  # SQLite keeps UTC timestamps as ISO text


def _sum(values: Sequence[Any]) -> UsageSum:
    runs, input_tokens, output_tokens, cost, writes = values
    return UsageSum(
        int(runs),
        int(input_tokens),
        int(output_tokens),
        None if cost is None else float(cost),
        int(writes),
    )
