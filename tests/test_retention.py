"""The history sweep (`kvmem.memory.retention`): it deletes expired changes in short batches, and a
request's write never waits behind the whole sweep, on both backends."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta

from sqlalchemy import func, insert, select
from starlette.testclient import TestClient

from kvmem.db.engine import Database
from kvmem.db.tables import MemoryChange, User
from kvmem.entries import utcnow
from kvmem.memory.retention import prune_expired_history
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
