"""Group commit on SQLite: writes queued together share one transaction, each with its own
checks, history row, version bump and result (`kvmem.memory.group_commit`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
from sqlalchemy import select, text
from sqlalchemy.exc import IntegrityError
from starlette.testclient import TestClient

from kvmem.config import Config
from kvmem.db.engine import Database
from kvmem.db.tables import User
from kvmem.entries import Written
from kvmem.errors import InvalidKey, MemoryFull
from kvmem.memory.rules import MemoryRules
from kvmem.memory.store import MemoryStore
from kvmem.tokens import TokenCounter

pytestmark = pytest.mark.sqlite_only  # group commit is SQLite's; PostgreSQL commits each write

GATE = "gate"  # the value whose counting holds the writer thread until the test opens it
WAIT_S = 10


class GatedTokens:
    """Counts as `TokenCounter`; counting `GATE` blocks (in the writer thread) until opened,
    so that the writes queued meanwhile form the next batch, in the order they were queued."""

    def __init__(self, tokens: TokenCounter) -> None:
        self.tokens = tokens
        self.entered = threading.Event()
        self.opened = threading.Event()

    def count(self, text: str) -> int:
        if text == GATE:
            self.entered.set()
            assert self.opened.wait(WAIT_S)
        return self.tokens.count(text)


class Batched:
    """A store whose writer thread runs the queued writes as one batch, on request."""

    def __init__(self, database: Database, tokens: TokenCounter, **memory: Any) -> None:
        config = Config.model_validate({"memory": memory})
        self.gate = GatedTokens(tokens)
        self.store = MemoryStore(database, MemoryRules.from_config(config.memory), self.gate)  # type: ignore[arg-type]
        self.batches: list[int] = []
        group = self.store.start_group_commit(on_batch=self.batches.append)
        assert group is not None
        self.group = group  # its queue shows when a write has been queued
        self.pool = ThreadPoolExecutor(80)

    def run(self, writes: list[Callable[[], Written]]) -> list[Written | Exception]:
        """Run `writes` (each a blocking call) as one batch; each one's result or error."""
        held = self.pool.submit(self.store.set, "gatekeeper", "gate", GATE)
        assert self.gate.entered.wait(WAIT_S)
        futures: list[Future[Written]] = []
        for write in writes:  # one at a time, so that the queue's order is the list's
            futures.append(self.pool.submit(write))
            wait_until(lambda: self.group.pending == len(futures))
        self.gate.opened.set()
        assert held.result(WAIT_S).created
        outcomes: list[Written | Exception] = []
        for future in futures:
            try:
                outcomes.append(future.result(WAIT_S))
            except Exception as exc:
                outcomes.append(exc)
        return outcomes

    def close(self) -> None:
        self.gate.opened.set()
        self.store.stop_group_commit()
        self.pool.shutdown()


def wait_until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


@pytest.fixture
def batched(database: Database, tokens: TokenCounter) -> Iterator[Callable[..., Batched]]:
    made: list[Batched] = []

    def make(**memory: Any) -> Batched:
        made.append(Batched(database, tokens, **memory))
        return made[-1]

    yield make
    for each in made:
        each.close()


def versions(database: Database) -> dict[str, int]:
    with database.reading() as session:
        return dict(session.execute(select(User.id, User.memory_version)).all())


def changes(store: MemoryStore, user: str) -> list[tuple[str, str, str | None, str | None]]:
    page = store.history(user, None, 100, None)
    return [(c.key, c.op, c.old_value, c.new_value) for c in reversed(page.changes)]


def test_writes_of_many_users_share_one_batch_each_with_its_own_result(
    batched: Callable[..., Batched], database: Database
) -> None:
    world = batched()
    users = [f"user{number}" for number in range(50)]
    outcomes = world.run(
        [lambda user=user: world.store.set(user, "name", f"I am {user}") for user in users]
    )
    assert world.batches == [1, 50]
    for user, written in zip(users, outcomes, strict=True):
        assert isinstance(written, Written)
        assert (written.created, written.entry.key, written.entry.value) == (
            True,
            "name",
            f"I am {user}",
        )
        assert written.total_tokens == written.entry.token_count
        assert world.store.get(user, "name").value == f"I am {user}"
        assert changes(world.store, user) == [("name", "set", None, f"I am {user}")]
    change_ids = [w.change_id for w in outcomes if isinstance(w, Written)]
    assert len(set(change_ids)) == 50
    assert versions(database) == {"gatekeeper": 1, **dict.fromkeys(users, 1)}


def test_memory_full_in_a_batch_fails_only_that_write(
    batched: Callable[..., Batched], database: Database, make_value: Callable[[int], str]
) -> None:
    world = batched(token_limit=10)
    outcomes = world.run(
        [
            lambda: world.store.set("alice", "a", make_value(5)),
            lambda: world.store.set("bob", "b", make_value(11)),
            lambda: world.store.set("carol", "c", make_value(10)),
            lambda: world.store.set("dave", "Bad", "x"),
        ]
    )
    assert world.batches == [1, 3]  # the bad key is refused before the batch runs
    alice, bob, carol, dave = outcomes
    assert isinstance(alice, Written) and alice.total_tokens == 5
    assert isinstance(bob, MemoryFull)
    assert isinstance(carol, Written) and carol.total_tokens == 10
    assert isinstance(dave, InvalidKey)
    assert changes(world.store, "bob") == []
    assert world.store.snapshot("bob").entries == ()
    # Bob's write left nothing behind, not even his user row.
    assert versions(database) == {"gatekeeper": 1, "alice": 1, "carol": 1}


def test_writes_of_one_user_in_a_batch_see_each_other(
    batched: Callable[..., Batched], database: Database, make_value: Callable[[int], str]
) -> None:
    world = batched(token_limit=10)
    store = world.store
    outcomes = world.run(
        [
            lambda: store.set("alice", "first", make_value(6)),
            lambda: store.set("alice", "second", make_value(6)),  # 12 with the first: full
            lambda: store.set("alice", "third", make_value(3)),
            lambda: store.set("alice", "first", make_value(1)),  # replaces the first's 6
            lambda: store.set("alice", "second", make_value(6)),  # 1 + 3 + 6 now fits
        ]
    )
    assert world.batches == [1, 5]
    first, second, third, first_again, second_again = outcomes
    assert isinstance(first, Written) and (first.created, first.total_tokens) == (True, 6)
    assert isinstance(second, MemoryFull)
    assert isinstance(third, Written) and third.total_tokens == 9
    assert isinstance(first_again, Written)
    assert (first_again.created, first_again.total_tokens) == (False, 4)
    assert isinstance(second_again, Written) and second_again.total_tokens == 10
    assert changes(store, "alice") == [
        ("first", "set", None, make_value(6)),
        ("third", "set", None, make_value(3)),
        ("first", "set", make_value(6), make_value(1)),
        ("second", "set", None, make_value(6)),
    ]
    assert versions(database)["alice"] == 4


class Late(Exception):
    """The test's guard failing."""


def test_a_guarded_write_runs_alone_and_never_commits_after_its_guard_fails(
    batched: Callable[..., Batched], database: Database
) -> None:
    world = batched()
    store = world.store
    seen: list[bool] = []

    def guard() -> None:
        # Called right before the guarded write's own COMMIT, inside its transaction, on the
        # caller's thread: not in the writer thread's batch.
        seen.append(threading.current_thread().name != "kvmem-writer")
        raise Late

    def guarded() -> Written:
        return store.set("alice", "late", "too late", "agent", guard=guard)

    outcomes = world.run([lambda: store.set("bob", "b", "on time")])
    with pytest.raises(Late):
        guarded()
    assert seen == [True]
    assert isinstance(outcomes[0], Written)
    assert store.snapshot("alice").entries == ()
    assert changes(store, "alice") == []
    assert "alice" not in versions(database)
    passing = store.set("alice", "fine", "in time", "agent", guard=lambda: None)
    assert passing.created and store.get("alice", "fine").value == "in time"
    assert world.batches == [1, 1]  # guarded writes never went through the writer thread


def test_a_database_error_in_a_batch_gives_every_write_its_own_result(
    batched: Callable[..., Batched], database: Database
) -> None:
    with database.writing() as session:
        session.execute(
            text(
                "CREATE TRIGGER refuse_boom BEFORE INSERT ON memory_entries WHEN NEW.key = 'boom' "
                "BEGIN SELECT RAISE(ABORT, 'boom refused'); END"
            )
        )
    world = batched(token_limit=10)
    store = world.store
    outcomes = world.run(
        [
            lambda: store.set("alice", "a", "one"),
            lambda: store.set("bob", "boom", "two"),
            lambda: store.set("carol", "c", "three"),
            lambda: store.set("alice", "a2", "four"),
        ]
    )
    assert world.batches == [1, 4]
    alice, bob, carol, alice_again = outcomes
    assert isinstance(bob, IntegrityError)
    assert isinstance(alice, Written) and alice.created
    assert isinstance(carol, Written) and carol.created
    assert isinstance(alice_again, Written) and alice_again.total_tokens == (
        alice.total_tokens + alice_again.entry.token_count
    )
    assert [e.key for e in store.snapshot("alice").entries] == ["a", "a2"]
    assert changes(store, "alice") == [("a", "set", None, "one"), ("a2", "set", None, "four")]
    assert changes(store, "bob") == []
    assert changes(store, "carol") == [("c", "set", None, "three")]
    assert versions(database) == {"gatekeeper": 1, "alice": 2, "carol": 1}


def test_stopping_answers_every_queued_write_then_writes_run_directly(
    batched: Callable[..., Batched],
) -> None:
    world = batched()
    store = world.store
    held = world.pool.submit(store.set, "gatekeeper", "gate", GATE)
    assert world.gate.entered.wait(WAIT_S)
    queued = [world.pool.submit(store.set, f"user{n}", "k", "v") for n in range(10)]
    wait_until(lambda: world.group.pending == 10)
    stopping = world.pool.submit(store.stop_group_commit)
    world.gate.opened.set()
    stopping.result(WAIT_S)
    assert held.result(WAIT_S).created
    assert all(future.result(WAIT_S).created for future in queued)
    assert world.batches == [1, 10]
    assert store.set("late", "k", "v").created  # no writer thread: the caller writes
    assert world.batches == [1, 10]
    assert not any(t.name == "kvmem-writer" for t in threading.enumerate())


def test_the_app_writes_through_the_writer_thread_and_stops_it(
    make_client: Callable[..., TestClient],
) -> None:
    client = make_client()
    assert any(t.name == "kvmem-writer" for t in threading.enumerate())
    with ThreadPoolExecutor(20) as pool:
        responses = list(
            pool.map(lambda n: client.put(f"/memory/k{n}", json={"value": f"v{n}"}), range(20))
        )
    assert sorted(r.status_code for r in responses) == [201] * 20
    listed = client.get("/memory").json()
    assert sorted(m["key"] for m in listed["memories"]) == sorted(f"k{n}" for n in range(20))
    client.__exit__(None, None, None)
    assert not any(t.name == "kvmem-writer" for t in threading.enumerate())


# -- an answer comes only after the COMMIT ------------------------------------------------------

DOOMED = "doomed"


def doom_commits_writing(database: Database, key: str) -> None:
    """Make the COMMIT of any transaction that writes `key` fail after all of its statements
    went through: a trigger adds a row whose foreign key SQLite checks only at COMMIT
    (deferred) and which never holds."""
    with database.writing() as session:
        session.execute(
            text(
                "CREATE TABLE dangling (user_id TEXT REFERENCES users (id) "
                "DEFERRABLE INITIALLY DEFERRED)"
            )
        )
        session.execute(
            text(
                f"CREATE TRIGGER doom AFTER INSERT ON memory_entries WHEN NEW.key = '{key}' "
                "BEGIN INSERT INTO dangling VALUES ('nobody'); END"
            )
        )


def test_a_write_whose_commit_fails_is_answered_with_the_error_alone(
    batched: Callable[..., Batched], database: Database
) -> None:
    """A lone write through the writer thread: its statements succeed, its COMMIT fails; the
    caller gets the error, never a success for a write the database does not hold."""
    doom_commits_writing(database, DOOMED)
    world = batched()
    store = world.store
    with pytest.raises(IntegrityError, match="FOREIGN KEY constraint failed"):
        store.set("alice", DOOMED, "never committed")
    assert world.batches == [1]  # it went through the writer thread, alone
    assert store.snapshot("alice").entries == ()
    assert changes(store, "alice") == []
    assert versions(database) == {}
    assert store.set("alice", "fine", "kept").created  # the writer thread goes on
    assert [e.key for e in store.snapshot("alice").entries] == ["fine"]


def test_a_batch_whose_commit_fails_answers_each_write_with_its_own_commit(
    batched: Callable[..., Batched], database: Database
) -> None:
    """The batch's COMMIT fails after every write went through: no write is answered from
    it; each runs again alone, and only the write that cannot commit gets an error."""
    doom_commits_writing(database, DOOMED)
    world = batched()
    store = world.store
    outcomes = world.run(
        [
            lambda: store.set("alice", "a", "one"),
            lambda: store.set("bob", DOOMED, "two"),
            lambda: store.set("carol", "c", "three"),
        ]
    )
    assert world.batches == [1, 3]
    alice, bob, carol = outcomes
    assert isinstance(bob, IntegrityError) and "FOREIGN KEY constraint failed" in str(bob)
    assert isinstance(alice, Written) and alice.created
    assert isinstance(carol, Written) and carol.created
    assert store.snapshot("bob").entries == ()
    assert changes(store, "bob") == []
    assert changes(store, "alice") == [("a", "set", None, "one")]
    assert changes(store, "carol") == [("c", "set", None, "three")]
    assert versions(database) == {"gatekeeper": 1, "alice": 1, "carol": 1}


def test_a_put_whose_commit_fails_is_not_answered_2xx(
    make_client: Callable[..., TestClient], database: Database
) -> None:
    """ "A 2xx means committed": a PUT whose COMMIT fails is a 500, and nothing is stored."""
    doom_commits_writing(database, DOOMED)
    client = make_client()
    response = client.put(f"/memory/{DOOMED}", json={"value": "never committed"})
    assert (response.status_code, response.json()) == (
        500,
        {
            "error": {
                "code": "internal_error",
                "message": "internal error; the server log has the details",
            }
        },
    )
    missing = client.get(f"/memory/{DOOMED}")
    assert missing.status_code == 404
    assert client.get("/memory").json()["memories"] == []
    assert client.get("/memory/history").json() == {"changes": [], "next": None}
