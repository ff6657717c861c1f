"""MemoryStore: the write rules, tokenLimit (also under concurrency), import, preferences."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC

import pytest

from kvmem.config import Config
from kvmem.db.engine import Database
from kvmem.entries import Imported
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
from tests.support.matchers import entry

MakeStore = Callable[..., MemoryStore]
MakeValue = Callable[[int], str]

VALID_KEYS = ["a", "z", "a" * 128, "a_1", "user_preferences", "x0_9", "nothing_else", "nothings"]
INVALID_KEYS = [
    "",
    "A",
    "Abc",
    "1a",
    "_a",
    "a-b",
    "a b",
    "a.b",
    "a" * 129,
    "nothing",
    "é",
    "caf\u00e9",
    "a\n",
    "\na",
    " a",
    "a\x00",
    "ａ",  # fullwidth a
]


def key_error_body(key: str) -> dict:
    return {
        "error": {
            "code": "invalid_key",
            "message": (
                f"invalid key {key!r}: a key is 1-128 characters of a-z, 0-9 and _, "
                "starts with a letter, and is not 'export', 'history', 'nothing', 'proposals' or 'scopes'"
            ),
        }
    }


@pytest.mark.parametrize("key", VALID_KEYS)
def test_well_formed_keys_are_stored(make_store: MakeStore, key: str) -> None:
    store = make_store()
    written = store.set("alice", key, "v")
    assert written.entry.key == key
    assert store.get("alice", key).value == "v"


@pytest.mark.parametrize("key", INVALID_KEYS)
def test_malformed_keys_are_refused_on_every_path(make_store: MakeStore, key: str) -> None:
    store = make_store()
    for attempt in (
        lambda: store.set("alice", key, "v"),
        lambda: store.get("alice", key),
        lambda: store.delete("alice", key),
    ):
        with pytest.raises(InvalidKey) as raised:
            attempt()
        assert (raised.value.status, raised.value.body()) == (422, key_error_body(key))
    # An import names the offending key in the details as well.
    with pytest.raises(InvalidKey) as raised:
        store.import_document("alice", [("fine", "v"), (key, "v")])
    body = key_error_body(key)
    body["error"]["message"] = f"memories[1] (key {key!r}): {body['error']['message']}"
    body["error"]["key"] = key
    assert (raised.value.status, raised.value.body()) == (422, body)
    assert store.snapshot("alice").entries == ()


def test_key_length_128_is_allowed_and_129_is_not(make_store: MakeStore) -> None:
    store = make_store()
    assert store.set("alice", "k" * 128, "v").created is True
    with pytest.raises(InvalidKey):
        store.set("alice", "k" * 129, "v")
    assert [e.key for e in store.snapshot("alice").entries] == ["k" * 128]


def test_valid_keys_restrict_writes(make_store: MakeStore) -> None:
    store = make_store(validKeys=["preferences", "facts"])
    with pytest.raises(KeyNotAllowed) as raised:
        store.set("alice", "context", "v")
    assert raised.value.status == 422
    assert raised.value.body() == {
        "error": {
            "code": "key_not_allowed",
            "message": "key 'context' is not allowed; valid keys: preferences, facts",
            "valid_keys": ["preferences", "facts"],
        }
    }
    with pytest.raises(KeyNotAllowed):
        store.import_document("alice", [("facts", "x"), ("context", "y")])
    # Format comes first: a malformed key is invalid, not merely not allowed.
    with pytest.raises(InvalidKey):
        store.set("alice", "Facts", "v")
    assert store.set("alice", "facts", "likes tea").created is True
    assert [e.key for e in store.snapshot("alice").entries] == ["facts"]


def test_empty_valid_keys_allow_any_key(make_store: MakeStore) -> None:
    store = make_store(validKeys=[])
    assert store.rules.valid_keys is None
    assert store.set("alice", "anything_goes", "v").created is True


def test_value_is_stripped(make_store: MakeStore, tokens: TokenCounter) -> None:
    store = make_store()
    written = store.set("alice", "k", "  \n\t Prefers short answers. \n ")
    assert written.entry.value == "Prefers short answers."
    assert written.entry.token_count == tokens.count("Prefers short answers.") == 5


@pytest.mark.parametrize("value", ["", " ", "\n\t  \r\n"])
def test_empty_values_are_refused(make_store: MakeStore, value: str) -> None:
    store = make_store()
    with pytest.raises(EmptyValue) as raised:
        store.set("alice", "k", value)
    assert (raised.value.status, raised.value.body()) == (
        422,
        {"error": {"code": "empty_value", "message": "the value is empty"}},
    )
    assert store.snapshot("alice").entries == ()


def test_char_limit_exact_is_allowed_one_over_is_refused(make_store: MakeStore) -> None:
    store = make_store(charLimit=10)
    assert store.set("alice", "k", "0123456789").entry.value == "0123456789"
    # Stripping happens before the length check.
    assert store.set("alice", "k", "   0123456789   ").entry.value == "0123456789"
    with pytest.raises(ValueTooLong) as raised:
        store.set("alice", "k", "0123456789a")
    assert (raised.value.status, raised.value.body()) == (
        422,
        {
            "error": {
                "code": "value_too_long",
                "message": "the value is 11 characters; the limit is 10",
                "char_limit": 10,
                "length": 11,
            }
        },
    )
    assert store.get("alice", "k").value == "0123456789"


def test_char_limit_counts_characters_not_bytes(make_store: MakeStore) -> None:
    store = make_store(charLimit=3)
    assert store.set("alice", "k", "日本語").entry.value == "日本語"
    with pytest.raises(ValueTooLong):
        store.set("alice", "k", "日本語!")


def test_nul_byte_is_refused(make_store: MakeStore) -> None:
    store = make_store()
    with pytest.raises(BadRequest) as raised:
        store.set("alice", "k", "a\x00b")
    assert (raised.value.status, raised.value.body()) == (
        400,
        {
            "error": {
                "code": "bad_request",
                "message": "the value contains a NUL character, which cannot be stored",
            }
        },
    )
    assert store.snapshot("alice").entries == ()


def test_token_limit_exactly_at_the_limit_is_allowed(
    make_store: MakeStore, make_value: MakeValue
) -> None:
    store = make_store(tokenLimit=10)
    assert store.set("alice", "a", make_value(4)).total_tokens == 4
    written = store.set("alice", "b", make_value(6))
    assert (written.created, written.total_tokens, written.entry.token_count) == (True, 10, 6)
    assert store.snapshot("alice").total_tokens == 10


def test_one_token_over_the_limit_is_memory_full(
    make_store: MakeStore, make_value: MakeValue
) -> None:
    store = make_store(tokenLimit=10)
    store.set("alice", "a", make_value(6))
    with pytest.raises(MemoryFull) as raised:
        store.set("alice", "b", make_value(5))
    assert (raised.value.status, raised.value.body()) == (
        409,
        {
            "error": {
                "code": "memory_full",
                "message": "storing 5 tokens would take memory to 11 tokens, over the limit of 10",
                "token_limit": 10,
                "total_tokens": 6,
                "requested_tokens": 5,
            }
        },
    )
    snapshot = store.snapshot("alice")
    assert [(e.key, e.token_count) for e in snapshot.entries] == [("a", 6)]


def test_token_limit_zero_refuses_every_write(make_store: MakeStore) -> None:
    store = make_store(tokenLimit=0)
    with pytest.raises(MemoryFull) as raised:
        store.set("alice", "a", "hello")
    assert raised.value.details == {"token_limit": 0, "total_tokens": 0, "requested_tokens": 1}


def test_replacement_counts_as_a_replacement(make_store: MakeStore, make_value: MakeValue) -> None:
    store = make_store(tokenLimit=10)
    store.set("alice", "a", make_value(3))
    store.set("alice", "b", make_value(6))
    # 9 stored; replacing b (6) with 7 tokens makes 10, which fits.
    written = store.set("alice", "b", make_value(7))
    assert (written.created, written.total_tokens) == (False, 10)
    # Replacing a (3) with 4 would make 11.
    with pytest.raises(MemoryFull) as raised:
        store.set("alice", "a", make_value(4))
    assert raised.value.details == {"token_limit": 10, "total_tokens": 10, "requested_tokens": 4}
    # Shrinking is always allowed.
    assert store.set("alice", "b", make_value(1)).total_tokens == 4
    assert [(e.key, e.token_count) for e in store.snapshot("alice").entries] == [("a", 3), ("b", 1)]


def test_limit_is_per_user(make_store: MakeStore, make_value: MakeValue) -> None:
    store = make_store(tokenLimit=5)
    store.set("alice", "a", make_value(5))
    assert store.set("bob", "a", make_value(5)).total_tokens == 5


def test_source_values(make_store: MakeStore) -> None:
    store = make_store()
    assert store.set("alice", "m", "v").entry.source == "manual"
    assert store.set("alice", "g", "v", "agent").entry.source == "agent"
    store.import_document("alice", [("i", "v")])
    assert {e.key: e.source for e in store.snapshot("alice").entries} == {
        "m": "manual",
        "g": "agent",
        "i": "import",
    }
    # A write takes the source of whoever wrote last.
    assert store.set("alice", "g", "new", "manual").entry.source == "manual"


def test_set_reports_created_and_keeps_created_at(make_store: MakeStore) -> None:
    store = make_store()
    first = store.set("alice", "k", "one")
    second = store.set("alice", "k", "two")
    assert (first.created, second.created) == (True, False)
    assert second.entry.created_at == first.entry.created_at
    assert second.entry.updated_at > first.entry.updated_at
    assert first.entry.created_at.tzinfo == UTC
    stored = store.get("alice", "k")
    assert stored == second.entry
    assert stored.as_json() == entry("k", "two", 1)


def test_snapshot_is_oldest_first_and_a_rewrite_moves_to_the_end(make_store: MakeStore) -> None:
    store = make_store()
    for key in ["a", "b", "c"]:
        store.set("alice", key, key)
    store.set("alice", "a", "again")
    snapshot = store.snapshot("alice")
    assert [e.key for e in snapshot.entries] == ["b", "c", "a"]
    assert snapshot.total_tokens == sum(e.token_count for e in snapshot.entries)


def test_get_and_delete(make_store: MakeStore) -> None:
    store = make_store()
    with pytest.raises(NotFound) as raised:
        store.get("alice", "k")
    assert raised.value.body() == {
        "error": {"code": "not_found", "message": "no memory with key 'k'"}
    }
    written = store.set("alice", "k", "v")
    assert store.delete("alice", "k") == written.entry
    with pytest.raises(NotFound):
        store.delete("alice", "k")
    with pytest.raises(NotFound):
        store.get("alice", "k")


def test_reads_of_a_key_outside_valid_keys_are_not_found(make_store: MakeStore) -> None:
    store = make_store(validKeys=["facts"])
    with pytest.raises(NotFound):
        store.get("alice", "other")


def test_users_never_see_each_others_entries(make_store: MakeStore) -> None:
    store = make_store()
    store.set("alice", "k", "alice's")
    store.set("alice", "only_alice", "alice's secret")
    # Bob is a real user with entries of his own, so every read below reaches the per-user
    # filter of its query (a user without a row is answered before any entry is read).
    store.set("bob", "b", "bob's")
    with pytest.raises(NotFound):
        store.get("bob", "k")
    with pytest.raises(NotFound):
        store.delete("bob", "k")
    assert [(e.key, e.value) for e in store.snapshot("bob").entries] == [("b", "bob's")]
    assert [(e.key, e.value) for e in store.snapshot("alice").entries] == [
        ("k", "alice's"),
        ("only_alice", "alice's secret"),
    ]
    assert store.snapshot("carol").entries == ()  # no row at all
    assert store.clear("bob") == 1
    assert store.snapshot("bob").entries == ()
    assert store.set("bob", "k", "bob's k").created is True
    assert store.get("alice", "k").value == "alice's"
    assert store.get("bob", "k").value == "bob's k"
    assert [e.key for e in store.snapshot("alice").entries] == ["k", "only_alice"]


def test_clear(make_store: MakeStore) -> None:
    store = make_store()
    for key in ["a", "b", "c"]:
        store.set("alice", key, "v")
    store.set("bob", "a", "v")
    assert store.clear("alice") == 3
    assert store.clear("alice") == 0
    assert store.snapshot("alice").entries == ()
    assert [e.key for e in store.snapshot("bob").entries] == ["a"]


def test_import_writes_all(make_store: MakeStore) -> None:
    store = make_store()
    store.set("alice", "old", "kept")
    assert store.import_document("alice", [("a", " one "), ("b", "two")]) == Imported(2, 0, 4)
    values = {e.key: (e.value, e.source) for e in store.snapshot("alice").entries}
    assert values == {"old": ("kept", "manual"), "a": ("one", "import"), "b": ("two", "import")}


def test_import_refuses_a_key_twice_in_one_document(make_store: MakeStore) -> None:
    store = make_store()
    with pytest.raises(BadRequest) as raised:
        store.import_document("alice", [("a", "one"), ("b", "two"), ("a", "uno")])
    assert raised.value.body() == {
        "error": {
            "code": "bad_request",
            "message": "memories[2] (key 'a'): the key 'a' appears more than once in the document",
            "key": "a",
        }
    }
    assert store.snapshot("alice").entries == ()


@pytest.mark.parametrize(
    ("items", "error"),
    [
        ([("a", "fine"), ("Bad", "x")], InvalidKey),
        ([("a", "fine"), ("b", "   ")], EmptyValue),
        ([("a", "fine"), ("b", "x" * 11)], ValueTooLong),
        ([("a", "fine"), ("b", "nul\x00")], BadRequest),
    ],
)
def test_import_is_all_or_nothing_on_rule_errors(
    make_store: MakeStore, items: list[tuple[str, str]], error: type[KvmemError]
) -> None:
    store = make_store(charLimit=10)
    store.set("alice", "a", "before")
    for replace in (False, True):
        with pytest.raises(error):
            store.import_document("alice", items, mode="replace" if replace else "merge")
        assert [(e.key, e.value) for e in store.snapshot("alice").entries] == [("a", "before")]


def test_import_is_all_or_nothing_on_the_token_limit(
    make_store: MakeStore, make_value: MakeValue
) -> None:
    store = make_store(tokenLimit=10)
    store.set("alice", "a", make_value(4))
    with pytest.raises(MemoryFull) as raised:
        store.import_document("alice", [("b", make_value(3)), ("c", make_value(4))])
    # The error names the entry at which the total passes the limit.
    assert raised.value.details == {
        "token_limit": 10,
        "total_tokens": 4,
        "requested_tokens": 7,
        "key": "c",
    }
    assert [e.key for e in store.snapshot("alice").entries] == ["a"]
    # Replacing a key in the import counts as a replacement.
    imported = store.import_document("alice", [("a", make_value(3)), ("b", make_value(7))])
    assert imported == Imported(imported=2, deleted=0, total_tokens=10)
    assert store.snapshot("alice").total_tokens == 10


def test_import_with_replace_drops_the_other_entries(
    make_store: MakeStore, make_value: MakeValue
) -> None:
    store = make_store(tokenLimit=10)
    store.set("alice", "a", make_value(8))
    store.set("alice", "b", make_value(2))
    store.set("bob", "a", "bob's")
    # Without replace this would be 10 + 9; with it only the import counts.
    imported = store.import_document("alice", [("c", make_value(9))], mode="replace")
    assert imported == Imported(imported=1, deleted=2, total_tokens=9)
    assert [(e.key, e.source) for e in store.snapshot("alice").entries] == [("c", "import")]
    assert [e.key for e in store.snapshot("bob").entries] == ["a"]
    # A refused replace leaves everything as it was.
    with pytest.raises(MemoryFull):
        store.import_document("alice", [("d", make_value(11))], mode="replace")
    assert [e.key for e in store.snapshot("alice").entries] == ["c"]


def test_preferences_default_to_true(make_store: MakeStore) -> None:
    store = make_store()
    assert store.memories_enabled("nobody_yet") is True
    assert store.snapshot("nobody_yet").memories_enabled is True
    store.set("alice", "k", "v")
    assert store.memories_enabled("alice") is True


def test_preferences_switch(make_store: MakeStore) -> None:
    store = make_store()
    assert store.set_memories_enabled("alice", False) is False
    assert store.memories_enabled("alice") is False
    assert store.snapshot("alice").memories_enabled is False
    assert store.memories_enabled("bob") is True
    # Opted out, the entries can still be edited by hand.
    assert store.set("alice", "k", "v").created is True
    assert store.set_memories_enabled("alice", True) is True
    assert store.memories_enabled("alice") is True


def test_rules_from_config() -> None:
    config = Config.model_validate(
        {"memory": {"validKeys": ["a", "b", "a"], "charLimit": 5, "tokenLimit": 7}}
    )
    assert MemoryRules.from_config(config.memory) == MemoryRules(
        valid_keys=("a", "b"), char_limit=5, token_limit=7
    )
    assert MemoryRules.from_config(Config().memory) == MemoryRules(
        valid_keys=None, char_limit=10_000, token_limit=None
    )


def _hammer(
    stores: list[MemoryStore], writes: list[tuple[str, str]]
) -> tuple[list[str], list[Exception]]:
    """Run one `set` per write from its own thread, all released at once."""
    barrier = threading.Barrier(len(writes))
    succeeded: list[str] = []
    failed: list[Exception] = []
    lock = threading.Lock()

    def write(index: int, key: str, value: str) -> None:
        barrier.wait()
        try:
            stores[index % len(stores)].set("alice", key, value)
        except Exception as exc:  # collected and checked below, never ignored
            with lock:
                failed.append(exc)
        else:
            with lock:
                succeeded.append(key)

    threads = [
        threading.Thread(target=write, args=(i, key, value))
        for i, (key, value) in enumerate(writes)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    return succeeded, failed


@pytest.fixture
def two_stores(
    database: Database, tokens: TokenCounter, database_url: str
) -> Callable[..., list[MemoryStore]]:
    """Two stores on two engines sharing one database file, as two server processes would."""
    other = Database.from_config(
        Config.model_validate({"database": {"url": database_url}}).database
    )

    def make(**memory: object) -> list[MemoryStore]:
        rules = MemoryRules.from_config(Config.model_validate({"memory": memory}).memory)
        return [MemoryStore(database, rules, tokens), MemoryStore(other, rules, tokens)]

    yield make
    other.dispose()


def test_concurrent_sets_never_pass_the_token_limit(
    two_stores: Callable[..., list[MemoryStore]], make_value: MakeValue, tokens: TokenCounter
) -> None:
    stores = two_stores(tokenLimit=100)
    writes = [(f"k{i:02d}", make_value(7)) for i in range(40)]  # 280 tokens asked, 100 allowed
    succeeded, failed = _hammer(stores, writes)

    assert all(isinstance(exc, MemoryFull) for exc in failed), failed
    assert (len(succeeded), len(failed)) == (14, 26)  # 14 * 7 = 98; a 15th would make 105
    snapshot = stores[0].snapshot("alice")
    assert sorted(e.key for e in snapshot.entries) == sorted(succeeded)
    assert snapshot.total_tokens == 98
    assert all(e.token_count == tokens.count(e.value) for e in snapshot.entries)


def test_concurrent_mixed_sets_and_replacements_stay_consistent(
    two_stores: Callable[..., list[MemoryStore]], make_value: MakeValue, tokens: TokenCounter
) -> None:
    stores = two_stores(tokenLimit=60)
    # Sizes 1..10, and every fourth write replaces a shared key.
    writes = [("shared" if i % 4 == 0 else f"k{i:02d}", make_value(1 + i % 10)) for i in range(40)]
    succeeded, failed = _hammer(stores, writes)

    assert all(isinstance(exc, MemoryFull) for exc in failed), failed
    assert len(succeeded) + len(failed) == 40
    snapshot = stores[1].snapshot("alice")
    assert sorted(e.key for e in snapshot.entries) == sorted(set(succeeded))
    assert snapshot.total_tokens <= 60
    assert all(e.token_count == tokens.count(e.value) for e in snapshot.entries)
    for exc in failed:
        details = exc.details
        assert details["token_limit"] == 60
        assert details["total_tokens"] + details["requested_tokens"] > 60


def test_snapshot_sees_writes_made_by_another_store_on_the_same_database(make_store) -> None:
    """Each store caches entries by the user's memory version; another process's write (here:
    another store object) bumps the version, so no reader serves stale entries."""
    reader, writer = make_store(), make_store()
    writer.set("alice", "likes", "tea")
    assert [(e.key, e.value) for e in reader.snapshot("alice").entries] == [("likes", "tea")]
    writer.set("alice", "likes", "coffee")
    assert [(e.key, e.value) for e in reader.snapshot("alice").entries] == [("likes", "coffee")]
    writer.import_document("alice", [("diet", "vegan")])
    assert [e.key for e in reader.snapshot("alice").entries] == ["likes", "diet"]
    writer.delete("alice", "likes")
    assert [e.key for e in reader.snapshot("alice").entries] == ["diet"]
    writer.clear("alice")
    assert reader.snapshot("alice").entries == ()
