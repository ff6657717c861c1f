"""Usage accounting: one `agent_runs` row per run, `GET /usage`, `kvmem usage`, and the daily
token budget (in one process, and across two `kvmem serve` processes on one database)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select
from starlette.testclient import TestClient

from kvmem.agent.ledger import MAX_BATCH, Ledger, RecordBatches
from kvmem.agent.usage import RunUsage, UsageStore, day_start
from kvmem.db.engine import Database
from kvmem.db.tables import AgentRunRecord
from kvmem.entries import utcnow
from kvmem.errors import StoreUnavailable
from kvmem.memory.store import MemoryStore
from tests.support.apps import (
    AGENT_MODEL,
    services,
    set_memory,
    wait_agents_idle,
    wait_until,
)
from tests.support.cli import invoke
from tests.support.processes import ServeProcess
from tests.support.upstream import Reply

MakeClient = Callable[..., TestClient]
Sections = Callable[..., dict[str, Any]]


def records(database: Database) -> list[dict[str, Any]]:
    """Every agent run record, oldest first, as plain dicts without id and times."""
    with database.reading() as session:
        rows = session.scalars(select(AgentRunRecord).order_by(AgentRunRecord.id)).all()
        return [
            {
                "user_id": row.user_id,
                "conversation_id": row.conversation_id,
                "model_calls": row.model_calls,
                "input_tokens": row.input_tokens,
                "output_tokens": row.output_tokens,
                "cost_usd": row.cost_usd,
                "state": row.state,
                "writes": row.writes,
            }
            for row in rows
        ]


def wait_records(database: Database, count: int) -> list[dict[str, Any]]:
    """Wait until `count` runs are recorded (records land just after the run ends)."""
    wait_until(lambda: len(records(database)) >= count, what=f"{count} usage records")
    return records(database)


def past_run(
    user_id: str,
    started_at: datetime,
    tokens: tuple[int, int],
    *,
    cost: float | None = None,
    writes: int = 0,
    state: str = "done",
) -> RunUsage:
    return RunUsage(user_id, None, started_at, 0.5, 1, tokens[0], tokens[1], cost, state, writes)


def day(days_back: int) -> str:
    return (utcnow() - timedelta(days=days_back)).date().isoformat()


def noon(days_back: int) -> datetime:
    """Noon UTC `days_back` days ago (or now, if today's noon is still ahead)."""
    today = utcnow()
    moment = datetime(today.year, today.month, today.day, 12, tzinfo=UTC)
    moment -= timedelta(days=days_back)
    return min(moment, today)


def sums(
    runs: int, input_tokens: int, output_tokens: int, cost: float | None, writes: int
) -> dict[str, Any]:
    return {
        "agent_runs": runs,
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cost_usd": cost,
        "writes": writes,
    }


# -- recording real runs -----------------------------------------------------------------------


def test_a_run_is_recorded_with_the_upstreams_usage(
    make_client: MakeClient, chat_sections: Sections, upstream: Any, database: Database
) -> None:
    upstream.script(
        AGENT_MODEL,
        Reply(
            content=None,
            tool_calls=[set_memory("Bad Key", "Berlin")],
            usage={"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
        ),
        Reply(
            content=None,
            tool_calls=[set_memory("city", "Berlin")],
            usage={"prompt_tokens": 130, "completion_tokens": 10, "total_tokens": 140},
        ),
    )
    client = make_client(**chat_sections())
    reply = client.post("/chat", json={"message": "remember: I live in Berlin"})
    assert reply.status_code == 200
    conversation_id = reply.json()["conversation_id"]

    assert wait_records(database, 1) == [
        {
            "user_id": "local",
            "conversation_id": conversation_id,
            "model_calls": 2,
            "input_tokens": 230,
            "output_tokens": 30,
            "cost_usd": None,
            "state": "done",
            "writes": 1,
        }
    ]
    usage = client.get("/usage")
    assert (usage.status_code, usage.json()) == (
        200,
        {
            "days": [{"date": day(0), **sums(1, 230, 30, None, 1)}],
            "totals": sums(1, 230, 30, None, 1),
        },
    )


def test_a_model_in_litellms_price_map_has_a_cost(
    make_client: MakeClient, chat_sections: Sections, upstream: Any, database: Database
) -> None:
    # gpt-4o-mini: $0.15 per million input tokens, $0.60 per million output tokens.
    upstream.script(
        "gpt-4o-mini",
        Reply(
            content=None,
            usage={"prompt_tokens": 1000, "completion_tokens": 100, "total_tokens": 1100},
        ),
    )
    client = make_client(**chat_sections(agent={"model": "gpt-4o-mini"}))
    assert client.post("/chat", json={"message": "hello"}).status_code == 200
    [record] = wait_records(database, 1)
    assert record["cost_usd"] == pytest.approx(0.00021)
    assert client.get("/usage").json()["totals"] == sums(1, 1000, 100, pytest.approx(0.00021), 0)


def test_failed_and_timed_out_runs_are_recorded(
    make_client: MakeClient, chat_sections: Sections, upstream: Any, database: Database
) -> None:
    upstream.script(
        AGENT_MODEL, Reply(status=500, error={"error": {"message": "agent down"}}), Reply(hang=True)
    )
    client = make_client(**chat_sections(agent={"grace_seconds": 0.2}))
    assert client.post("/chat", json={"message": "one"}).json()["memory"]["agent"] in (
        "running",
        "failed",
    )
    wait_agents_idle(client)
    assert client.post("/chat", json={"message": "two"}).status_code == 200
    wait_agents_idle(client)
    recorded = wait_records(database, 2)
    assert [(r["state"], r["model_calls"], r["input_tokens"]) for r in recorded] == [
        ("failed", 1, 0),
        ("timeout", 1, 0),
    ]


def test_requests_without_a_run_are_not_recorded(
    make_client: MakeClient, chat_sections: Sections, database: Database, upstream: Any
) -> None:
    enabled, disabled = (
        make_client(**chat_sections()),
        make_client(**chat_sections(agent={"enabled": False})),
    )
    skipped = enabled.post("/chat", json={"message": "hi", "memory": False}).json()
    assert skipped["memory"]["agent"] == "skipped"
    assert disabled.post("/chat", json={"message": "hi"}).json()["memory"]["agent"] == "disabled"
    # A recorded run after them: once it is in, nothing else was written before it.
    assert enabled.post("/chat", json={"message": "now"}).status_code == 200
    assert [r["state"] for r in wait_records(database, 1)] == ["done"]


def test_a_lost_record_never_fails_the_chat(
    make_client: MakeClient, chat_sections: Sections, caplog: pytest.LogCaptureFixture
) -> None:
    class BrokenUsage(UsageStore):
        def record(self, *runs: RunUsage) -> None:
            raise StoreUnavailable("the memory store is unavailable: disk full")

    client = make_client(**chat_sections())
    agent = services(client).agent
    agent.ledger.usage = BrokenUsage(services(client).database)
    reply = client.post("/chat", json={"message": "hello"})
    assert reply.status_code == 200
    wait_agents_idle(client)
    counted = 'kvmem_errors_total{code="usage_record_failed"} 1.0'
    wait_until(lambda: counted in client.get("/metrics").text, what="the lost record counted")
    assert "agent run usage not recorded: user=local" in caplog.text


def test_records_of_runs_ending_together_share_one_write_and_close_writes_the_rest() -> None:
    written: list[list[str]] = []
    lost: list[tuple[list[str], str]] = []

    def write(runs: Sequence[RunUsage]) -> None:
        if any(run.user_id == "broken" for run in runs):
            raise StoreUnavailable("disk full")
        written.append([run.user_id for run in runs])

    async def scenario() -> None:
        batches = RecordBatches(
            write, lambda runs, exc: lost.append(([run.user_id for run in runs], str(exc)))
        )
        for user in ("a", "b", "c"):
            batches.add(past_run(user, noon(0), (1, 1)))
        assert batches.unwritten == 3
        assert batches.unwritten_tokens("a", day_start(utcnow())) == 2
        assert batches.unwritten_tokens("a", utcnow() + timedelta(seconds=1)) == 0
        while batches.unwritten:
            await asyncio.sleep(0.01)
        assert written == [["a", "b", "c"]]
        # A full batch goes at once; at shutdown, what waits is written without waiting.
        for index in range(MAX_BATCH + 1):
            batches.add(past_run(f"u{index}", noon(0), (1, 1)))
        batches.add(past_run("broken", noon(0), (1, 1)))
        await batches.close()
        assert batches.unwritten == 0

    asyncio.run(scenario())
    assert [len(batch) for batch in written] == [3, MAX_BATCH]
    assert lost == [(["u256", "broken"], "disk full")]


def test_a_batch_of_records_is_stored_in_one_transaction(database: Database) -> None:
    usage = UsageStore(database)
    usage.record(*(past_run(user, noon(0), (10, 1)) for user in ("bob", "alice", "bob")))
    assert [(r["user_id"], r["input_tokens"]) for r in records(database)] == [
        ("bob", 10),
        ("alice", 10),
        ("bob", 10),
    ]
    assert usage.tokens_today("bob", utcnow()) == 22


# -- GET /usage ----------------------------------------------------------------------------------


def test_usage_sums_per_utc_day_newest_first_for_this_user_only(
    make_client: MakeClient, database: Database
) -> None:
    usage = UsageStore(database)
    for past in [
        past_run("local", noon(0), (100, 10), cost=0.5, writes=1),
        past_run("local", noon(0), (50, 5), cost=None, writes=0),
        past_run("local", noon(2), (7, 3), cost=0.25, writes=2),
        past_run("local", noon(40), (1000, 1000), cost=1.0),
        past_run("alice", noon(0), (9999, 9999), cost=9.0),
    ]:
        usage.record(past)
    client = make_client()

    default = client.get("/usage")
    assert (default.status_code, default.json()) == (
        200,
        {
            "days": [
                {"date": day(0), **sums(2, 150, 15, 0.5, 1)},
                {"date": day(2), **sums(1, 7, 3, 0.25, 2)},
            ],
            "totals": sums(3, 157, 18, 0.75, 3),
        },
    )
    assert client.get("/usage?days=2").json() == {
        "days": [{"date": day(0), **sums(2, 150, 15, 0.5, 1)}],
        "totals": sums(2, 150, 15, 0.5, 1),
    }
    assert client.get("/usage?days=366").json()["totals"] == sums(4, 1157, 1018, 1.75, 3)


def test_usage_without_runs(make_client: MakeClient) -> None:
    response = make_client().get("/usage?days=1")
    assert (response.status_code, response.json()) == (
        200,
        {"days": [], "totals": sums(0, 0, 0, None, 0)},
    )


@pytest.mark.parametrize("days", ["0", "367", "-1", "1.5", "abc", "", "٣"])
def test_usage_days_out_of_range_is_400(make_client: MakeClient, days: str) -> None:
    response = make_client().get("/usage", params={"days": days})
    assert (response.status_code, response.json()) == (
        400,
        {
            "error": {
                "code": "bad_request",
                "message": "days must be a whole number from 1 to 366",
                "param": "days",
            }
        },
    )


def test_usage_in_keys_mode_is_the_key_owners(make_client: MakeClient, database: Database) -> None:
    UsageStore(database).record(past_run("alice", noon(0), (10, 1)))
    UsageStore(database).record(past_run("bob", noon(0), (20, 2)))
    client = make_client(auth={"mode": "keys", "service_keys": ["svc"]})
    _, alice_key = services(client).keys.create("alice")
    mine = client.get("/usage", headers={"Authorization": f"Bearer {alice_key}"})
    assert mine.json()["totals"] == sums(1, 10, 1, None, 0)
    bob = client.get("/usage", headers={"Authorization": "Bearer svc", "X-User-Id": "bob"})
    assert bob.json()["totals"] == sums(1, 20, 2, None, 0)
    assert client.get("/usage").status_code == 401


# -- the daily token budget --------------------------------------------------------------------


def test_the_budget_stops_the_agent_for_the_rest_of_the_day(
    make_client: MakeClient, chat_sections: Sections, upstream: Any, database: Database
) -> None:
    usage = UsageStore(database)
    usage.record(past_run("local", noon(1), (5000, 5000)))  # yesterday's runs do not count
    usage.record(past_run("local", noon(0), (10, 5)))  # earlier today: 15 of 40
    client = make_client(**chat_sections(agent={"daily_token_budget": 40}))

    first = client.post("/chat", json={"message": "one"}).json()["memory"]["agent"]
    assert first in ("running", "done")  # 15 + 15 = 30: still under 40
    wait_records(database, 3)
    second = client.post("/chat", json={"message": "two"}).json()["memory"]["agent"]
    assert second in ("running", "done")  # 45: the budget is reached
    wait_records(database, 4)
    third = client.post("/chat", json={"message": "three"})
    assert third.json()["memory"] == {"injected": [], "agent": "over_budget", "updates": []}

    assert len(upstream.received(AGENT_MODEL)) == 2
    recorded = wait_records(database, 5)
    assert [(r["state"], r["model_calls"], r["input_tokens"]) for r in recorded[2:]] == [
        ("done", 1, 10),
        ("done", 1, 10),
        ("over_budget", 0, 0),
    ]
    assert client.get("/usage?days=1").json()["totals"] == sums(4, 30, 15, None, 0)


class HeldUsage(UsageStore):
    """Writes run records only once `released` is set: until then they wait in the batch."""

    def __init__(self, database: Database) -> None:
        super().__init__(database)
        self.released = threading.Event()

    def record(self, *runs: RunUsage) -> None:
        assert self.released.wait(10)
        super().record(*runs)


def test_the_budget_counts_runs_whose_records_are_not_written_yet(
    make_client: MakeClient, chat_sections: Sections, upstream: Any, database: Database
) -> None:
    """Records are written in batches, a moment after their runs end: a run whose record
    still waits counts against the budget all the same."""
    client = make_client(**chat_sections(agent={"daily_token_budget": 15}))
    agent = services(client).agent
    held = HeldUsage(database)
    agent.ledger.usage = held
    try:
        first = client.post("/chat", json={"message": "one"}).json()["memory"]["agent"]
        assert first in ("running", "done")  # 15 tokens: the budget is reached
        wait_until(lambda: agent.in_flight == 0, what="the first run ending")
        assert (agent.recording, records(database)) == (1, [])  # its record is not written
        second = client.post("/chat", json={"message": "two"})
        assert second.json()["memory"] == {"injected": [], "agent": "over_budget", "updates": []}
    finally:
        held.released.set()
    assert len(upstream.received(AGENT_MODEL)) == 1
    recorded = wait_records(database, 2)
    assert [
        (r["state"], r["model_calls"], r["input_tokens"], r["output_tokens"]) for r in recorded
    ] == [("done", 1, 10, 5), ("over_budget", 0, 0, 0)]


def test_a_budget_of_zero_allows_no_run(
    make_client: MakeClient, chat_sections: Sections, upstream: Any
) -> None:
    client = make_client(**chat_sections(agent={"daily_token_budget": 0}))
    assert client.post("/chat", json={"message": "hi"}).json()["memory"]["agent"] == "over_budget"
    assert upstream.received(AGENT_MODEL) == []


@pytest.mark.slow
def test_the_budget_holds_across_two_processes(
    database_url: str, database: Database, chat_sections: Sections, upstream: Any, tmp_path: Path
) -> None:
    # A 10 s grace: the first agent run of a fresh process may wait for the token encoding's
    # load beside start-up, and on a loaded worker one ended 'timeout' under the default 3 s,
    # which this test (the budget, not the bound) has no reason to measure.
    sections = {
        "database": {"url": database_url},
        **chat_sections(agent={"daily_token_budget": 30, "grace_seconds": 10}),
    }
    servers = [ServeProcess(tmp_path, sections, name=f"replica{index}") for index in range(2)]
    try:
        first, second = (server.start() for server in servers)

        def chat(server: ServeProcess) -> str:
            reply = httpx.post(f"{server.url}/chat", json={"message": "hi"}, timeout=30)
            assert reply.status_code == 200, reply.text
            return reply.json()["memory"]["agent"]

        assert chat(first) in ("running", "done")  # 15 of 30
        wait_records(database, 1)
        assert chat(second) in ("running", "done")  # 30 of 30: reached
        wait_records(database, 2)
        assert (chat(first), chat(second)) == ("over_budget", "over_budget")
    finally:
        for server in servers:
            server.stop()
    assert len(upstream.received(AGENT_MODEL)) == 2
    assert [r["state"] for r in wait_records(database, 4)] == [
        "done",
        "done",
        "over_budget",
        "over_budget",
    ]


# -- kvmem usage ---------------------------------------------------------------------------------


def test_kvmem_usage_prints_per_day_or_per_user(
    database: Database, database_url: str, write_config: Callable[..., Path], tmp_path: Path
) -> None:
    usage = UsageStore(database)
    usage.record(past_run("alice", noon(0), (100, 10), cost=0.5, writes=1))
    usage.record(past_run("alice", noon(3), (1, 1)))
    usage.record(past_run("bob", noon(0), (500, 50)))
    config = str(write_config(f'database: {{url: "{database_url}"}}\n'))

    alice = invoke(["usage", "--config", config, "--user", "alice"], cwd=tmp_path)
    assert (alice.code, alice.json()) == (
        0,
        {
            "days": [
                {"date": day(0), **sums(1, 100, 10, 0.5, 1)},
                {"date": day(3), **sums(1, 1, 1, None, 0)},
            ],
            "totals": sums(2, 101, 11, 0.5, 1),
        },
    )
    everyone = invoke(["usage", "--config", config, "--days", "1"], cwd=tmp_path)
    assert (everyone.code, everyone.json()) == (
        0,
        {
            "users": [
                {"user": "bob", **sums(1, 500, 50, None, 0)},
                {"user": "alice", **sums(1, 100, 10, 0.5, 1)},
            ],
            "totals": sums(2, 600, 60, 0.5, 1),
        },
    )
    bad = invoke(["usage", "--config", config, "--days", "0"], cwd=tmp_path)
    assert bad.code == 2
    assert "0 is not in the range 1<=x<=366" in bad.stderr


def test_the_budget_counts_a_batch_that_lands_between_its_two_reads() -> None:
    """`tokens_today` adds this process's unwritten records to the database's. A batch that is
    committed and leaves the queue between those two reads must still be counted (twice at
    worst, which only ends the day a run early), never missed: missed, 50 concurrent runs of
    one user went a run past the budget's bound (test_run_slots, on PostgreSQL under load)."""
    landed = {"rows": 0, "done": False}
    record = RunUsage(
        user_id="ada",
        conversation_id=None,
        started_at=utcnow(),
        duration_seconds=0.1,
        model_calls=1,
        input_tokens=10,
        output_tokens=5,
        cost_usd=None,
        state="done",
        writes=0,
    )
    ledger = Ledger(None, None, 40, None)  # type: ignore[arg-type]

    def commit() -> None:  # the batch's transaction commits, then it leaves the queue
        if not landed["done"]:
            landed["done"] = True
            landed["rows"] += 15
            ledger._records._writing = []

    class Database:  # what UsageStore.tokens_today reads; the batch lands right after
        def tokens_today(self, user_id: str, now: datetime) -> int:
            rows = landed["rows"]
            commit()
            return rows

    class Writing(list[RunUsage]):  # the batch being written; it lands right after it is read
        def __iter__(self) -> Any:
            items = list(super().__iter__())
            commit()
            return iter(items)

    ledger.usage = Database()  # type: ignore[assignment]
    ledger._records._writing = Writing([record])
    assert ledger.tokens_today("ada") >= 15
    assert landed["done"]


def test_a_fenced_record_is_dropped_and_the_rest_of_its_batch_written(
    database: Database, make_store: Callable[..., MemoryStore]
) -> None:
    """A batch holding the record of a run that began before its user's erasure is written
    again without it: the other users' records in the batch must not be lost (their budget
    would be undercounted)."""
    began = utcnow()
    make_store().erase_user("alice")
    UsageStore(database).record(
        past_run("bob", began, (3, 1)),
        past_run("alice", began, (5, 2)),
        past_run("carol", began, (7, 3)),
    )
    assert [(r["user_id"], r["input_tokens"]) for r in records(database)] == [
        ("bob", 3),
        ("carol", 7),
    ]
