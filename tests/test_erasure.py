"""Erasure is final: once `DELETE /me` (or `kvmem user erase`, from another process) answers,
no write for the user lands, not even from an agent run in flight then (its entry, its change,
its usage row, the user row itself); and on SQLite the erased text is gone from the database
files."""

from __future__ import annotations

import hashlib
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select
from starlette.testclient import TestClient

from kvmem.db.engine import Database
from kvmem.db.tables import (
    AgentRunRecord,
    MemoryChange,
    MemoryEntry,
    MemoryProposal,
    User,
    UserErasure,
)
from kvmem.entries import utcnow
from kvmem.errors import UserErased
from kvmem.memory import store as store_module
from kvmem.memory.store import MemoryStore
from tests.support.apps import (
    AGENT_MODEL,
    LiveServer,
    live_services,
    set_memory,
    wait_agents_idle,
    wait_until,
)
from tests.support.upstream import Reply

MakeClient = Callable[..., TestClient]
NOTHING = {
    "deleted": {
        "memories": 0,
        "changes": 0,
        "conversations": 0,
        "messages": 0,
        "keys": 0,
        "sessions": 0,
        "agent_runs": 0,
    }
}


def rows_of(database: Database, user_id: str) -> dict[str, int]:
    """How many rows of the user each table holds that an agent run could write."""
    with database.reading() as session:
        return {
            table.__tablename__: session.scalar(
                select(func.count()).select_from(table).where(column == user_id)
            )
            for table, column in [
                (User, User.id),
                (MemoryEntry, MemoryEntry.user_id),
                (MemoryChange, MemoryChange.user_id),
                (AgentRunRecord, AgentRunRecord.user_id),
            ]
        }


REASON = f"model {AGENT_MODEL!r} via provider 'openai'"  # /healthz's agent.reason
INLINE_REASON = "inline: the main model writes memory markers in its reply"
NONE_LEFT = {"users": 0, "memory_entries": 0, "memory_changes": 0, "agent_runs": 0}


def start_slow_run(client: TestClient, upstream: Any, key: str) -> None:
    """An agent run (POST /memory/agent, not waited for) whose model answers in 1.5 s with a
    write; returns once the model call is in flight."""
    upstream.script(
        AGENT_MODEL, Reply(content=None, tool_calls=[set_memory(key, "Rome")], delay=1.5)
    )
    body = {"messages": [{"role": "user", "content": "I live in Rome"}], "wait": False}
    assert client.post("/memory/agent", json=body).status_code == 202
    upstream.wait_for(AGENT_MODEL)


def test_a_run_in_flight_when_delete_me_answers_writes_nothing_after(
    make_client: MakeClient, chat_sections: Any, upstream: Any, database: Database
) -> None:
    client = make_client(**chat_sections())
    assert client.put("/memory/name", json={"value": "Ada"}).status_code == 201
    start_slow_run(client, upstream, "city")

    erased = client.delete("/me")
    assert (erased.status_code, erased.json()["deleted"]["memories"]) == (200, 1)
    wait_agents_idle(client)
    assert rows_of(database, "local") == NONE_LEFT
    assert client.get("/memory").json()["memories"] == []
    # The user may come back: a new write after the erasure lands as usual.
    assert client.put("/memory/name", json={"value": "Bea"}).status_code == 201


def test_an_erasure_from_another_process_fences_a_run_in_flight(
    make_client: MakeClient,
    chat_sections: Any,
    upstream: Any,
    database: Database,
    make_store: Callable[..., MemoryStore],
) -> None:
    """`kvmem user erase`, or `DELETE /me` on another replica: this process's run is not
    stopped, but its write and its usage record are refused by the fence in the database."""
    client = make_client(**chat_sections())
    start_slow_run(client, upstream, "city")

    assert make_store().erase_user("local").as_json() == NOTHING
    wait_agents_idle(client)
    assert rows_of(database, "local") == NONE_LEFT
    # A run that begins after the erasure writes as usual.
    upstream.script(AGENT_MODEL, Reply(content=None, tool_calls=[set_memory("city", "Oslo")]))
    after = client.post(
        "/memory/agent", json={"messages": [{"role": "user", "content": "I live in Oslo"}]}
    )
    assert after.json() == {
        "agent": "done",
        "updates": [{"op": "set", "key": "city", "value": "Oslo"}],
    }
    wait_agents_idle(client)
    assert rows_of(database, "local") == {
        "users": 1,
        "memory_entries": 1,
        "memory_changes": 1,
        "agent_runs": 1,
    }


@pytest.mark.sqlite_only  # the files of one SQLite database
def test_the_erased_text_is_gone_from_the_database_files(
    make_client: MakeClient, chat_sections: Any, upstream: Any, database_url: str
) -> None:
    secret = "Zanzibar-quokka-7319"
    client = make_client(**chat_sections(memory={"agent": None}))
    path = Path(database_url.removeprefix("sqlite:///"))
    wal = path.with_name("kvmem.db-wal")
    assert client.put("/memory/secret", json={"value": f"my code is {secret}"}).status_code == 201
    upstream.script("main-model", Reply(content=f"noted: {secret}"))
    assert client.post("/chat", json={"message": f"remember {secret}"}).status_code == 200
    # Some of it in the database file (as after any checkpoint), some only in the WAL.
    with closing(sqlite3.connect(path)) as raw:
        assert raw.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0
    assert client.put("/memory/secret", json={"value": f"still {secret}"}).status_code == 200
    assert (secret.encode() in path.read_bytes(), secret.encode() in wal.read_bytes()) == (
        True,
        True,
    )

    assert client.delete("/me").status_code == 200
    assert secret.encode() not in path.read_bytes()
    assert not wal.exists() or secret.encode() not in wal.read_bytes()


def test_the_fence_keeps_a_hash_of_the_id_not_the_id(
    make_client: MakeClient, database: Database
) -> None:
    client = make_client()
    assert client.put("/memory/name", json={"value": "Ada"}).status_code == 201
    assert client.delete("/me").status_code == 200
    with database.reading() as session:
        fences = session.execute(select(UserErasure.user_hash)).scalars().all()
    assert fences == [hashlib.sha256(b"local").hexdigest()]


def test_a_chat_turn_in_flight_during_the_erasure_is_not_stored(
    make_client: MakeClient,
    chat_sections: Any,
    upstream: Any,
    database: Database,
    make_store: Callable[..., MemoryStore],
) -> None:
    client = make_client(**chat_sections(memory={"agent": None}))
    upstream.script("main-model", Reply(content="hello", delay=1.0))
    with ThreadPoolExecutor(max_workers=1) as pool:
        turn = pool.submit(client.post, "/chat", json={"message": "hi"})
        upstream.wait_for("main-model")
        assert make_store().erase_user("local").as_json() == NOTHING
        answer = turn.result(timeout=10)
    assert (answer.status_code, answer.json()["response"]) == (200, "hello")
    assert client.get("/conversations").json() == {"conversations": [], "next": None}
    assert rows_of(database, "local") == NONE_LEFT


def test_an_inline_turn_in_flight_when_delete_me_answers_writes_nothing(
    make_client: MakeClient, chat_sections: Any, upstream: Any, database: Database
) -> None:
    # placement: inline: the main model's markers arrive after the erasure has answered.
    client = make_client(**chat_sections(agent={"placement": "inline"}))
    assert client.put("/memory/name", json={"value": "Ada"}).status_code == 201
    upstream.script("main-model", Reply(content="Rome it is.\n[MEMORY: city = Rome]", delay=1.0))
    with ThreadPoolExecutor(max_workers=1) as pool:
        turn = pool.submit(client.post, "/chat", json={"message": "I live in Rome"})
        upstream.wait_for("main-model")
        erased = client.delete("/me")
        assert (erased.status_code, erased.json()["deleted"]["memories"]) == (200, 1)
        answer = turn.result(timeout=10)
    body = answer.json()
    # The marker was cut off by the erasure (as an agent run is), not a failure.
    assert (answer.status_code, body) == (
        200,
        {
            "conversation_id": body["conversation_id"],
            "response": "Rome it is.",
            "memory": {"injected": ["name"], "agent": "timeout", "updates": []},
        },
    )
    wait_agents_idle(client)
    assert rows_of(database, "local") == NONE_LEFT
    assert client.get("/memory").json()["memories"] == []
    assert client.get("/conversations").json() == {"conversations": [], "next": None}


def test_a_run_under_review_in_flight_during_the_erasure_proposes_nothing(
    make_client: MakeClient,
    chat_sections: Any,
    upstream: Any,
    database: Database,
    make_store: Callable[..., MemoryStore],
) -> None:
    """Under `memory.review` a run's write is a proposal: the fence refuses it as it refuses
    the entry, and the run is cut off, not failed."""
    client = make_client(**chat_sections(memory={"review": "on"}))
    start_slow_run(client, upstream, "city")

    assert make_store().erase_user("local").as_json() == NOTHING
    wait_agents_idle(client)
    with database.reading() as session:
        proposals = session.scalar(select(func.count()).select_from(MemoryProposal))
    assert (proposals, rows_of(database, "local")) == (0, NONE_LEFT)
    assert client.get("/healthz").json()["agent"] == {
        "enabled": True,
        "ready": True,
        "reason": REASON,
        "last_error": None,
    }


def test_inline_markers_of_a_turn_in_flight_during_the_erasure_write_nothing(
    make_client: MakeClient,
    chat_sections: Any,
    upstream: Any,
    database: Database,
    make_store: Callable[..., MemoryStore],
) -> None:
    """`placement: inline`: the markers of a reply that ends after the erasure are refused by
    the fence; the erasure is not an agent failure (no `last_error`)."""
    client = make_client(**chat_sections(agent={"placement": "inline"}))
    upstream.script("main-model", Reply(content="Noted.\n[MEMORY: city = Paris]", delay=1.0))
    with ThreadPoolExecutor(max_workers=1) as pool:
        turn = pool.submit(client.post, "/chat", json={"message": "I live in Paris"})
        upstream.wait_for("main-model")
        assert make_store().erase_user("local").as_json() == NOTHING
        answer = turn.result(timeout=10)
    wait_agents_idle(client)
    assert (answer.status_code, answer.json()["response"], answer.json()["memory"]) == (
        200,
        "Noted.",
        {"injected": [], "agent": "timeout", "updates": []},
    )
    assert rows_of(database, "local") == NONE_LEFT
    assert client.get("/healthz").json()["agent"] == {
        "enabled": True,
        "ready": True,
        "reason": INLINE_REASON,
        "last_error": None,
    }


# --- the fences, store by store (each of these was a mutant no test caught) -----------------


def test_a_delete_begun_before_the_erasure_spares_the_key_recreated_after(
    make_store: Callable[..., MemoryStore],
) -> None:
    """A run in flight during an erasure deletes `city`; the person, back after the erasure,
    set `city` again: the run's delete must be refused, not remove the new entry."""
    store = make_store()
    store.set("alice", "city", "Rome")
    began = utcnow()
    store.erase_user("alice")
    store.set("alice", "city", "Oslo")
    with pytest.raises(UserErased):
        store.delete("alice", "city", "agent", since=began)
    assert [(e.key, e.value) for e in store.snapshot("alice").entries] == [("city", "Oslo")]


def test_erasing_one_user_keeps_every_other_users_fresh_fence(
    make_store: Callable[..., MemoryStore],
) -> None:
    store = make_store()
    began = utcnow()
    store.erase_user("alice")
    store.erase_user("bob")  # drops only fences older than FENCE_KEPT
    for user_id in ("alice", "bob"):
        with pytest.raises(UserErased):
            store.set(user_id, "city", "Rome", "agent", since=began)
    assert store.snapshot("alice").entries == ()


def test_a_user_erased_and_back_at_the_same_version_is_not_served_the_erased_entries(
    make_store: Callable[..., MemoryStore],
) -> None:
    """The snapshot cache is keyed by the user row's memory version and creation time: a
    user erased and seen again starts at version 0 anew."""
    store = make_store()
    store.set("alice", "city", "Rome")
    assert [e.key for e in store.snapshot("alice").entries] == ["city"]  # now cached
    store.erase_user("alice")
    store.set("alice", "name", "Ada")  # the same version as the cached read
    assert [(e.key, e.value) for e in store.snapshot("alice").entries] == [("name", "Ada")]


# --- manual writes racing DELETE /me -----------------------------------------------------------

RACE_ROUNDS = 20
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def mcp_set(http: httpx.Client, value: str) -> tuple[bool, str]:
    """memory_set over MCP: (whether it was refused, the tool's text)."""
    call = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "memory_set", "arguments": {"key": "late", "value": value}},
    }
    result = http.post("/mcp", json=call, headers=MCP_HEADERS).json()["result"]
    return bool(result.get("isError")), result["content"][0]["text"]


def rest_set(http: httpx.Client, value: str) -> tuple[bool, str]:
    response = http.put("/memory/late", json={"value": value})
    return response.status_code != 201, response.text


@pytest.mark.parametrize("path", ["mcp", "rest"])
def test_a_manual_write_begun_before_delete_me_answered_never_lands_after_it(
    make_server: Callable[..., LiveServer], monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """Each round the erasure is held until a manual write has begun: in odd rounds inside
    its transaction, holding the user's lock (the write waits for it), in even ones after it
    (the write lands, and the erasure's second pass deletes it). The write began before
    DELETE /me answered: once both have answered, nothing of the user is left."""
    server = make_server()
    store = live_services(server).store
    erasing, write_began = threading.Event(), threading.Event()
    hold_at = "rows"

    def hold(point: str) -> None:
        if point == hold_at and not erasing.is_set():
            erasing.set()
            assert write_began.wait(10), "the write did not begin"
            time.sleep(0.05)  # it is now waiting for the user's lock, or has landed

    erase_rows, empty_wal = store_module.erase_user_rows, store.database.empty_wal

    def held_erase_rows(session: Any, user_id: str) -> Any:
        hold("rows")
        return erase_rows(session, user_id)

    def held_empty_wal() -> bool:
        hold("between")
        return empty_wal()

    monkeypatch.setattr(store_module, "erase_user_rows", held_erase_rows)
    monkeypatch.setattr(store.database, "empty_wal", held_empty_wal)
    set_entry = store.set

    def noted_set(*args: Any, **kwargs: Any) -> Any:
        write_began.set()
        return set_entry(*args, **kwargs)

    monkeypatch.setattr(store, "set", noted_set)
    monkeypatch.setattr(store, "set_async", _async_noted(store.set_async, write_began))
    write = mcp_set if path == "mcp" else rest_set
    with httpx.Client(base_url=server.url, timeout=30) as http, ThreadPoolExecutor(2) as pool:
        for round_number in range(RACE_ROUNDS):
            hold_at = "rows" if round_number % 2 else "between"
            assert http.put("/memory/city", json={"value": "Rome"}).status_code == 201
            erasing.clear()
            write_began.clear()
            erased = pool.submit(http.delete, "/me")
            assert erasing.wait(10)
            written = pool.submit(write, http, f"round {round_number}")
            assert erased.result().status_code == 200
            refused, text = written.result()
            assert http.get("/memory").json()["memories"] == [], (round_number, text)
            if hold_at == "rows":  # it waited for the erasure's lock: refused
                assert refused and "erased" in text, (round_number, text)


def _async_noted(set_async: Any, began: threading.Event) -> Any:
    async def noted(*args: Any, **kwargs: Any) -> Any:
        began.set()
        return await set_async(*args, **kwargs)

    return noted


@pytest.mark.sqlite_only  # the files of one SQLite database
def test_the_erased_text_leaves_the_wal_once_a_reader_lets_go_and_healthz_says_so_until(
    make_client: MakeClient, database_url: str
) -> None:
    """A reader holding an old snapshot keeps the erasure's checkpoint from emptying the WAL:
    the checkpoint is retried until it does, and /healthz says so until then."""
    secret = "Quagga-lantern-5521"
    client = make_client(memory={"agent": None})
    path = Path(database_url.removeprefix("sqlite:///"))
    wal = path.with_name("kvmem.db-wal")
    assert client.put("/memory/secret", json={"value": f"my code is {secret}"}).status_code == 201
    assert "wal" not in client.get("/healthz").json()
    with closing(sqlite3.connect(path, isolation_level=None)) as reader:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM memory_entries").fetchone()  # holds its snapshot
        assert client.delete("/me").status_code == 200
        assert secret.encode() in wal.read_bytes()  # the reader still needs those frames
        assert client.get("/healthz").json()["wal"] == "erased text pending checkpoint"
        reader.execute("ROLLBACK")
    wait_until(lambda: "wal" not in client.get("/healthz").json(), 10, "the WAL emptied")
    assert not wal.exists() or secret.encode() not in wal.read_bytes()
    assert secret.encode() not in path.read_bytes()
