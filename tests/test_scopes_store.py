"""Scopes in the store (CONTRACT section 23): each user's memory in layers, their own ("") and
one per scope, each with its own keys and limits; a scoped read is still one read. Runs on
SQLite and, with KVMEM_TEST_POSTGRES_URL set, on PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from kvmem.config import MemoryConfig
from kvmem.errors import BadRequest, KeyNotAllowed, MemoryFull, NotFound
from kvmem.memory.exports import export_document, read_layers
from kvmem.memory.imports import LayerImport
from kvmem.memory.proposals import ProposalStore
from kvmem.memory.rules import OWN, MemoryRules
from kvmem.memory.store import MemoryStore
from tests.support.plans import sqlite_trace

SCOPES = {"validKeys": ["project_notes", "decisions"]}
OWN_KEYS = ["user_preferences", "learned_facts"]


@pytest.fixture
def store(make_store: Callable[..., MemoryStore]) -> MemoryStore:
    return make_store(validKeys=OWN_KEYS, scopes=SCOPES)


def layer(store: MemoryStore, user: str, scope: str = OWN) -> list[tuple[str, str]]:
    return [(e.key, e.value) for e in store.layer(user, scope).entries]


def test_a_key_in_both_lists_or_an_empty_scoped_list_is_refused_at_load() -> None:
    with pytest.raises(ValidationError, match="learned_facts: in both memory.validKeys"):
        MemoryConfig.model_validate(
            {"validKeys": OWN_KEYS, "scopes": {"validKeys": ["learned_facts", "notes"]}}
        )
    with pytest.raises(ValidationError, match="at least 1 item"):
        MemoryConfig.model_validate({"scopes": {"validKeys": []}})
    with pytest.raises(ValidationError, match="validKeys"):
        MemoryConfig.model_validate({"scopes": {"tokenLimit": 10}})


def test_a_scope_name_is_checked_and_needs_memory_scopes() -> None:
    rules = MemoryRules.from_config(MemoryConfig.model_validate({"scopes": SCOPES}))
    for good in ["a", "project:kitchen", "model:ollama/llama3.1:8b", "x@y.z-_", "A" * 128]:
        assert rules.scope(good) == good
    assert rules.scope(None) == OWN
    for bad in ["", "a b", "a" * 129, "é", "a\n", "<b>", "a?b", "a#b", "a%2F"]:
        with pytest.raises(BadRequest, match="invalid scope"):
            rules.scope(bad)
    plain = MemoryRules.from_config(MemoryConfig())
    assert plain.scope(None) == OWN
    with pytest.raises(BadRequest, match="keeps no scopes"):
        plain.scope("project:kitchen")


def test_writes_route_by_key_and_each_layer_refuses_the_others_keys(store: MemoryStore) -> None:
    rules = store.rules
    assert rules.scope_of_write("project_notes", "kitchen") == "kitchen"
    assert rules.scope_of_write("learned_facts", "kitchen") == OWN
    assert rules.scope_of_write("learned_facts", OWN) == OWN
    with pytest.raises(KeyNotAllowed, match="kept per scope and this chat names no scope"):
        rules.scope_of_write("project_notes", OWN)
    with pytest.raises(KeyNotAllowed, match="kept per scope: name the scope"):
        store.set("alice", "project_notes", "oak worktop")
    with pytest.raises(KeyNotAllowed, match="valid keys: project_notes, decisions"):
        store.set("alice", "learned_facts", "likes tea", scope="kitchen")
    assert layer(store, "alice") == [] and store.scopes("alice") == []


def test_an_isolated_scope_routes_own_keys_nowhere(make_store: Callable[..., MemoryStore]) -> None:
    store = make_store(validKeys=OWN_KEYS, scopes={**SCOPES, "isolated": True})
    assert store.rules.scope_of_write("decisions", "work") == "work"
    with pytest.raises(KeyNotAllowed, match="isolated"):
        store.rules.scope_of_write("learned_facts", "work")
    assert store.rules.scope_of_write("learned_facts", OWN) == OWN


def test_layers_are_apart_and_a_scoped_read_holds_its_scope_and_the_own_layer(
    store: MemoryStore,
) -> None:
    store.set("alice", "learned_facts", "vegan")
    store.set("alice", "project_notes", "oak worktop", scope="kitchen")
    store.set("alice", "project_notes", "chapter 2 due", scope="thesis")
    store.set("bob", "project_notes", "bob's kitchen", scope="kitchen")
    kitchen = store.snapshot("alice", "kitchen").entries
    assert sorted((e.scope, e.key, e.value) for e in kitchen) == [
        ("", "learned_facts", "vegan"),
        ("kitchen", "project_notes", "oak worktop"),
    ]
    assert [(e.scope, e.key) for e in store.snapshot("alice").entries] == [("", "learned_facts")]
    assert layer(store, "alice", "thesis") == [("project_notes", "chapter 2 due")]
    assert layer(store, "alice") == [("learned_facts", "vegan")]
    assert layer(store, "bob", "kitchen") == [("project_notes", "bob's kitchen")]
    assert store.get("alice", "project_notes", "thesis").value == "chapter 2 due"
    with pytest.raises(NotFound):
        store.get("alice", "project_notes")
    assert [(s, n) for s, n, _ in store.scopes("alice")] == [("kitchen", 1), ("thesis", 1)]
    assert [(s, n) for s, n, _ in store.scopes("bob")] == [("kitchen", 1)]
    assert store.scopes("carol") == []


def test_each_layer_has_its_own_token_limit(make_store: Callable[..., MemoryStore]) -> None:
    store = make_store(tokenLimit=8, scopes={**SCOPES, "tokenLimit": 3})
    store.set("alice", "learned_facts", "one two three four five")  # 5 tokens, own: fits 8
    with pytest.raises(MemoryFull, match="scope 'kitchen'.*limit of 3") as raised:
        store.set("alice", "project_notes", "one two three four five", scope="kitchen")
    assert raised.value.details["token_limit"] == 3
    written = store.set("alice", "project_notes", "oak", scope="kitchen")
    assert written.total_tokens == 1  # the scope's total, not the user's
    store.set("alice", "project_notes", "pine", scope="thesis")  # another scope: its own 3
    assert len(store.snapshot("alice", "kitchen").entries) == 2


def test_a_scope_defaults_to_memorys_limits(make_store: Callable[..., MemoryStore]) -> None:
    store = make_store(tokenLimit=2, charLimit=5, scopes=SCOPES)
    assert store.rules.layer("x").token_limit == 2
    assert store.rules.layer("x").char_limit == 5


def test_history_revert_delete_and_clear_act_on_one_layer(store: MemoryStore) -> None:
    store.set("alice", "learned_facts", "vegan")
    first = store.set("alice", "project_notes", "oak", scope="kitchen")
    store.set("alice", "project_notes", "pine", scope="kitchen")
    store.set("alice", "project_notes", "chapter 2", scope="thesis")
    kitchen = store.history("alice", scope="kitchen").changes
    assert [(c.key, c.new_value) for c in kitchen] == [
        ("project_notes", "pine"),
        ("project_notes", "oak"),
    ]
    assert [c.key for c in store.history("alice").changes] == ["learned_facts"]
    assert len(store.key_history("alice", "project_notes", "thesis")) == 1
    assert first.change_id is not None
    with pytest.raises(NotFound):  # a kitchen change is not the thesis's
        store.revert("alice", "project_notes", first.change_id, scope="thesis")
    store.revert("alice", "project_notes", first.change_id, scope="kitchen")
    assert layer(store, "alice", "kitchen") == [("project_notes", "oak")]
    assert layer(store, "alice", "thesis") == [("project_notes", "chapter 2")]
    with pytest.raises(NotFound):
        store.delete("alice", "project_notes")  # the own layer holds no such key
    store.delete("alice", "project_notes", scope="thesis")
    assert layer(store, "alice", "kitchen") == [("project_notes", "oak")]
    assert store.clear("alice", "kitchen") == 1
    assert store.history("alice", scope="kitchen").changes == ()
    assert layer(store, "alice") == [("learned_facts", "vegan")]
    assert [c.key for c in store.history("alice").changes] == ["learned_facts"]
    assert [c.op for c in store.history("alice", scope="thesis").changes] == ["delete", "set"]


def test_erasing_the_user_erases_every_layer(store: MemoryStore) -> None:
    store.set("alice", "learned_facts", "vegan")
    store.set("alice", "project_notes", "oak", scope="kitchen")
    store.set("bob", "project_notes", "pine", scope="kitchen")
    store.erase_user("alice")
    assert store.scopes("alice") == [] and layer(store, "alice") == []
    assert store.history("alice", scope="kitchen").changes == ()
    assert layer(store, "bob", "kitchen") == [("project_notes", "pine")]


def test_a_scoped_entry_expires_into_its_own_layers_history(store: MemoryStore) -> None:
    now = datetime.now(UTC)
    store.set("alice", "project_notes", "oak", scope="kitchen", expires_at=now + timedelta(hours=1))
    store.clock = lambda: now + timedelta(hours=2)
    assert store.snapshot("alice", "kitchen").entries == ()
    assert [c.op for c in store.history("alice", scope="kitchen").changes] == ["expire", "set"]
    assert store.history("alice").changes == ()
    assert store.scopes("alice") == []


def test_an_export_of_every_layer_imports_back_into_a_fresh_user(store: MemoryStore) -> None:
    store.set("alice", "learned_facts", "vegan")
    store.set("alice", "project_notes", "oak", scope="kitchen")
    store.set("alice", "decisions", "no island", scope="kitchen")
    store.set("alice", "project_notes", "chapter 2", scope="thesis")
    document = export_document("alice", store.every_layer("alice"), scoped=True)
    assert [(m["scope"], m["key"]) for m in document["memories"]] == [
        (None, "learned_facts"),
        ("kitchen", "project_notes"),
        ("kitchen", "decisions"),
        ("thesis", "project_notes"),
    ]
    results = store.import_layers("carol", read_layers(document, store.rules, None))
    assert {scope: r.imported for scope, r in results.items()} == {
        "": 1,
        "kitchen": 2,
        "thesis": 1,
    }
    for scope in ["", "kitchen", "thesis"]:
        assert layer(store, "carol", scope) == layer(store, "alice", scope)
    assert [c.source for c in store.history("carol", scope="kitchen").changes] == ["import"] * 2


def test_an_import_is_all_or_nothing_across_layers(
    make_store: Callable[..., MemoryStore],
) -> None:
    store = make_store(validKeys=OWN_KEYS, scopes={**SCOPES, "tokenLimit": 2})
    store.set("alice", "learned_facts", "vegan")
    document = {
        "memories": [
            {"key": "learned_facts", "value": "likes tea", "scope": None},
            {"key": "project_notes", "value": "one two three", "scope": "kitchen"},
        ]
    }
    with pytest.raises(MemoryFull):
        store.import_layers("alice", read_layers(document, store.rules, None))
    assert layer(store, "alice") == [("learned_facts", "vegan")]
    assert store.scopes("alice") == []


def test_an_import_naming_a_scope_puts_everything_there_and_refuses_another(
    store: MemoryStore,
) -> None:
    document = {"memories": [{"key": "decisions", "value": "oak"}]}
    layers = read_layers(document, store.rules, "kitchen")
    assert list(layers) == ["kitchen"]
    store.import_layers("alice", layers)
    assert layer(store, "alice", "kitchen") == [("decisions", "oak")]
    other = {"memories": [{"key": "decisions", "value": "pine", "scope": "thesis"}]}
    with pytest.raises(BadRequest, match="belongs to scope 'thesis'"):
        read_layers(other, store.rules, "kitchen")
    with pytest.raises(BadRequest, match=r"memories\[0\].scope: invalid scope"):
        read_layers({"memories": [{"key": "k", "value": "v", "scope": "a b"}]}, store.rules, None)


def test_a_replace_import_replaces_the_layers_it_names_only(store: MemoryStore) -> None:
    store.set("alice", "learned_facts", "vegan")
    store.set("alice", "project_notes", "oak", scope="kitchen")
    store.set("alice", "project_notes", "chapter 2", scope="thesis")
    layers = {
        "": LayerImport([("user_preferences", "short answers")]),
        "kitchen": LayerImport([]),
    }
    results = store.import_layers("alice", layers, mode="replace")
    assert (results[""].deleted, results["kitchen"].deleted) == (1, 1)
    assert layer(store, "alice") == [("user_preferences", "short answers")]
    assert layer(store, "alice", "kitchen") == []
    assert layer(store, "alice", "thesis") == [("project_notes", "chapter 2")]


def test_proposals_belong_to_their_layer(store: MemoryStore) -> None:
    proposals = ProposalStore(store)
    mine = proposals.propose("alice", "learned_facts", "vegan")
    kitchen = proposals.propose("alice", "project_notes", "oak", scope="kitchen")
    with pytest.raises(KeyNotAllowed):
        proposals.propose("alice", "project_notes", "oak")
    assert [p.key for p in proposals.pending("alice")] == ["learned_facts"]
    assert [p.key for p in proposals.pending("alice", "kitchen")] == ["project_notes"]
    with pytest.raises(NotFound):  # a kitchen proposal is not the own layer's
        proposals.accept("alice", kitchen.id)
    proposals.accept("alice", kitchen.id, "kitchen")
    assert layer(store, "alice", "kitchen") == [("project_notes", "oak")]
    assert proposals.reject_all("alice", "thesis") == 0
    assert [p.id for p in proposals.pending("alice")] == [mine.id]
    with pytest.raises(NotFound):  # deleting a key the scope does not hold
        proposals.propose("alice", "decisions", None, scope="kitchen")


@pytest.mark.sqlite_only
def test_a_scoped_read_is_one_statement_as_an_unscoped_one(store: MemoryStore) -> None:
    store.set("alice", "learned_facts", "vegan")
    store.set("alice", "project_notes", "oak", scope="kitchen")

    def statements(scope: str) -> list[str]:
        seen: list[str] = []
        store.set("alice", "decisions", f"decided in a {scope or 'plain'} read", scope="kitchen")
        with sqlite_trace(seen.append):
            store.snapshot("alice", scope)  # after a write: the entries are read anew
        return [s for s in seen if s.lstrip().upper().startswith("SELECT")]

    unscoped, scoped = statements(OWN), statements("kitchen")
    assert len(scoped) == len(unscoped) == 2  # the user's version, then the entries
    assert "memory_entries.scope IN" in scoped[1]
    seen: list[str] = []
    with sqlite_trace(seen.append):
        store.snapshot("alice", "kitchen")  # nothing changed: only the version is read
    assert len([s for s in seen if s.lstrip().upper().startswith("SELECT")]) == 1


@pytest.mark.sqlite_only
def test_every_per_user_read_of_entries_is_a_search_by_the_users_index(store: MemoryStore) -> None:
    """Without statistics SQLite once read the token total through `ix_memory_entries_expiry`
    (every live entry of every user: 23 ms a write at 200,000 entries); each per-user read must
    search by the user (and layer)."""
    from kvmem.memory import snapshots, write_statements

    day = "2026-01-01"
    rows = [(f"u{n}", f"k{k}", "v", 1, "manual", day, day) for n in range(300) for k in range(5)]
    with store.database.engine.begin() as connection:
        connection.exec_driver_sql(
            "INSERT INTO users (id, created_at) VALUES (?, '2026-01-01')",
            [(f"u{n}",) for n in range(300)],
        )
        connection.exec_driver_sql(
            "INSERT INTO memory_entries (user_id, key, value, token_count, source, created_at, "
            "updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
    dialect = store.database.engine.dialect
    statements = {
        "total": write_statements.TOTAL,
        "layer entries": write_statements.ENTRIES_OF_USER,
        "snapshot": snapshots._SNAPSHOT,
        "scoped snapshot": snapshots._SNAPSHOT_SCOPED,
        "entry at key": snapshots.ENTRY_AT_KEY,
        "scopes": snapshots._SCOPES,
    }
    raw = store.database.engine.raw_connection()
    try:
        for name, statement in statements.items():
            compiled = statement.compile(dialect=dialect)
            values = {"user_id": "u7", "scope": "", "own": "", "key": "k1", "now": "2026"}
            parameters = [values.get(p, 0) for p in compiled.positiontup or ()]
            plan = raw.cursor().execute(f"EXPLAIN QUERY PLAN {compiled}", parameters).fetchall()
            details = " ".join(str(step[3]) for step in plan)
            assert "(user_id=?" in details, f"{name}: {details}"
    finally:
        raw.close()
