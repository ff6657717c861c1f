"""`kvmem import --from openwebui|librechat|mem0` (CONTRACT section 25), on fixtures in the
real formats (tests/data/importers/: webui.db made by Open WebUI 0.8.12's and 0.12.4's own
migrations, see make_webui_db.py; a mongoexport of LibreChat's memoryentries in relaxed and
canonical extended JSON; mem0ai 2.2.1's get_all answer)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pty
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvmem.errors import NotOfFormat
from kvmem.importers.json_stream import json_items
from kvmem.importers.openwebui import OpenWebUIDatabase
from kvmem.memory.imports import ChangedMeanwhile
from kvmem.memory.store import MemoryStore
from tests.support.cli import invoke
from tests.support.processes import Result

DATA = Path(__file__).parent / "data" / "importers"
WEBUI_OLD = DATA / "webui-0.8.12.db"
WEBUI_NEW = DATA / "webui-0.12.4.db"
LIBRECHAT_LINES = DATA / "librechat-memoryentries.jsonl"
LIBRECHAT_ARRAY = DATA / "librechat-memoryentries-array.json"
MEM0 = DATA / "mem0-get_all.json"

NURSE = "0b0f6c1e-5a43-4d2e-9c59-2f1f6a1b7e10"
RUST = "6d3a2f9b-1c4e-4b8a-a0e7-9e4c2d5b8f21"
NURSE_FACTS = (
    "I live in Lisbon and work as a nurse.\n"
    "Prefers metric units and 24-hour time.\n"
    "Has a labrador called Nico."
)
RUST_FACTS = "Vegetarian; allergic to peanuts.\nLearning Rust, coming from Python."
ENGINEER = "6841e9a0f1e2d3c4b5a69788"
ANA = "6841eb11c0ffee00deadbeef"


@pytest.fixture
def kvmem(tmp_path: Path, database_url: str) -> Callable[..., Result]:
    """`kvmem --config memory.yaml ARGS...` in this test's folder, with `memory:` as given, on
    this test's database (SQLite, and PostgreSQL too when the run names a server)."""

    def call(*args: str, memory: str = "{}") -> Result:
        config = tmp_path / "memory.yaml"
        config.write_text(f"database: {{url: '{database_url}'}}\nmemory: {memory}\n")
        return invoke(["--config", "memory.yaml", *map(str, args)], cwd=tmp_path)

    return call


def values(kvmem: Callable[..., Result], user: str) -> dict[str, str]:
    listed = kvmem("memory", "list", "--user", user)
    assert listed.code == 0, listed.stderr
    return {m["key"]: m["value"] for m in listed.json()["memories"]}


def history(kvmem: Callable[..., Result], user: str) -> list[dict[str, Any]]:
    changes = kvmem("memory", "history", "--user", user).json()["changes"]
    return [{k: c[k] for k in ("key", "op", "old_value", "new_value", "source")} for c in changes]


def user_json(user: str, added: int = 0, updated: int = 0, unchanged: int = 0) -> dict[str, Any]:
    return {
        "user_id": user,
        "added": added,
        "updated": updated,
        "unchanged": unchanged,
        "refused": [],
    }


@pytest.mark.parametrize("webui", [WEBUI_OLD, WEBUI_NEW], ids=["0.8.12", "0.12.4"])
def test_openwebui_memories_become_one_line_each_oldest_first(
    kvmem: Callable[..., Result], webui: Path
) -> None:
    result = kvmem("import", "--from", "openwebui", webui, "--json")
    assert (result.code, result.stderr) == (0, "")
    assert result.json() == {"users": [user_json(NURSE, added=3), user_json(RUST, added=2)]}
    assert values(kvmem, NURSE) == {"learned_facts": NURSE_FACTS}
    assert values(kvmem, RUST) == {"learned_facts": RUST_FACTS}
    assert history(kvmem, NURSE) == [
        {
            "key": "learned_facts",
            "op": "set",
            "old_value": None,
            "new_value": NURSE_FACTS,
            "source": "import",
        }
    ]


def test_the_table_names_each_user_and_the_totals(kvmem: Callable[..., Result]) -> None:
    result = kvmem("import", "--from", "openwebui", WEBUI_NEW)
    assert result.code == 0
    assert result.stdout.splitlines() == [
        "user                                    added  updated  unchanged  refused",
        f"{NURSE}        3        0          0        0",
        f"{RUST}        2        0          0        0",
        "2 users: 5 added, 0 updated, 0 unchanged",
    ]


def test_running_the_same_import_again_changes_nothing(kvmem: Callable[..., Result]) -> None:
    assert kvmem("import", "--from", "openwebui", WEBUI_NEW).code == 0
    before = history(kvmem, NURSE), history(kvmem, RUST)
    again = kvmem("import", "--from", "openwebui", WEBUI_NEW, "--json")
    assert again.code == 0
    assert again.json() == {"users": [user_json(NURSE, unchanged=3), user_json(RUST, unchanged=2)]}
    assert (history(kvmem, NURSE), history(kvmem, RUST)) == before
    # The older release's file holds the same memories: nothing new either.
    assert kvmem("import", "--from", "openwebui", WEBUI_OLD, "--json").json()["users"][0] == (
        user_json(NURSE, unchanged=3)
    )


def test_free_text_goes_after_the_lines_the_key_holds(kvmem: Callable[..., Result]) -> None:
    kvmem("memory", "set", "--user", NURSE, "learned_facts", "Has a labrador called Nico.")
    result = kvmem("import", "--from", "openwebui", WEBUI_NEW, "--user", NURSE, "--json")
    assert result.json() == {"users": [user_json(NURSE, added=2, unchanged=1)]}
    assert values(kvmem, NURSE) == {
        "learned_facts": "Has a labrador called Nico.\n"
        "I live in Lisbon and work as a nurse.\n"
        "Prefers metric units and 24-hour time."
    }


def test_user_imports_one_user_only(kvmem: Callable[..., Result]) -> None:
    result = kvmem("import", "--from", "openwebui", WEBUI_OLD, "--user", RUST, "--json")
    assert result.json() == {"users": [user_json(RUST, added=2)]}
    assert values(kvmem, NURSE) == {}


def test_key_names_the_key_and_must_be_allowed(kvmem: Callable[..., Result]) -> None:
    memory = "{validKeys: [user_preferences, past_notes]}"
    refused = kvmem("import", "--from", "mem0", MEM0, memory=memory)
    assert refused.code == 2
    assert refused.stderr == (
        "kvmem: key 'learned_facts' is not allowed; valid keys: user_preferences, past_notes\n"
    )
    assert values(kvmem, "alice") == {}
    done = kvmem("import", "--from", "mem0", MEM0, "--key", "past_notes", memory=memory)
    assert done.code == 0
    assert values(kvmem, "alice") == {
        "past_notes": "Prefers tea over coffee\nIs training for a half marathon in October"
    }


def test_dry_run_writes_nothing_and_says_what_would_change(kvmem: Callable[..., Result]) -> None:
    result = kvmem("import", "--from", "openwebui", WEBUI_NEW, "--dry-run")
    assert result.code == 0
    assert result.stdout.splitlines()[-1] == (
        "dry run, nothing written: 2 users: 5 added, 0 updated, 0 unchanged"
    )
    assert values(kvmem, NURSE) == {}
    assert history(kvmem, NURSE) == []


def test_what_does_not_fit_char_limit_refuses_that_user_only(
    kvmem: Callable[..., Result],
) -> None:
    # 70 characters: RUST's two lines (65) fit; NURSE's second would take the key to 76
    # (her first and third, 65, would fit: the one that does not is the one named).
    result = kvmem("import", "--from", "openwebui", WEBUI_NEW, "--json", memory="{charLimit: 70}")
    assert result.code == 1
    nurse, rust = result.json()["users"]
    assert nurse == {
        "user_id": NURSE,
        "added": 0,
        "updated": 0,
        "unchanged": 0,
        "refused": [
            {
                "key": "learned_facts",
                "where": nurse["refused"][0]["where"],
                "reason": "does not fit: learned_facts would be 76 characters, over charLimit 70",
            }
        ],
    }
    assert nurse["refused"][0]["where"].startswith("memory id ")
    assert rust == user_json(RUST, added=2)
    assert values(kvmem, NURSE) == {}
    assert values(kvmem, RUST) == {"learned_facts": RUST_FACTS}


def test_what_does_not_fit_token_limit_is_named_and_not_stored(
    kvmem: Callable[..., Result],
) -> None:
    result = kvmem("import", "--from", "openwebui", WEBUI_NEW, memory="{tokenLimit: 20}")
    assert result.code == 1
    lines = result.stdout.splitlines()
    assert lines[1] == f"{NURSE}        0        0          0        1"
    assert lines[2].startswith("  refused learned_facts (memory id ")
    assert lines[2].endswith(
        "): does not fit: the user's memory would be 28 tokens, over tokenLimit 20"
    )
    assert (
        lines[-1] == "2 users: 2 added, 0 updated, 0 unchanged; 1 refused (nothing stored for them)"
    )
    assert values(kvmem, NURSE) == {}


def test_the_memory_that_passes_the_token_limit_is_the_one_named(
    kvmem: Callable[..., Result],
) -> None:
    db = sqlite3.connect(WEBUI_NEW)
    third = db.execute(
        "SELECT id FROM memory WHERE content = 'Has a labrador called Nico.'"
    ).fetchone()[0]
    # The first two lines are 19 tokens; the third takes the key to 28.
    result = kvmem(
        "import",
        "--from",
        "openwebui",
        WEBUI_NEW,
        "--user",
        NURSE,
        "--json",
        memory="{tokenLimit: 24}",
    )
    assert result.json()["users"][0]["refused"][0]["where"] == f"memory id {third}"


@pytest.mark.parametrize("export", [LIBRECHAT_LINES, LIBRECHAT_ARRAY], ids=["lines", "array"])
def test_librechat_entries_map_one_to_one_under_the_user_id_hex(
    kvmem: Callable[..., Result], export: Path
) -> None:
    result = kvmem("import", "--from", "librechat", export, "--json")
    assert (result.code, result.stderr) == (0, "")
    assert result.json() == {"users": [user_json(ENGINEER, added=2), user_json(ANA, added=1)]}
    assert values(kvmem, ENGINEER) == {
        "user_preferences": "Prefers concise answers; writes in British English.",
        "learned_facts": "Works as a structural engineer in Leeds.\nHas two children.",
    }
    assert values(kvmem, ANA) == {"personal_info": "Name: Ana. Lives in Porto."}


def test_a_librechat_entry_replaces_a_different_value(kvmem: Callable[..., Result]) -> None:
    kvmem("memory", "set", "--user", ANA, "personal_info", "Name: Ana.")
    result = kvmem("import", "--from", "librechat", LIBRECHAT_LINES, "--user", ANA, "--json")
    assert result.json() == {"users": [user_json(ANA, updated=1)]}
    assert history(kvmem, ANA)[0] == {
        "key": "personal_info",
        "op": "set",
        "old_value": "Name: Ana.",
        "new_value": "Name: Ana. Lives in Porto.",
        "source": "import",
    }


def test_a_librechat_key_outside_valid_keys_refuses_the_user(
    kvmem: Callable[..., Result],
) -> None:
    memory = "{validKeys: [user_preferences, personal_info]}"
    result = kvmem("import", "--from", "librechat", LIBRECHAT_LINES, "--json", memory=memory)
    assert result.code == 1
    engineer, ana = result.json()["users"]
    assert engineer["refused"] == [
        {
            "key": "learned_facts",
            "where": "line 2",
            "reason": "key 'learned_facts' is not allowed; valid keys: user_preferences, "
            "personal_info",
        }
    ]
    assert values(kvmem, ENGINEER) == {}
    assert ana == user_json(ANA, added=1)


@pytest.mark.parametrize(
    ("results", "unowned_note"), [(True, True), (False, True)], ids=["results", "list"]
)
def test_mem0_memories_become_lines_under_their_user(
    kvmem: Callable[..., Result], tmp_path: Path, results: bool, unowned_note: bool
) -> None:
    source = MEM0
    if not results:
        source = tmp_path / "list.json"
        source.write_text(json.dumps(json.loads(MEM0.read_text())["results"]))
    result = kvmem("import", "--from", "mem0", source, "--json")
    assert result.code == 0
    assert result.json() == {"users": [user_json("alice", added=2), user_json("bob", added=1)]}
    assert result.stderr == (
        "kvmem: note: 1 memories have no user_id (an agent's or a run's) and were left out\n"
    )
    assert values(kvmem, "alice") == {
        "learned_facts": "Prefers tea over coffee\nIs training for a half marathon in October"
    }
    assert values(kvmem, "bob") == {"learned_facts": "Works night shifts at the hospital"}


def test_review_makes_one_proposal_per_key_and_writes_nothing(
    kvmem: Callable[..., Result],
) -> None:
    result = kvmem("import", "--from", "librechat", LIBRECHAT_LINES, "--review", "--json")
    assert result.code == 0
    assert result.json()["users"][0] == user_json(ENGINEER, added=2) | {"proposed": 2}
    assert values(kvmem, ENGINEER) == {}
    proposals = kvmem("memory", "proposals", "--user", ENGINEER).json()["proposals"]
    assert sorted((p["key"], p["op"], p["value"]) for p in proposals) == [
        ("learned_facts", "set", "Works as a structural engineer in Leeds.\nHas two children."),
        ("user_preferences", "set", "Prefers concise answers; writes in British English."),
    ]
    again = kvmem("import", "--from", "librechat", LIBRECHAT_LINES, "--review", "--json")
    assert again.json()["users"][0]["proposed"] == 0
    assert [
        p["id"] for p in kvmem("memory", "proposals", "--user", ENGINEER).json()["proposals"]
    ] == [p["id"] for p in proposals]


def test_review_of_free_text_is_one_proposal_for_the_key(kvmem: Callable[..., Result]) -> None:
    kvmem("import", "--from", "openwebui", WEBUI_NEW, "--review", "--user", NURSE)
    proposals = kvmem("memory", "proposals", "--user", NURSE).json()["proposals"]
    assert [(p["key"], p["value"]) for p in proposals] == [("learned_facts", NURSE_FACTS)]


def not_of_format(result: Result) -> str:
    assert result.code == 2, (result.stdout, result.stderr)
    return result.stderr


def test_a_file_not_of_the_format_named_is_refused_naming_it(
    kvmem: Callable[..., Result], tmp_path: Path
) -> None:
    assert f"{LIBRECHAT_LINES}: not an Open WebUI database" in not_of_format(
        kvmem("import", "--from", "openwebui", LIBRECHAT_LINES)
    )
    assert "not a mongoexport file" in not_of_format(
        kvmem("import", "--from", "librechat", WEBUI_NEW)
    )
    assert f"{WEBUI_NEW}: not mem0's JSON" in not_of_format(
        kvmem("import", "--from", "mem0", WEBUI_NEW)
    )
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE notes (id TEXT)").connection.commit()
    assert f"{other}: no table 'memory': not Open WebUI's webui.db" in not_of_format(
        kvmem("import", "--from", "openwebui", other)
    )
    object_without_results = tmp_path / "mem0.json"
    object_without_results.write_text('{"memories": []}')
    assert f'{object_without_results}: no "results" list' in not_of_format(
        kvmem("import", "--from", "mem0", object_without_results)
    )


def test_a_bad_record_anywhere_writes_nothing(kvmem: Callable[..., Result], tmp_path: Path) -> None:
    export = tmp_path / "memoryentries.json"
    lines = LIBRECHAT_LINES.read_text().splitlines()
    export.write_text(
        "\n".join([*lines, '{"userId": {"$oid": "nothex"}, "key": "a", "value": "b"}'])
    )
    stderr = not_of_format(kvmem("import", "--from", "librechat", export))
    assert stderr == (
        f'kvmem: {export}, line 4: "userId" {{"$oid": ...}} must hold 24 hexadecimal digits '
        "(a LibreChat memory entry)\n"
    )
    assert values(kvmem, ENGINEER) == {}
    broken = tmp_path / "broken.jsonl"
    broken.write_text(lines[0] + "\n" + lines[1][:40] + "\n")
    assert f"{broken}, line 2: not a JSON document" in not_of_format(
        kvmem("import", "--from", "librechat", broken)
    )


def test_a_bad_openwebui_row_is_named_before_anything_is_written(
    kvmem: Callable[..., Result], tmp_path: Path
) -> None:
    webui = tmp_path / "webui.db"
    shutil.copy(WEBUI_NEW, webui)
    db = sqlite3.connect(webui)
    db.execute("INSERT INTO memory (id, user_id, content) VALUES ('zz', 'zzz-last', x'00ff')")
    db.commit()
    db.close()
    stderr = not_of_format(kvmem("import", "--from", "openwebui", webui))
    assert "table 'memory', row 6 (id 'zz'): user_id must be text, content text" in stderr
    assert values(kvmem, NURSE) == {}


def test_openwebui_is_opened_read_only(tmp_path: Path) -> None:
    webui = tmp_path / "webui.db"
    shutil.copy(WEBUI_NEW, webui)
    before = hashlib.sha256(webui.read_bytes()).hexdigest()
    database = OpenWebUIDatabase(webui)
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        database.connection.execute("DELETE FROM memory")
    assert [user.user_id for user in database.users()] == [NURSE, RUST]
    database.close()
    assert hashlib.sha256(webui.read_bytes()).hexdigest() == before


def test_an_array_is_read_a_record_at_a_time(tmp_path: Path) -> None:
    export = tmp_path / "big.json"
    record = json.dumps({"userId": "u", "key": "k", "value": "v" * 1000})
    with export.open("w") as file:
        file.write("[" + ",".join([record] * 20_000) + "]")  # 20 MB
    with export.open("rb") as file:
        records = json_items(export, file, "item", lambda _done: None)
        assert next(records) == ("record 1", json.loads(record))
        assert file.tell() < 1_000_000


def test_an_import_planned_on_entries_that_changed_writes_nothing(
    make_store: Callable[..., MemoryStore],
) -> None:
    store = make_store()
    store.set("u", "facts", "one")
    with pytest.raises(ChangedMeanwhile):
        store.import_document("u", [("facts", "one\ntwo")], expected={"facts": None})
    with pytest.raises(ChangedMeanwhile):
        store.import_document("u", [("facts", "one\ntwo")], expected={"facts": "zero"})
    assert [e.value for e in store.snapshot("u").entries] == ["one"]
    store.import_document("u", [("facts", "one\ntwo")], expected={"facts": "one"})
    assert [e.value for e in store.snapshot("u").entries] == ["one\ntwo"]


def test_not_of_format_is_a_bad_request() -> None:
    assert (NotOfFormat.status, NotOfFormat.code) == (400, "not_of_format")


@pytest.mark.slow
def test_a_progress_bar_is_drawn_only_on_a_terminal(tmp_path: Path) -> None:
    """A real process with stderr on a pseudo-terminal draws the bar there (the in-process
    tests above, whose stderr is no terminal, see nothing on it)."""
    (tmp_path / "memory.yaml").write_text("database: {url: 'sqlite:///kv.db'}\n")
    command = [sys.executable, "-m", "kvmem", "import", "--from", "mem0", str(MEM0)]
    main, terminal = pty.openpty()
    process = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=terminal)
    os.close(terminal)
    stdout, _ = process.communicate(timeout=60)
    drawn = b""
    with contextlib.suppress(OSError):  # the terminal's other end is gone: all is read
        while chunk := os.read(main, 65536):
            drawn += chunk
    os.close(main)
    assert process.returncode == 0
    assert stdout.decode().splitlines()[-1] == "2 users: 3 added, 0 updated, 0 unchanged"
    assert b"reading mem0-get_all.json" in drawn
    assert b"importing users" in drawn


def test_review_refuses_more_keys_than_a_user_may_have_pending(
    kvmem: Callable[..., Result], tmp_path: Path
) -> None:
    export = tmp_path / "memoryentries.json"
    line = '{{"userId": {{"$oid": "{0}"}}, "key": "key_{1}", "value": "v{2}"}}'
    export.write_text(
        "\n".join(line.format(ENGINEER, chr(97 + n // 26) + chr(97 + n % 26), n) for n in range(51))
    )
    result = kvmem("import", "--from", "librechat", export, "--review", "--json")
    assert result.code == 1
    assert result.json()["users"][0]["refused"] == [
        {
            "key": "key_aa",
            "where": None,
            "reason": "51 keys to propose, and at most 50 proposals are kept per user: "
            "import without --review, or review the pending ones first",
        }
    ]
    assert kvmem("memory", "proposals", "--user", ENGINEER).json() == {"proposals": []}


def test_an_empty_mongoexport_imports_nobody(kvmem: Callable[..., Result], tmp_path: Path) -> None:
    empty = tmp_path / "memoryentries.json"
    empty.write_text("")
    result = kvmem("import", "--from", "librechat", empty, "--json")
    assert (result.code, result.json()) == (0, {"users": []})


def test_a_hostile_key_is_refused_in_a_readable_line(
    kvmem: Callable[..., Result], tmp_path: Path
) -> None:
    export = tmp_path / "memoryentries.json"
    export.write_text(json.dumps({"userId": ANA, "key": "k" * 100_000, "value": "v"}) + "\n")
    result = kvmem("import", "--from", "librechat", export, "--json")
    assert result.code == 1
    (refusal,) = result.json()["users"][0]["refused"]
    assert (len(refusal["key"]), len(refusal["reason"])) == (200, 500)
    assert refusal["reason"].startswith("invalid key 'kkkk")


def test_empty_free_text_memories_are_left_out(
    kvmem: Callable[..., Result], tmp_path: Path
) -> None:
    export = tmp_path / "mem0.json"
    export.write_text(
        json.dumps([{"memory": " \n ", "user_id": "alice"}, {"memory": "Hi", "user_id": "alice"}])
    )
    assert kvmem("import", "--from", "mem0", export, "--json").json() == {
        "users": [user_json("alice", added=1)]
    }
    assert values(kvmem, "alice") == {"learned_facts": "Hi"}
    assert kvmem("import", "--from", "mem0", export, "--json").json() == {
        "users": [user_json("alice", unchanged=1)]
    }
