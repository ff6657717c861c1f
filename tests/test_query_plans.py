"""Every query on a request path reads by index: the per-user routes are driven on a database
that holds other users' rows, every statement they run is captured (the raw-sqlite3 fast
paths too) and explained, and no plan may read a whole table (`tests.support.plans`)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from sqlalchemy import insert
from starlette.testclient import TestClient

from kvmem.db.engine import Database
from kvmem.db.tables import (
    Conversation,
    MemoryChange,
    MemoryEntry,
    MemoryProposal,
    Message,
    User,
)
from kvmem.entries import utcnow
from kvmem.memory.retention import prune_expired_history
from kvmem.server.credentials import KeyStore
from tests.support.apps import MAIN_MODEL
from tests.support.plans import captured_statements, table_scans
from tests.support.upstream import Reply

SERVICE = {"Authorization": "Bearer plans-service-key"}
KEYS_AUTH = {"mode": "keys", "service_keys": ["plans-service-key"]}
OTHERS = 50


def seed_other_users(database: Database) -> None:
    """Entries, kept and expired changes, conversations and messages of `OTHERS` users."""
    now = utcnow()
    old = now - timedelta(days=400)
    users = [f"other-{n}" for n in range(OTHERS)]
    with database.writing() as session:
        session.execute(insert(User), [{"id": u, "created_at": now} for u in users])
        session.execute(
            insert(MemoryEntry),
            [
                {
                    "user_id": u,
                    "key": f"k{k}",
                    "value": "v " * 20,
                    "token_count": 20,
                    "source": "manual",
                    "created_at": now,
                    "updated_at": now,
                }
                for u in users
                for k in range(4)
            ],
        )
        session.execute(
            insert(MemoryChange),
            [
                {
                    "user_id": u,
                    "key": f"k{k % 4}",
                    "op": "set",
                    "old_value": None,
                    "new_value": "v",
                    "source": "manual",
                    "conversation_id": None,
                    "at": old if k % 2 else now,
                }
                for u in users
                for k in range(8)
            ],
        )
        conversations = [
            (u, f"{n:08d}-0000-4000-8000-{c:012d}") for n, u in enumerate(users) for c in range(3)
        ]
        session.execute(
            insert(Conversation),
            [
                {"id": c, "user_id": u, "title": "t", "created_at": now, "updated_at": now}
                for u, c in conversations
            ],
        )
        session.execute(
            insert(Message),
            [
                {"conversation_id": c, "role": role, "content": "hi", "created_at": now}
                for _u, c in conversations
                for role in ("user", "assistant") * 3
            ],
        )


def drive_request_paths(client: TestClient, upstream: Any, key: str) -> list[tuple[str, str, int]]:
    """Every per-user route, as user `alice` (with her user key); each (method, path, status)."""
    alice = {"Authorization": f"Bearer {key}"}
    upstream.script(MAIN_MODEL, *[Reply(content="Noted.") for _ in range(3)])
    seen: list[tuple[str, str, int]] = []

    def call(method: str, path: str, headers: dict[str, str] | None = None, **kwargs: Any) -> Any:
        response = client.request(method, path, headers=headers or alice, **kwargs)
        seen.append((method, path, response.status_code))
        return response

    call("PUT", "/memory/likes", json={"value": "tea"})
    call("PUT", "/memory/likes", json={"value": "coffee"})
    call("PUT", "/memory/job", json={"value": "baker"})
    call("GET", "/memory")
    call("GET", "/memory/likes")
    call("DELETE", "/memory/job")
    history = call("GET", "/memory/history").json()
    call("GET", "/memory/history", params={"key": "likes", "limit": 1, "before": 2**31})
    call("GET", "/memory/likes/history", params={"limit": 1})
    call("POST", "/memory/likes/revert", json={"to": history["changes"][-1]["id"]})
    call("GET", "/memory/export")
    call("POST", "/memory/import", json={"memories": [{"key": "pet", "value": "cat"}]})
    call("POST", "/memory/import?mode=replace", json={"memories": [{"key": "pet", "value": "dog"}]})
    call("GET", "/preferences")
    call("PATCH", "/preferences", json={"memories": True})
    call("POST", "/memory/context", json={"system": "Be brief."})
    chat = call("POST", "/chat", json={"message": "hello"}).json()
    call("POST", "/chat", json={"message": "again", "conversation_id": chat["conversation_id"]})
    body = {"model": f"openai/{MAIN_MODEL}", "messages": [{"role": "user", "content": "hi"}]}
    call("POST", "/v1/chat/completions", json=body)
    listing = call("GET", "/conversations", params={"limit": 1}).json()
    call(
        "GET",
        "/conversations",
        params={
            "before": f"{listing['conversations'][0]['updated_at']}_"
            f"{listing['conversations'][0]['id']}"
        },
    )
    call("GET", f"/conversations/{chat['conversation_id']}")
    call("DELETE", f"/conversations/{chat['conversation_id']}")
    session = call("POST", "/sessions").json()
    call("GET", "/memory", headers={"Authorization": f"Bearer {session['token']}"})
    call("DELETE", "/sessions/current", headers={"Authorization": f"Bearer {session['token']}"})
    call("GET", "/memory", headers={**SERVICE, "X-User-Id": "alice"})
    call("DELETE", "/memory/history")
    call("DELETE", "/memory")
    call("DELETE", "/me")
    return seen


EXPECTED_STATUSES = [
    201,
    200,
    201,
    200,
    200,
    204,
    200,
    200,
    200,
    200,
    200,
    200,
    200,
    200,
    200,
    200,
    200,
    200,
    200,
    200,
    200,
    200,
    204,
    201,
    200,
    204,
    200,
    200,
    200,
    200,
]


def test_no_request_path_query_reads_a_whole_table(
    upstream: Any,
    chat_sections: Callable[..., dict[str, Any]],
    make_client: Callable[..., TestClient],
    database: Database,
) -> None:
    seed_other_users(database)
    client = make_client(**chat_sections(memory={"agent": None}), auth=KEYS_AUTH)
    _, key = KeyStore(database).create("alice")
    with captured_statements(database.engine) as statements:
        seen = drive_request_paths(client, upstream, key)
    assert [status for _, _, status in seen] == EXPECTED_STATUSES, seen
    assert len(statements) > 100  # the capture saw the routes' statements, fast paths too
    assert table_scans(database.engine, statements) == {}


def test_the_history_sweep_reads_expired_changes_by_index(
    make_store: Callable[..., Any], database: Database
) -> None:
    """The sweep is not on a request path, but it holds SQLite's writer while it reads: a
    batch that scanned the table would keep every write waiting for as long."""
    seed_other_users(database)
    store = make_store(history={"keep_days": 30})
    with captured_statements(database.engine) as statements:
        deleted = prune_expired_history(store, batch=50)
    assert deleted == OTHERS * 4
    assert len(statements) == 9  # 4 full batches and the last, empty one: a read and a delete each
    assert table_scans(database.engine, statements) == {}


def seed_other_proposals(database: Database) -> None:
    """Pending proposals of `OTHERS` users (the users of `seed_other_users`)."""
    now = utcnow()
    with database.writing() as session:
        session.execute(
            insert(MemoryProposal),
            [
                {
                    "user_id": f"other-{n}",
                    "key": f"k{k}",
                    "op": "set",
                    "value": "v",
                    "conversation_id": None,
                    "created_at": now,
                }
                for n in range(OTHERS)
                for k in range(6)
            ],
        )


def drive_review_paths(client: TestClient, upstream: Any, key: str) -> list[tuple[str, str, int]]:
    """The review routes as user `alice`, her proposals made by inline markers on /chat."""
    alice = {"Authorization": f"Bearer {key}"}
    upstream.script(
        MAIN_MODEL,
        *[
            Reply(content=f"Noted.\n[MEMORY: {k} = v]\n[MEMORY: pet = cat]")
            for k in ("likes", "job")
        ],
    )
    seen: list[tuple[str, str, int]] = []

    def call(method: str, path: str, **kwargs: Any) -> Any:
        response = client.request(method, path, headers=alice, **kwargs)
        seen.append((method, path, response.status_code))
        return response

    call("PATCH", "/preferences", json={"review": True})
    call("GET", "/preferences")
    call("PUT", "/memory/likes", json={"value": "tea"})
    chat = call("POST", "/chat", json={"message": "I like coffee, I have a cat"}).json()
    call(
        "POST", "/chat", json={"message": "I'm a baker", "conversation_id": chat["conversation_id"]}
    )
    proposals = call("GET", "/memory/proposals").json()["proposals"]
    # The second chat's pet replaced the first's: pet, job, likes, newest first.
    assert [p["key"] for p in proposals] == ["pet", "job", "likes"]
    call("POST", f"/memory/proposals/{proposals[0]['id']}/accept")
    call("POST", f"/memory/proposals/{proposals[1]['id']}/reject")
    call("DELETE", "/memory/proposals")
    call("DELETE", "/me")
    return seen


def test_no_review_query_reads_a_whole_table(
    upstream: Any,
    chat_sections: Callable[..., dict[str, Any]],
    make_client: Callable[..., TestClient],
    database: Database,
) -> None:
    seed_other_users(database)
    seed_other_proposals(database)
    client = make_client(
        **chat_sections(memory={"review": "per_user"}, agent={"placement": "inline"}),
        auth=KEYS_AUTH,
    )
    _, key = KeyStore(database).create("alice")
    with captured_statements(database.engine) as statements:
        seen = drive_review_paths(client, upstream, key)
    assert [(method, status) for method, _, status in seen] == [
        ("PATCH", 200),
        ("GET", 200),
        ("PUT", 201),
        ("POST", 200),
        ("POST", 200),
        ("GET", 200),
        ("POST", 200),
        ("POST", 204),
        ("DELETE", 200),
        ("DELETE", 200),
    ], seen
    assert len(statements) > 30
    assert table_scans(database.engine, statements) == {}
