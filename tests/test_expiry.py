"""Memories that expire (CONTRACT section 24): `expires_at` set by REST, expired entries out of
memory (not injected, listed, counted or got) with an `expire` change in history, revert,
the sweep, the block, export and import, on SQLite and PostgreSQL.

Most tests move the store's clock (`store.clock`) instead of sleeping; one waits for a real
second to pass while the server runs.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kvmem.entries import iso
from kvmem.memory import retention
from tests.support.apps import services
from tests.support.clock import START, Clock
from tests.support.matchers import ISO_TIME, entry
from tests.support.plans import sqlite_trace

EXPIRE_BATCH = 20  # kvmem.memory.expirations's: entries marked per transaction


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def client(make_client: Any, clock: Clock) -> Any:
    """An app on this test's database whose store reads the test's clock."""
    app = make_client()
    services(app).store.clock = clock
    return app


def bad_request(message: str) -> dict[str, Any]:
    return {"error": {"code": "bad_request", "message": message}}


def put(client: Any, key: str, value: str, **body: Any) -> Any:
    return client.put(f"/memory/{key}", json={"value": value, **body})


def at(moment: datetime) -> str:
    return iso(moment)


# -- setting it by REST -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expires_in", "delta"),
    [
        ("90m", timedelta(minutes=90)),
        ("12h", timedelta(hours=12)),
        ("3d", timedelta(days=3)),
        ("2w", timedelta(weeks=2)),
        (3600, timedelta(seconds=3600)),
        ("45s", timedelta(seconds=45)),
    ],
)
def test_put_with_expires_in_sets_the_moment_from_now(
    client: Any, clock: Clock, expires_in: Any, delta: timedelta
) -> None:
    response = put(client, "trip", "in Lisbon", expires_in=expires_in)
    assert response.status_code == 201, response.text
    expected = entry("trip", "in Lisbon", 2, expires_at=at(START + delta))
    assert response.json()["memory"] == expected
    assert client.get("/memory/trip").json() == expected
    assert client.get("/memory").json()["memories"] == [expected]


def test_put_with_expires_at_takes_a_date_or_a_date_time_and_put_without_clears_it(
    client: Any,
) -> None:
    # A date is the end of that day, UTC: "until Friday" holds all Friday.
    friday = put(client, "trip", "in Lisbon", expires_at="2030-03-08").json()["memory"]
    assert friday["expires_at"] == "2030-03-08T23:59:59.000000Z"
    # A date-time with an offset is converted to UTC.
    moved = put(client, "trip", "in Porto", expires_at="2030-03-05T09:30:00+02:00")
    assert moved.status_code == 200
    assert moved.json()["memory"]["expires_at"] == "2030-03-05T07:30:00.000000Z"
    # A PUT without either field sets an entry that never expires.
    forever = put(client, "trip", "in Porto")
    assert forever.json()["memory"] == entry("trip", "in Porto", 2)
    # The same value with another expiry changes only the expiry: no change in history.
    again = put(client, "trip", "in Porto", expires_in="1d").json()["memory"]
    assert again["expires_at"] == at(START + timedelta(days=1))
    assert [c["new_value"] for c in client.get("/memory/trip/history").json()["changes"]] == [
        "in Porto",
        "in Lisbon",
    ]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            {"expires_at": "2030-03-08", "expires_in": "1d"},
            "give expires_at or expires_in, not both",
        ),
        (
            {"expires_at": "2030-03-04T09:00:00Z"},
            "expires_at 2030-03-04T09:00:00+00:00 is not in the future "
            "(now is 2030-03-04T10:00:00+00:00)",
        ),
        (
            {"expires_at": "2030-03-04T10:00:00Z"},
            "expires_at 2030-03-04T10:00:00+00:00 is not in the future "
            "(now is 2030-03-04T10:00:00+00:00)",
        ),
        (
            {"expires_at": "next friday"},
            "expires_at 'next friday' is not a date (YYYY-MM-DD, meaning the end of that "
            "day, UTC) or an RFC 3339 date-time",
        ),
        (
            {"expires_at": "20300308"},
            "expires_at '20300308' is not a date (YYYY-MM-DD, meaning the end of that "
            "day, UTC) or an RFC 3339 date-time",
        ),
        ({"expires_in": 0}, "expires_in must be at least one second"),
        ({"expires_in": -5}, "expires_in must be at least one second"),
        (
            {"expires_in": "3y"},
            'expires_in \'3y\' is not seconds, or a number with a unit: "90m", "12h", "3d", "2w"',
        ),
        ({"expires_in": "999999w"}, "expires_in is more than 36600 days"),
    ],
)
def test_put_refuses_both_fields_a_time_not_in_the_future_and_garbage(
    client: Any, body: dict[str, Any], message: str
) -> None:
    response = put(client, "trip", "in Lisbon", **body)
    assert (response.status_code, response.json()) == (400, bad_request(message))
    assert client.get("/memory/trip").status_code == 404
    assert client.get("/memory/history").json() == {"changes": [], "next": None}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            {"expires_in": True},
            "invalid request body: expires_in.int: Input should be a valid integer; "
            "expires_in.str: Input should be a valid string",
        ),
        ({"expires_at": 5}, "invalid request body: expires_at: Input should be a valid string"),
    ],
)
def test_an_expiry_of_the_wrong_type_is_refused(
    client: Any, body: dict[str, Any], message: str
) -> None:
    response = put(client, "trip", "in Lisbon", **body)
    assert (response.status_code, response.json()) == (400, bad_request(message))
    assert client.get("/memory/trip").status_code == 404


# -- once expired ---------------------------------------------------------------------------------


def test_an_expired_entry_is_not_listed_got_counted_or_injected(
    make_client: Any, clock: Clock, tokens: Any
) -> None:
    app = make_client(memory={"tokenLimit": 5})
    services(app).store.clock = clock
    put(app, "trip", "in Lisbon", expires_in="1h")  # 2 tokens
    put(app, "name", "Ada")  # 1 token
    listing = app.get("/memory").json()
    assert (listing["total_tokens"], [m["key"] for m in listing["memories"]]) == (
        3,
        ["name", "trip"],
    )
    assert (
        "trip: in Lisbon (until 2030-03-04)" in app.post("/memory/context", json={}).json()["block"]
    )
    # 3 of 5: 3 more tokens do not fit while the trip is memory.
    assert put(app, "city", "in Rome now").status_code == 409

    clock.advance(hours=1)  # exactly at expires_at: expired
    listing = app.get("/memory").json()
    assert listing["memories"] == [entry("name", "Ada", 1)]
    assert (listing["total_tokens"], listing["usage_percentage"]) == (1, 20.0)
    assert app.get("/memory/trip").json() == {
        "error": {"code": "not_found", "message": "no memory with key 'trip'"}
    }
    context = app.post("/memory/context", json={}).json()
    assert (context["injected"], "Lisbon" in context["block"]) == (["name"], False)
    # Its tokens no longer count against tokenLimit.
    assert put(app, "city", "in Rome now").status_code == 201
    # `include_expired` lists it, marked.
    everything = app.get("/memory?include_expired=true").json()
    assert everything["memories"] == [
        {**entry("city", "in Rome now", 3), "expired": False},
        {**entry("name", "Ada", 1), "expired": False},
        {
            **entry("trip", "in Lisbon", 2, expires_at=at(START + timedelta(hours=1))),
            "expired": True,
        },
    ]
    assert everything["total_tokens"] == 4
    assert app.get("/memory?include_expired=maybe").status_code == 400


def test_history_holds_an_expire_change_dated_expires_at_and_revert_brings_it_back(
    client: Any, clock: Clock
) -> None:
    put(client, "trip", "in Lisbon", expires_in="2d")
    clock.advance(days=3)
    changes = client.get("/memory/trip/history").json()["changes"]
    assert changes == [
        {
            "id": changes[0]["id"],
            "key": "trip",
            "op": "expire",
            "old_value": "in Lisbon",
            "new_value": None,
            "source": "system",
            "conversation_id": None,
            "at": at(START + timedelta(days=2)),
        },
        {
            "id": changes[1]["id"],
            "key": "trip",
            "op": "set",
            "old_value": None,
            "new_value": "in Lisbon",
            "source": "manual",
            "conversation_id": None,
            "at": ISO_TIME,
        },
    ]
    # Reading again records nothing more.
    assert client.get("/memory/history").json()["changes"] == changes
    # Revert to the set: the value is back, as an entry that never expires.
    reverted = client.post("/memory/trip/revert", json={"to": changes[1]["id"]})
    assert reverted.status_code == 200, reverted.text
    assert reverted.json()["memory"] == entry("trip", "in Lisbon", 2, source="revert")
    assert client.get("/memory/trip").json() == entry("trip", "in Lisbon", 2, source="revert")
    history = client.get("/memory/trip/history").json()["changes"]
    assert [(c["op"], c["old_value"], c["new_value"]) for c in history] == [
        ("set", None, "in Lisbon"),
        ("expire", "in Lisbon", None),
        ("set", None, "in Lisbon"),
    ]
    clock.advance(weeks=100)
    assert client.get("/memory/trip").status_code == 200


def test_revert_to_the_expire_change_removes_the_expired_entry(client: Any, clock: Clock) -> None:
    put(client, "trip", "in Lisbon", expires_in="1h")
    clock.advance(hours=2)
    [expire, _] = client.get("/memory/trip/history").json()["changes"]
    reverted = client.post("/memory/trip/revert", json={"to": expire["id"]})
    assert reverted.json() == {"memory": None, "total_tokens": 0, "token_limit": None}
    assert client.get("/memory?include_expired=true").json()["memories"] == []


def test_a_write_on_an_expired_key_starts_it_anew_and_delete_removes_an_expired_entry(
    client: Any, clock: Clock
) -> None:
    put(client, "trip", "in Lisbon", expires_in="1h")
    put(client, "city", "Rome", expires_in="1h")
    clock.advance(hours=2)
    # No read came between: the write itself records the expire change first.
    again = put(client, "trip", "in Lisbon")
    assert again.status_code == 201
    assert again.json()["memory"] == entry("trip", "in Lisbon", 2)
    ops = [
        (c["op"], c["old_value"], c["new_value"])
        for c in client.get("/memory/trip/history").json()["changes"]
    ]
    assert ops == [
        ("set", None, "in Lisbon"),
        ("expire", "in Lisbon", None),
        ("set", None, "in Lisbon"),
    ]
    # An expired entry can be removed for good; its expire change says it left memory.
    assert client.delete("/memory/city").status_code == 204
    assert client.get("/memory?include_expired=true").json()["memories"] == [
        {**entry("trip", "in Lisbon", 2), "expired": False}
    ]
    assert [c["op"] for c in client.get("/memory/city/history").json()["changes"]] == [
        "expire",
        "set",
    ]


def test_the_sweep_expires_entries_of_users_nobody_reads(make_store: Any, clock: Clock) -> None:
    store = make_store()
    store.clock = clock
    store.set("alice", "trip", "Lisbon", expires_at=START + timedelta(hours=1))
    store.set("bob", "visit", "sister", expires_at=START + timedelta(hours=2))
    store.set("bob", "name", "Bob")
    clock.advance(hours=3)
    expired = asyncio.run(retention.expire_once(store))
    assert expired == 2
    # The sweep wrote the changes: a reader that expires nothing itself finds them.
    store.expire_due = lambda user_id, now: 0  # type: ignore[method-assign]
    assert [(c.key, c.op, c.source, c.at) for c in store.history("bob").changes[:1]] == [
        ("visit", "expire", "system", START + timedelta(hours=2))
    ]
    assert [e.key for e in store.snapshot("bob").entries] == ["name"]
    assert store.snapshot("alice").entries == ()
    assert asyncio.run(retention.expire_once(store)) == 0


def test_one_sweep_transaction_expires_at_most_a_batch(make_store: Any, clock: Clock) -> None:
    store = make_store()
    store.clock = clock
    for index in range(EXPIRE_BATCH + 7):
        store.set(f"user{index % 3}", f"k{index}", "v", expires_at=START + timedelta(minutes=1))
    clock.advance(hours=1)
    assert retention.expire_due_batch(store) == EXPIRE_BATCH
    assert retention.expire_due_batch(store) == 7
    assert retention.expire_due_batch(store) == 0
    total = sum(
        1
        for user in ("user0", "user1", "user2")
        for change in store.history(user, limit=500).changes
        if change.op == "expire"
    )
    assert total == EXPIRE_BATCH + 7


def test_a_read_expires_all_of_a_users_due_entries_in_batches(
    make_store: Any, clock: Clock
) -> None:
    store = make_store()
    store.clock = clock
    for index in range(EXPIRE_BATCH * 2 + 1):
        store.set("alice", f"k{index}", "v", expires_at=START + timedelta(minutes=1))
    store.set("alice", "name", "Ada")
    clock.advance(minutes=1)
    assert [e.key for e in store.snapshot("alice").entries] == ["name"]
    expires = [c for c in store.history("alice", limit=500).changes if c.op == "expire"]
    assert len(expires) == EXPIRE_BATCH * 2 + 1


# -- export and import ------------------------------------------------------------------------------


def test_export_and_import_carry_expires_at(client: Any, clock: Clock) -> None:
    put(client, "trip", "in Lisbon", expires_at="2030-03-08")
    put(client, "name", "Ada")
    document = client.get("/memory/export").json()
    assert [(m["key"], m["expires_at"]) for m in document["memories"]] == [
        ("trip", "2030-03-08T23:59:59.000000Z"),
        ("name", None),
    ]
    client.delete("/memory")
    imported = client.post("/memory/import", json=document)
    assert imported.json()["imported"] == 2
    assert client.get("/memory/trip").json()["expires_at"] == "2030-03-08T23:59:59.000000Z"
    assert client.get("/memory/name").json()["expires_at"] is None
    # Imported again after the trip ended: it is not brought back.
    clock.advance(days=10)
    client.delete("/memory")
    again = client.post("/memory/import", json=document)
    assert again.json() == {"imported": 1, "deleted": 0, "total_tokens": 1, "token_limit": None}
    assert [m["key"] for m in client.get("/memory?include_expired=true").json()["memories"]] == [
        "name"
    ]


def test_an_import_with_a_bad_expires_at_is_refused_whole(client: Any) -> None:
    document = {
        "memories": [
            {"key": "name", "value": "Ada"},
            {"key": "trip", "value": "Lisbon", "expires_at": "soon"},
        ]
    }
    response = client.post("/memory/import", json=document)
    assert response.json() == bad_request(
        "memories[1].expires_at 'soon' is not a date (YYYY-MM-DD, meaning the end of that day, "
        "UTC) or an RFC 3339 date-time"
    )
    assert client.get("/memory").json()["memories"] == []


# -- while the server runs: real time -------------------------------------------------------------


def test_an_entry_expires_while_the_server_runs(
    upstream: Any, chat_sections: Any, make_client: Any
) -> None:
    from tests.support.apps import MAIN_MODEL

    client = make_client(**chat_sections(agent={"enabled": False}))
    put(client, "name", "Ada")
    written = put(client, "visit", "my sister is visiting", expires_in=1).json()["memory"]
    expires_at = datetime.fromisoformat(written["expires_at"].replace("Z", "+00:00"))

    before = client.post("/chat", json={"message": "Who is here?"}).json()
    assert before["memory"]["injected"] == ["name", "visit"]
    assert "visit: my sister is visiting (until " in upstream.received(MAIN_MODEL)[-1].system

    time.sleep(max(0.0, (expires_at - datetime.now(UTC)).total_seconds()) + 0.05)
    after = client.post("/chat", json={"message": "Who is here?"}).json()
    assert after["memory"]["injected"] == ["name"]
    assert "sister" not in upstream.received(MAIN_MODEL)[-1].system
    [expire, _] = client.get("/memory/visit/history").json()["changes"]
    assert (expire["op"], expire["source"], expire["at"]) == (
        "expire",
        "system",
        written["expires_at"],
    )


@pytest.mark.sqlite_only
def test_the_sqlite_fast_read_stays_one_read_while_entries_wait_to_expire(
    make_store: Any, clock: Clock
) -> None:
    store = make_store()
    store.clock = clock
    store.set("alice", "trip", "Lisbon", expires_at=START + timedelta(hours=1))
    store.set("alice", "name", "Ada")
    first = store.snapshot("alice").entries  # read once, then cached

    def reads() -> list[str]:
        seen: list[str] = []
        with sqlite_trace(seen.append):
            entries = store.snapshot("alice").entries
        assert entries == store.snapshot("alice").entries
        return [s for s in seen if s.lstrip().upper().startswith(("SELECT", "UPDATE", "INSERT"))]

    [only] = reads()
    assert only.lstrip().upper().startswith("SELECT USERS.MEMORIES_ENABLED")
    assert store.snapshot("alice").entries is first  # the same tuple: the block cache holds
    clock.advance(hours=1)
    expiring = reads()  # this read expires the trip: a write, once
    assert sum(s.upper().startswith("INSERT INTO MEMORY_CHANGES") for s in expiring) == 1
    assert [e.key for e in store.snapshot("alice").entries] == ["name"]
    [only] = reads()
    assert only.lstrip().upper().startswith("SELECT USERS.MEMORIES_ENABLED")


def test_the_batch_is_the_stores() -> None:
    from kvmem.memory.expirations import EXPIRE_BATCH as STORES

    assert STORES == EXPIRE_BATCH


def test_a_due_entry_is_left_out_even_when_its_expiry_cannot_be_written_now(
    make_store: Any, clock: Clock
) -> None:
    from kvmem.errors import StoreUnavailable

    store = make_store()
    store.clock = clock
    store.set("alice", "trip", "Lisbon", expires_at=START + timedelta(hours=1))
    store.set("alice", "name", "Ada")
    clock.advance(hours=2)

    def unavailable(user_id: str, now: datetime) -> int:
        raise StoreUnavailable("the writer is busy")

    store.expire_due = unavailable  # type: ignore[method-assign]
    assert [e.key for e in store.snapshot("alice").entries] == ["name"]
    del store.expire_due  # the next read marks it
    assert [e.key for e in store.snapshot("alice").entries] == ["name"]
    assert [c.op for c in store.history("alice").changes] == ["expire", "set", "set"]
