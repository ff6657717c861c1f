"""Store invariants: under a seeded random mix of concurrent REST writes, agent writes (from a
second engine, as another process would), deletes, clears, imports and reverts, and in a
sequential model check of MemoryStore against a dict, the total never passes tokenLimit,
keys stay unique, token counts equal a recount, clients only ever see the expected answers,
and the history is complete: replaying each key's changes in id order gives its value."""

from __future__ import annotations

import random
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import text
from starlette.testclient import TestClient

from kvmem.config import Config
from kvmem.db.engine import Database
from kvmem.errors import (
    BadRequest,
    EmptyValue,
    InvalidKey,
    KeyNotAllowed,
    KvmemError,
    MemoryFull,
    NotFound,
    ValueTooLong,
)
from kvmem.memory.rules import MemoryRules
from kvmem.memory.store import MemoryStore
from kvmem.tokens import TokenCounter

# Property tests over many random operations.
pytestmark = pytest.mark.slow

SEED = 20261129
THREADS, OPS = 8, 60
TOKEN_LIMIT = 60
KEYS = [f"k{i}" for i in range(8)]
OTHER_USER = "other"
# What a client may be answered for each kind of operation; never a 500 or a 503.
EXPECTED = {
    "rest_put": {200, 201, 409},
    "rest_delete": {204, 404},
    "rest_clear": {200},
    "rest_read": {200},
    "agent_set": {"ok", "MemoryFull"},
    "agent_delete": {"ok", "NotFound"},
    "import": {"ok", "MemoryFull"},
    "other_set": {"ok", "MemoryFull"},
    # 404: the change was cleared (DELETE /memory) between reading the history and reverting.
    "rest_revert": {200, 404, 409},
}
WEIGHTS = {
    "rest_put": 30,
    "agent_set": 25,
    "rest_delete": 10,
    "agent_delete": 8,
    "rest_clear": 2,
    "import": 8,
    "rest_read": 10,
    "other_set": 7,
    "rest_revert": 8,
}


@dataclass
class Journal:
    """What every thread did and saw."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    outcomes: list[tuple[str, Any]] = field(default_factory=list)
    written: dict[str, tuple[str, str, str]] = field(
        default_factory=dict
    )  # value: user, key, source
    problems: list[str] = field(default_factory=list)
    reverts: set[str] = field(default_factory=set)  # values a revert wrote back

    def note(self, op: str, outcome: Any, detail: str = "") -> None:
        with self.lock:
            self.outcomes.append((op, outcome))
            if outcome not in EXPECTED[op]:
                self.problems.append(f"{op} answered {outcome!r}: {detail[:300]}")

    def wrote(self, value: str, user: str, key: str, source: str) -> None:
        with self.lock:
            self.written[value] = (user, key, source)

    def reverted(self, value: str) -> None:
        with self.lock:
            self.reverts.add(value)

    def problem(self, text: str) -> None:
        with self.lock:
            self.problems.append(text)


@pytest.fixture
def agent_store(database_url: str, tokens: TokenCounter) -> Iterator[Callable[..., MemoryStore]]:
    """A store on its own engine (the agent of another server process)."""
    databases: list[Database] = []

    def make(**memory: Any) -> MemoryStore:
        config = Config.model_validate({"database": {"url": database_url}, "memory": memory})
        databases.append(Database.from_config(config.database))
        return MemoryStore(databases[-1], MemoryRules.from_config(config.memory), tokens)

    yield make
    for database in databases:
        database.dispose()


def value_of(rng: random.Random, tag: str) -> str:
    """A value no other operation writes: a tag, then 0-14 more tokens."""
    return " ".join([tag, *["hello"] * rng.randint(0, 14)])


def run_thread(
    number: int,
    client: TestClient,
    store: MemoryStore,
    journal: Journal,
    barrier: threading.Barrier,
) -> None:
    rng = random.Random(SEED + number)
    operations, weights = zip(*WEIGHTS.items(), strict=True)
    barrier.wait()
    for index in range(OPS):
        op = rng.choices(operations, weights)[0]
        key = rng.choice(KEYS)
        tag = f"t{number}o{index}"
        try:
            if op == "rest_put":
                value = value_of(rng, tag)
                response = client.put(f"/memory/{key}", json={"value": value})
                journal.note(op, response.status_code, response.text)
                if response.status_code in (200, 201):
                    journal.wrote(value, "local", key, "manual")
                    if response.json()["total_tokens"] > TOKEN_LIMIT:
                        journal.problem(f"PUT answered a total over the limit: {response.text}")
            elif op == "rest_delete":
                response = client.delete(f"/memory/{key}")
                journal.note(op, response.status_code, response.text)
            elif op == "rest_clear":
                response = client.delete("/memory")
                journal.note(op, response.status_code, response.text)
            elif op == "rest_read":
                response = client.get("/memory")
                journal.note(op, response.status_code, response.text)
                if response.status_code == 200:
                    body = response.json()
                    counted = sum(m["token_count"] for m in body["memories"])
                    keys = [m["key"] for m in body["memories"]]
                    if not (
                        counted == body["total_tokens"] <= TOKEN_LIMIT
                        and len(set(keys)) == len(keys)
                    ):
                        journal.problem(f"an inconsistent listing: {response.text[:300]}")
            elif op in ("agent_set", "other_set"):
                user = "local" if op == "agent_set" else OTHER_USER
                value = value_of(rng, tag)
                written = store.set(user, key, value, "agent")
                journal.note(op, "ok")
                journal.wrote(value, user, key, "agent")
                if written.total_tokens > TOKEN_LIMIT:
                    journal.problem(f"set reported a total over the limit: {written}")
            elif op == "agent_delete":
                store.delete("local", key)
                journal.note(op, "ok")
            elif op == "rest_revert":
                changes = client.get("/memory/history", params={"limit": 10}).json()["changes"]
                if not changes:
                    journal.note(op, 404)
                    continue
                target = rng.choice(changes)
                response = client.post(f"/memory/{target['key']}/revert", json={"to": target["id"]})
                journal.note(op, response.status_code, response.text)
                if response.status_code == 200 and target["new_value"] is not None:
                    journal.reverted(target["new_value"])
            elif op == "import":
                keys = rng.sample(KEYS, rng.randint(1, 3))  # a key twice would be refused
                items = [(k, value_of(rng, f"{tag}i{i}")) for i, k in enumerate(keys)]
                mode = "replace" if rng.random() < 0.3 else "merge"
                store.import_document("local", items, mode=mode)
                journal.note(op, "ok")
                for item_key, value in items:
                    journal.wrote(value, "local", item_key, "import")
        except (MemoryFull, NotFound) as exc:
            journal.note(op, type(exc).__name__, str(exc))
        except Exception as exc:  # noqa: BLE001 - any other failure is a finding, kept to report
            journal.note(op, f"{type(exc).__name__}: {exc}"[:300])


def test_a_random_concurrent_mix_keeps_every_invariant(
    make_client: Callable[..., TestClient],
    agent_store: Callable[..., MemoryStore],
    database: Database,
    tokens: TokenCounter,
) -> None:
    memory = {"tokenLimit": TOKEN_LIMIT}
    client = make_client(memory=memory)
    store = agent_store(**memory)
    journal = Journal()
    barrier = threading.Barrier(THREADS)
    threads = [
        threading.Thread(target=run_thread, args=(n, client, store, journal, barrier))
        for n in range(THREADS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=180)
    assert not any(thread.is_alive() for thread in threads)

    assert not journal.problems, "\n".join(journal.problems)
    assert len(journal.outcomes) == THREADS * OPS
    seen = {outcome for _, outcome in journal.outcomes}
    # The run exercised what it claims to: writes that land and writes that are refused.
    assert {201, 409, "ok", "MemoryFull"} <= seen
    assert ("rest_revert", 200) in journal.outcomes

    for user in ("local", OTHER_USER):
        entries = store.snapshot(user).entries
        keys = [entry.key for entry in entries]
        assert len(keys) == len(set(keys))
        assert sum(entry.token_count for entry in entries) <= TOKEN_LIMIT
        for entry in entries:
            assert entry.token_count == tokens.count(entry.value)
            # Every stored value is one an acknowledged write put there, under its key (or
            # that a revert put back).
            user_key_source = journal.written.get(entry.value)
            if entry.source == "revert" and entry.value in journal.reverts:
                assert user_key_source is not None and user_key_source[:2] == (user, entry.key)
            else:
                assert user_key_source == (user, entry.key, entry.source)
    listing = client.get("/memory").json()
    assert listing["total_tokens"] == sum(m["token_count"] for m in listing["memories"])
    with database.engine.connect() as connection:
        duplicates = connection.execute(
            text(
                "SELECT user_id, key FROM memory_entries GROUP BY user_id, key HAVING COUNT(*) > 1"
            )
        ).all()
        totals = connection.execute(
            text("SELECT user_id, SUM(token_count) FROM memory_entries GROUP BY user_id")
        ).all()
    assert duplicates == []
    assert all(total <= TOKEN_LIMIT for _, total in totals)
    for user in ("local", OTHER_USER):
        assert_history_replays_to_the_entries(store, user)


def assert_history_replays_to_the_entries(store: MemoryStore, user: str) -> None:
    """For every key, its changes in id order chain up (each `old_value` is the value the
    previous change left) and end at the key's current value: the history misses no write."""
    changes, before = [], None
    while True:
        page = store.history(user, limit=500, before=before)
        changes += page.changes
        if page.next is None:
            break
        before = page.next
    replayed: dict[str, str | None] = {}
    for change in sorted(changes, key=lambda c: c.id):
        assert change.old_value == replayed.get(change.key), change
        assert (change.op == "delete") is (change.new_value is None), change
        replayed[change.key] = change.new_value
    current = {entry.key: entry.value for entry in store.snapshot(user).entries}
    assert {k: v for k, v in replayed.items() if v is not None} == current


# --- a sequential model check ---------------------------------------------------------------

MODEL_LIMIT = 12
MODEL_CHAR_LIMIT = 40
MODEL_VALID_KEYS = ["a", "b", "c", "d_1"]
model_keys = st.sampled_from([*MODEL_VALID_KEYS, "e", "nothing", "Bad", "", "a" * 129])
model_values = st.lists(
    st.sampled_from(["hello", " ", "world", "\n", "é", "\x00", "x" * 20, "<b>", "  "]), max_size=5
).map("".join)


def expected_error(key: str, value: str | None = None) -> type[KvmemError] | None:
    """The rule a write breaks first, as the store checks them (key, then value)."""
    if key == "nothing" or not _well_formed(key):
        return InvalidKey
    if key not in MODEL_VALID_KEYS:
        return KeyNotAllowed
    if value is None:
        return None
    stripped = value.strip()
    if "\x00" in stripped:
        return BadRequest
    if not stripped:
        return EmptyValue
    if len(stripped) > MODEL_CHAR_LIMIT:
        return ValueTooLong
    return None


def _well_formed(key: str) -> bool:
    return (
        1 <= len(key) <= 128
        and key[0].isascii()
        and key[0].islower()
        and all(c.isascii() and (c.islower() or c.isdigit() or c == "_") for c in key)
    )


def test_memory_store_matches_a_dict_model(
    make_store: Callable[..., MemoryStore], tokens: TokenCounter
) -> None:
    store = make_store(
        tokenLimit=MODEL_LIMIT, charLimit=MODEL_CHAR_LIMIT, validKeys=MODEL_VALID_KEYS
    )

    class StoreMachine(RuleBasedStateMachine):
        """MemoryStore, step by step, against {key: (value, source)}."""

        def __init__(self) -> None:
            super().__init__()
            self.user = f"user-{uuid.uuid4().hex[:10]}"  # a fresh user per example
            self.model: dict[str, tuple[str, str]] = {}
            self.enabled = True

        def total(self) -> int:
            return sum(tokens.count(value) for value, _ in self.model.values())

        @rule(key=model_keys, value=model_values, source=st.sampled_from(["manual", "agent"]))
        def set(self, key: str, value: str, source: str) -> None:
            error = expected_error(key, value)
            if error is None:
                cleaned = value.strip()
                replaced = tokens.count(self.model[key][0]) if key in self.model else 0
                requested = tokens.count(cleaned)
                if self.total() - replaced + requested > MODEL_LIMIT:
                    error = MemoryFull
            if error is not None:
                with pytest.raises(error) as caught:
                    store.set(self.user, key, value, source)
                assert type(caught.value) is error
                if error is MemoryFull:
                    assert caught.value.details == {
                        "token_limit": MODEL_LIMIT,
                        "total_tokens": self.total(),
                        "requested_tokens": tokens.count(value.strip()),
                    }
                return
            written = store.set(self.user, key, value, source)
            if key in self.model and self.model[key][0] == cleaned:
                source = self.model[key][1]  # the same value again changes nothing
            assert (written.created, written.entry.value, written.entry.source) == (
                key not in self.model,
                cleaned,
                source,
            )
            self.model[key] = (cleaned, source)
            assert written.total_tokens == self.total()

        @rule(key=model_keys, use_guard=st.booleans())
        def delete(self, key: str, use_guard: bool) -> None:
            def refuse() -> None:
                raise RuntimeError("past the deadline")

            format_error = expected_error(key)
            if format_error is InvalidKey:
                with pytest.raises(InvalidKey):
                    store.delete(self.user, key)
            elif key not in self.model:
                with pytest.raises(NotFound):
                    store.delete(self.user, key)
            elif use_guard:  # a guard that refuses leaves everything as it was
                with pytest.raises(RuntimeError):
                    store.delete(self.user, key, guard=refuse)
            else:
                assert store.delete(self.user, key).value == self.model.pop(key)[0]

        @rule()
        def clear(self) -> None:
            assert store.clear(self.user) == len(self.model)
            self.model.clear()

        @rule(
            items=st.lists(st.tuples(model_keys, model_values), max_size=4), replace=st.booleans()
        )
        def import_entries(self, items: list[tuple[str, str]], replace: bool) -> None:
            # The first bad item refuses the whole import (with its key's error, then a key
            # given twice, then its value's error).
            bad: set[type[KvmemError]] = set()
            seen: set[str] = set()
            for k, v in items:
                key_error = expected_error(k)
                value_error = expected_error(MODEL_VALID_KEYS[0], v)
                first = key_error or (BadRequest if k in seen else None) or value_error
                seen.add(k)
                if first is not None:
                    bad = {first}
                    break
            incoming = {k: v.strip() for k, v in items}
            kept = {} if replace else {k: v for k, v in self.model.items() if k not in incoming}
            if (
                not bad
                and sum(tokens.count(v) for v, _ in kept.values())
                + sum(tokens.count(v) for v in incoming.values())
                > MODEL_LIMIT
            ):
                bad = {MemoryFull}
            mode = "replace" if replace else "merge"
            if bad:
                with pytest.raises(KvmemError) as caught:
                    store.import_document(self.user, items, mode=mode)
                assert type(caught.value) in bad
                return
            assert store.import_document(self.user, items, mode=mode).imported == len(incoming)
            unchanged = {
                k: self.model[k]
                for k, v in incoming.items()
                if k in self.model and self.model[k][0] == v
            }
            self.model = {**kept, **{k: (v, "import") for k, v in incoming.items()}, **unchanged}

        @rule(data=st.data())
        def revert(self, data: st.DataObject) -> None:
            changes = store.history(self.user, limit=500).changes
            if not changes:
                with pytest.raises(NotFound):
                    store.revert(self.user, "a", 1)  # if change 1 exists, it is another user's
                return
            target = data.draw(st.sampled_from(changes))
            other_key = next(k for k in MODEL_VALID_KEYS if k != target.key)
            with pytest.raises(NotFound):
                store.revert(self.user, other_key, target.id)
            key, value = target.key, target.new_value
            if value is None:
                assert store.revert(self.user, key, target.id).entry is None
                self.model.pop(key, None)
                return
            if key in self.model and self.model[key][0] == value:
                assert store.revert(self.user, key, target.id).entry.source == self.model[key][1]
                return
            replaced = tokens.count(self.model[key][0]) if key in self.model else 0
            if self.total() - replaced + tokens.count(value) > MODEL_LIMIT:
                with pytest.raises(MemoryFull):
                    store.revert(self.user, key, target.id)
                return
            reverted = store.revert(self.user, key, target.id)
            assert (reverted.entry.value, reverted.entry.source) == (value, "revert")
            self.model[key] = (value, "revert")
            assert reverted.total_tokens == self.total()

        @rule(key=model_keys)
        def get(self, key: str) -> None:
            if expected_error(key) is InvalidKey:
                with pytest.raises(InvalidKey):
                    store.get(self.user, key)
            elif key in self.model:
                found = store.get(self.user, key)
                assert (found.value, found.source) == self.model[key]
            else:
                with pytest.raises(NotFound):
                    store.get(self.user, key)

        @rule(enabled=st.booleans())
        def switch(self, enabled: bool) -> None:
            assert store.set_memories_enabled(self.user, enabled) is enabled
            self.enabled = enabled

        @invariant()
        def matches_the_model(self) -> None:
            snapshot = store.snapshot(self.user)
            assert {e.key: (e.value, e.source) for e in snapshot.entries} == self.model
            assert all(e.token_count == tokens.count(e.value) for e in snapshot.entries)
            assert snapshot.total_tokens == self.total() <= MODEL_LIMIT
            assert snapshot.memories_enabled is self.enabled
            assert_history_replays_to_the_entries(store, self.user)

    run_state_machine_as_test(
        StoreMachine,
        settings=settings(
            max_examples=60,
            stateful_step_count=20,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        ),
    )
