"""The history sweep (`kvmem.memory.retention`): it deletes expired changes in short batches, and a
request's write never waits behind the whole sweep, on both backends."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, insert, select
from starlette.testclient import TestClient

from kvmem.db.engine import Database
from kvmem.db.tables import MemoryChange, User
from kvmem.entries import utcnow
from kvmem.memory.retention import prune_expired_batch, prune_expired_history, sweep_once
from kvmem.memory.store import MemoryStore
from tests.support.apps import wait_until

EXPIRED = 20_000  # 100 batches of the sweep's 200
USERS = 200


def plant_expired(database: Database, count: int) -> None:
    """`count` changes recorded 400 days ago, spread over `USERS` users, in one transaction."""
    at = utcnow() - timedelta(days=400)
    with database.writing() as session:
        session.execute(insert(User), [{"id": f"idle-{n}", "created_at": at} for n in range(USERS)])
        session.execute(
            insert(MemoryChange),
            [
                {
                    "user_id": f"idle-{n % USERS}",
                    "key": f"k{n % 7}",
                    "op": "set",
                    "old_value": None,
                    "new_value": "old",
                    "source": "manual",
                    "conversation_id": None,
                    "at": at,
                }
                for n in range(count)
            ],
        )


def stored_changes(database: Database) -> int:
    with database.reading() as session:
        return session.scalar(select(func.count()).select_from(MemoryChange))


def test_a_write_lands_between_the_batches_of_a_long_sweep(
    make_client: Callable[..., TestClient], database: Database
) -> None:
    plant_expired(database, EXPIRED)
    client = make_client(memory={"history": {"keep_days": 30}})  # the app sweeps at start
    wait_until(lambda: stored_changes(database) < EXPIRED, 30, "the sweep's first batch")
    response = client.put("/memory/likes", json={"value": "tea"})
    left = stored_changes(database)
    assert response.status_code == 201
    # The write was answered while the sweep still had expired changes to delete: it did
    # not wait for the sweep to end (ordering, not time: the sweep has 40 batches).
    assert left > 1
    wait_until(lambda: stored_changes(database) == 1, 30, "the sweep's end")
    assert client.get("/memory/history").json()["changes"][0]["new_value"] == "tea"


def test_a_write_from_another_thread_lands_between_the_batches_of_prune_expired_history(
    make_store: Callable[..., MemoryStore], database: Database
) -> None:
    store = make_store(history={"keep_days": 30})
    plant_expired(database, EXPIRED)
    swept: list[int] = []
    sweeper = threading.Thread(target=lambda: swept.append(prune_expired_history(store)))
    sweeper.start()
    try:
        wait_until(lambda: stored_changes(database) < EXPIRED, 30, "the sweep's first batch")
        written = store.set("writer", "likes", "tea")
        left = stored_changes(database)
    finally:
        sweeper.join()
    assert (written.created, written.entry.value) == (True, "tea")
    assert left > 1  # answered before the sweep's last batch
    assert swept == [EXPIRED]
    assert stored_changes(database) == 1  # the write's own change stays


BATCH_SECONDS = 0.2  # each slowed batch holds the writer this long


def slow_batches(store: MemoryStore) -> list[tuple[float, float]]:
    """Make each of the sweep's batches hold the writer `BATCH_SECONDS`; the (start, end)
    of each batch, as `time.monotonic()`, are appended to the list returned."""
    prune_all = store.history_log.prune_all
    batches: list[tuple[float, float]] = []

    def slow(session: Any, batch: int) -> int:
        started = time.monotonic()
        time.sleep(BATCH_SECONDS)
        deleted = prune_all(session, batch)
        batches.append((started, time.monotonic()))
        return deleted

    store.history_log.prune_all = slow  # type: ignore[method-assign]
    return batches


def test_the_sweep_rests_as_long_as_each_batch_took(
    make_store: Callable[..., MemoryStore], database: Database
) -> None:
    """Between two batches the writer is left free at least as long as the batch held it,
    so a write arriving during a long sweep finds it free half the time (a sweep that only
    yields, `sleep(0)`, holds it all the time)."""
    store = make_store(history={"keep_days": 30})
    plant_expired(database, 40)
    batches = slow_batches(store)
    assert asyncio.run(sweep_once(store, batch=10)) == 40
    assert len(batches) == 5
    for (started, ended), (next_started, _) in itertools.pairwise(batches):
        assert next_started - ended >= ended - started


@pytest.mark.sqlite_only  # the in-process writer turn is SQLite's
def test_a_write_waiting_with_the_sweep_goes_before_its_next_batch(
    make_store: Callable[..., MemoryStore], database: Database
) -> None:
    """A request's write (W1) holds the writer; a sweep batch and another write (W2) come to
    wait for it. When W1 ends, W2 must go first, and not wait a whole batch: the sweep's
    transactions are `background` ones."""
    store = make_store(history={"keep_days": 30})
    plant_expired(database, 50)
    batches = slow_batches(store)
    writers = database._writers
    assert writers is not None
    for round_number in range(5):
        release, holding = threading.Event(), threading.Event()
        with ThreadPoolExecutor(3) as pool:
            w1 = pool.submit(hold_the_writer, database, holding, release)
            assert holding.wait(10)
            sweep = pool.submit(prune_expired_batch, store, 10)
            time.sleep(0.1)  # the batch comes to the writer's lock first
            w2 = pool.submit(timed_write, store, f"tea {round_number}")
            wait_until(lambda: writers.waiting == 1, 10, "the second write waiting")
            released = time.monotonic()
            release.set()
            w1.result()
            w2_done = w2.result(timeout=10)
            assert sweep.result(timeout=10) == 10
        # The batch holds the writer BATCH_SECONDS: a write that went after it is done after
        # its end. (Its start is no line to draw: the batch may take the writer the moment W2
        # lets go, microseconds before W2's thread reads the clock.)
        batch_ended = batches[-1][1]
        assert w2_done < batch_ended, f"round {round_number}: the write waited for the batch"
        assert w2_done - released < BATCH_SECONDS


def hold_the_writer(database: Database, holding: threading.Event, release: threading.Event) -> None:
    with database.writing():
        holding.set()
        assert release.wait(10)


def timed_write(store: MemoryStore, value: str) -> float:
    """Write; when it was done (`time.monotonic()`)."""
    store.set("writer", "likes", value)
    return time.monotonic()
