"""The `kvmem` command on a config file in a temporary folder.

Its commands run in this process, through click's runner (`tests.support.cli`); what only a
real process shows (the entry point, a piped stdin, exit statuses, the imports, `serve`) runs
as a real `python -m kvmem`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from starlette.testclient import TestClient

from kvmem.config_loader import load_config
from kvmem.db.engine import Database
from kvmem.db.migrate import HEAD, ensure_current
from kvmem.memory.proposals import ProposalStore
from kvmem.memory.rules import MemoryRules
from kvmem.memory.store import MemoryStore
from kvmem.server.app import create_app
from kvmem.server.credentials import KeyStore
from kvmem.tokens import TokenCounter
from tests.support.cli import invoke, invoke_all
from tests.support.matchers import ISO_TIME, entry
from tests.support.ports import PortHold
from tests.support.processes import Result, run, run_all

INVALID_KEY_MESSAGE = (
    "invalid key {key!r}: a key is 1-128 characters of a-z, 0-9 and _, "
    "starts with a letter, and is not 'export', 'history', 'nothing', 'proposals' or 'scopes'"
)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """The folder the commands run in; memory.yaml here uses ./kv.db."""
    (tmp_path / "memory.yaml").write_text(
        "database: {url: 'sqlite:///kv.db'}\n"
        "memory: {tokenLimit: 20, charLimit: 120, validKeys: [facts, likes, dislikes, job]}\n",
        encoding="utf-8",
    )
    return tmp_path


@pytest.fixture
def kvmem(folder: Path) -> Callable[..., Result]:
    """`kvmem --config memory.yaml ARGS...`."""

    def call(*args: str, input: str | None = None) -> Result:
        return invoke(["--config", "memory.yaml", *args], cwd=folder, input=input)

    return call


@pytest.fixture
def store(folder: Path, tokens: TokenCounter) -> Iterator[MemoryStore]:
    """The same database and rules in this process: to set up and to check, not to test."""
    config = load_config(folder / "memory.yaml", environ={}).config
    database = Database.from_config(config.database)
    ensure_current(database.engine)
    yield MemoryStore(database, MemoryRules.from_config(config.memory), tokens)
    database.dispose()


def stored(store: MemoryStore, user: str = "local") -> list[tuple[str, str, str]]:
    """The user's entries as (key, value, source), oldest first."""
    return [(e.key, e.value, e.source) for e in store.snapshot(user).entries]


def test_memory_set_get_list_delete_clear(kvmem: Callable[..., Result], folder: Path) -> None:
    created = kvmem("memory", "set", "facts", "  Lives in Lyon  ")
    assert (created.code, created.stderr) == (0, "")
    assert created.json() == {
        "memory": entry("facts", "Lives in Lyon", 3),
        "total_tokens": 3,
        "token_limit": 20,
    }

    piped = kvmem("memory", "set", "likes", "-", input="tea\n")
    assert (piped.code, piped.json()) == (
        0,
        {"memory": entry("likes", "tea", 1), "total_tokens": 4, "token_limit": 20},
    )

    got, listing, other_user = invoke_all(
        [
            ["--config", "memory.yaml", "memory", "get", "facts"],
            ["--config", "memory.yaml", "memory", "list"],
            ["--config", "memory.yaml", "memory", "list", "--user", "alice"],
        ],
        folder,
    )
    assert (got.code, got.json()) == (0, created.json()["memory"])
    assert (listing.code, listing.json()) == (
        0,
        {
            "memories": [piped.json()["memory"], created.json()["memory"]],
            "total_tokens": 4,
            "token_limit": 20,
            "char_limit": 120,
            "usage_percentage": 20.0,
            "valid_keys": ["facts", "likes", "dislikes", "job"],
            "enabled": True,
        },
    )
    assert (other_user.code, other_user.json()["memories"]) == (0, [])

    deleted = kvmem("memory", "delete", "facts")
    assert (deleted.code, deleted.stdout, deleted.stderr) == (0, "deleted facts\n", "")
    cleared = kvmem("memory", "clear")
    assert (cleared.code, cleared.json()) == (0, {"deleted": 1})
    gone = kvmem("memory", "get", "likes")
    assert (gone.code, gone.stdout, gone.stderr) == (
        1,
        "",
        "kvmem: not_found: no memory with key 'likes'\n",
    )


@pytest.mark.slow
def test_the_real_command_reads_stdin_and_exits_with_its_status(folder: Path) -> None:
    """`python -m kvmem` as a shell runs it: a value piped on stdin, and the exit statuses 0,
    1 (a failed operation) and 2 (bad usage), each with its output on stdout or stderr."""
    piped = run(
        ["--config", "memory.yaml", "memory", "set", "likes", "-"], cwd=folder, input="tea\n"
    )
    assert (piped.code, piped.stderr, piped.json()["memory"]) == (0, "", entry("likes", "tea", 1))
    missing, usage = run_all(
        [
            ["--config", "memory.yaml", "memory", "get", "facts"],
            ["--config", "memory.yaml", "memory", "set", "facts"],
        ],
        folder,
    )
    assert (missing.code, missing.stdout, missing.stderr) == (
        1,
        "",
        "kvmem: not_found: no memory with key 'facts'\n",
    )
    assert (usage.code, usage.stdout) == (2, "")
    assert "Error: Missing argument 'VALUE'." in usage.stderr


def test_errors_are_the_rest_errors_with_exit_1(store: MemoryStore, folder: Path) -> None:
    store.set("local", "facts", " ".join(["hello"] * 18))
    cases: list[tuple[list[str], int, str]] = [
        (["memory", "delete", "likes"], 1, "not_found: no memory with key 'likes'"),
        (["memory", "set", "Bad", "v"], 1, "invalid_key: " + INVALID_KEY_MESSAGE.format(key="Bad")),
        (
            ["memory", "get", "nothing"],
            1,
            "invalid_key: " + INVALID_KEY_MESSAGE.format(key="nothing"),
        ),
        (
            ["memory", "set", "hobby", "v"],
            1,
            "key_not_allowed: key 'hobby' is not allowed; valid keys: facts, likes, dislikes, job",
        ),
        (["memory", "set", "likes", "   "], 1, "empty_value: the value is empty"),
        (
            ["memory", "set", "likes", "x" * 121],
            1,
            "value_too_long: the value is 121 characters; the limit is 120",
        ),
        (
            ["memory", "set", "likes", "hello hello hello"],
            1,
            "memory_full: storing 3 tokens would take memory to 21 tokens, over the limit of 20",
        ),
        (
            ["memory", "list", "--user", "bad id"],
            2,
            "invalid user id 'bad id': use 1-128 characters of A-Z, a-z, 0-9, . _ @ -",
        ),
    ]
    results = invoke_all([["--config", "memory.yaml", *args] for args, _, _ in cases], folder)
    for (args, code, message), result in zip(cases, results, strict=True):
        assert (result.code, result.stdout, result.stderr) == (code, "", f"kvmem: {message}\n"), (
            args
        )
    # Nothing was written by the refused commands.
    assert stored(store) == [("facts", " ".join(["hello"] * 18), "manual")]


def test_export_and_import(store: MemoryStore, folder: Path) -> None:
    store.set("local", "facts", "Lives in Lyon")
    store.set("local", "likes", "tea")

    to_stdout, to_file = invoke_all(
        [
            ["--config", "memory.yaml", "memory", "export"],
            ["--config", "memory.yaml", "memory", "export", "backup.json"],
        ],
        folder,
    )
    assert (to_stdout.code, to_stdout.json()) == (
        0,
        {
            "format": "kvmem.memory.v1",
            "user": "local",
            "exported_at": ISO_TIME,
            "preferences": {"memories": True},
            "memories": [entry("facts", "Lives in Lyon", 3), entry("likes", "tea", 1)],
        },
    )
    assert (to_file.code, to_file.stdout) == (0, "")
    backup = json.loads((folder / "backup.json").read_text(encoding="utf-8"))
    assert {**backup, "exported_at": None} == {**to_stdout.json(), "exported_at": None}

    # Into another user: every entry, source "import". Into this one: the others stay. The
    # older shape without "format" is still read.
    (folder / "one.json").write_text(
        json.dumps({"user": "local", "memories": [{"key": "job", "value": "baker"}]}),
        encoding="utf-8",
    )
    to_bob, merged = invoke_all(
        [
            ["--config", "memory.yaml", "memory", "import", "backup.json", "--user", "bob"],
            ["--config", "memory.yaml", "memory", "import", "one.json"],
        ],
        folder,
    )
    assert (to_bob.code, to_bob.json(), merged.code, merged.json()) == (
        0,
        {"imported": 2, "deleted": 0, "total_tokens": 4, "token_limit": 20},
        0,
        {"imported": 1, "deleted": 0, "total_tokens": 6, "token_limit": 20},
    )
    assert stored(store, "bob") == [
        ("facts", "Lives in Lyon", "import"),
        ("likes", "tea", "import"),
    ]
    assert stored(store) == [
        ("facts", "Lives in Lyon", "manual"),
        ("likes", "tea", "manual"),
        ("job", "baker", "import"),
    ]
    # With --replace the other entries go.
    replaced = invoke(
        ["--config", "memory.yaml", "memory", "import", "one.json", "--replace"], cwd=folder
    )
    assert (replaced.code, replaced.json()) == (
        0,
        {"imported": 1, "deleted": 2, "total_tokens": 2, "token_limit": 20},
    )
    assert stored(store) == [("job", "baker", "import")]


def test_import_is_all_or_nothing(store: MemoryStore, folder: Path) -> None:
    store.set("local", "facts", "Lives in Lyon")
    documents = {
        "bad_key.json": [{"key": "likes", "value": "tea"}, {"key": "Bad", "value": "x"}],
        "too_big.json": [
            {"key": "likes", "value": "tea"},
            {"key": "job", "value": " ".join(["hello"] * 20)},
        ],
    }
    for name, memories in documents.items():
        (folder / name).write_text(json.dumps({"memories": memories}), encoding="utf-8")
    (folder / "broken.json").write_text("{not json", encoding="utf-8")
    (folder / "wrong_shape.json").write_text(
        json.dumps({"memories": [{"key": "likes"}]}), encoding="utf-8"
    )

    commands = [
        ["memory", "import", "bad_key.json"],
        ["memory", "import", "too_big.json", "--replace"],
        ["memory", "import", "broken.json"],
        ["memory", "import", "wrong_shape.json"],
    ]
    results = invoke_all([["--config", "memory.yaml", *c] for c in commands], folder)
    assert [(r.code, r.stdout) for r in results] == [(1, ""), (1, ""), (2, ""), (2, "")]
    assert results[0].stderr == (
        "kvmem: invalid_key: memories[1] (key 'Bad'): "
        + INVALID_KEY_MESSAGE.format(key="Bad")
        + "\n"
    )
    assert results[1].stderr == (
        "kvmem: memory_full: importing 21 tokens would take memory over the limit of 20 tokens "
        "(passed at key 'job')\n"
    )
    assert results[2].stderr.startswith("kvmem: cannot read broken.json: ")
    assert results[3].stderr == "kvmem: invalid memory document: memories.0.value: Field required\n"
    assert stored(store) == [("facts", "Lives in Lyon", "manual")]


def history_of(result: Result) -> list[tuple[str, str, str | None, str | None, str]]:
    """A printed history page as (key, op, old, new, source), newest first."""
    return [
        (c["key"], c["op"], c["old_value"], c["new_value"], c["source"])
        for c in result.json()["changes"]
    ]


def test_memory_history_and_revert(kvmem: Callable[..., Result], store: MemoryStore) -> None:
    store.set("local", "likes", "tea")
    store.set("local", "likes", "coffee", "agent", conversation_id="conv-1")
    store.set("local", "job", "baker")
    store.set("alice", "likes", "alice's tea")

    everything, likes, alices = (
        kvmem("memory", "history"),
        kvmem("memory", "history", "likes"),
        kvmem("memory", "history", "--user", "alice"),
    )
    assert (everything.code, likes.code, alices.code) == (0, 0, 0)
    assert history_of(everything) == [
        ("job", "set", None, "baker", "manual"),
        ("likes", "set", "tea", "coffee", "agent"),
        ("likes", "set", None, "tea", "manual"),
    ]
    assert everything.json()["next"] is None
    assert everything.json()["changes"][1]["conversation_id"] == "conv-1"
    assert history_of(likes) == history_of(everything)[1:]
    assert history_of(alices) == [("likes", "set", None, "alice's tea", "manual")]
    paged = kvmem("memory", "history", "--limit", "1")
    assert paged.json()["next"] == everything.json()["changes"][0]["id"]

    to_tea = likes.json()["changes"][1]["id"]
    reverted = kvmem("memory", "revert", "likes", str(to_tea))
    assert (reverted.code, reverted.stderr) == (0, "")
    assert reverted.json() == {
        "memory": entry("likes", "tea", 1, "revert"),
        "total_tokens": 3,
        "token_limit": 20,
    }
    assert stored(store) == [("job", "baker", "manual"), ("likes", "tea", "revert")]
    # The CLI's own writes are recorded too.
    assert kvmem("memory", "set", "likes", "green tea").code == 0
    assert kvmem("memory", "delete", "job").code == 0
    assert history_of(kvmem("memory", "history"))[:3] == [
        ("job", "delete", "baker", None, "manual"),
        ("likes", "set", "tea", "green tea", "manual"),
        ("likes", "set", "coffee", "tea", "revert"),
    ]

    alices_change = alices.json()["changes"][0]["id"]
    refused, malformed = (
        kvmem("memory", "revert", "likes", str(alices_change)),
        kvmem("memory", "revert", "likes", "one"),
    )
    assert (refused.code, refused.stdout, refused.stderr) == (
        1,
        "",
        f"kvmem: not_found: no change {alices_change} of key 'likes'\n",
    )
    assert (malformed.code, malformed.stdout) == (2, "")
    assert "'one' is not a valid integer" in malformed.stderr
    assert stored(store, "alice") == [("likes", "alice's tea", "manual")]


def test_memory_proposals_accept_reject(
    kvmem: Callable[..., Result], store: MemoryStore, folder: Path
) -> None:
    proposals = ProposalStore(store)
    proposals.propose("local", "likes", "tea", conversation_id="conv-1")  # id 1
    proposals.propose("local", "job", "one two three four five six", conversation_id="conv-2")
    proposals.propose("alice", "facts", "alice's")  # id 3
    store.set("local", "facts", " ".join(["hello"] * 16))
    listed, alices = invoke_all(
        [
            ["--config", "memory.yaml", "memory", "proposals"],
            ["--config", "memory.yaml", "memory", "proposals", "--user", "alice"],
        ],
        folder,
    )
    assert (listed.code, listed.json()) == (
        0,
        {
            "proposals": [
                {
                    "id": 2,
                    "key": "job",
                    "op": "set",
                    "value": "one two three four five six",
                    "conversation_id": "conv-2",
                    "created_at": ISO_TIME,
                    "expires_at": None,
                },
                {
                    "id": 1,
                    "key": "likes",
                    "op": "set",
                    "value": "tea",
                    "conversation_id": "conv-1",
                    "created_at": ISO_TIME,
                    "expires_at": None,
                },
            ]
        },
    )
    assert [p["id"] for p in alices.json()["proposals"]] == [3]

    kept = kvmem("memory", "accept", "1")
    assert (kept.code, kept.stderr, kept.json()) == (
        0,
        "",
        {"memory": entry("likes", "tea", 1, source="agent"), "total_tokens": 17, "token_limit": 20},
    )
    full = kvmem("memory", "accept", "2")
    assert (full.code, full.stdout, full.stderr) == (
        1,
        "",
        "kvmem: memory_full: storing 6 tokens "
        "would take memory to 23 tokens, over the limit of 20\n",
    )
    others = kvmem("memory", "accept", "3")
    assert (others.code, others.stdout, others.stderr) == (
        1,
        "",
        "kvmem: not_found: no pending proposal 3\n",
    )
    rejected = kvmem("memory", "reject", "2")
    assert (rejected.code, rejected.stdout, rejected.stderr) == (0, "rejected 2\n", "")
    again = kvmem("memory", "reject", "2")
    assert (again.code, again.stderr) == (1, "kvmem: not_found: no pending proposal 2\n")
    assert proposals.pending("local") == ()
    assert [p.key for p in proposals.pending("alice")] == ["facts"]
    assert stored(store)[-1] == ("likes", "tea", "agent")
    assert [c.conversation_id for c in store.history("local", "likes").changes] == ["conv-1"]


def test_user_erase(kvmem: Callable[..., Result], store: MemoryStore, folder: Path) -> None:
    store.set("alice", "likes", "tea")
    store.set("alice", "likes", "coffee")
    store.set("bob", "likes", "bob's tea")
    KeyStore(store.database).create("alice")

    unconfirmed = kvmem("user", "erase", "--user", "alice", input="y\n")
    assert (unconfirmed.code, unconfirmed.stdout, unconfirmed.stderr) == (
        2,
        "",
        "kvmem: refusing to erase without --yes when standard input is not a terminal\n",
    )
    assert stored(store, "alice") == [("likes", "coffee", "manual")]

    erased = kvmem("user", "erase", "--user", "alice", "--yes")
    assert (erased.code, erased.stderr) == (0, "")
    assert erased.json() == {
        "deleted": {
            "memories": 1,
            "changes": 2,
            "conversations": 0,
            "messages": 0,
            "keys": 1,
            "sessions": 0,
            "agent_runs": 0,
        }
    }
    assert stored(store, "alice") == []
    assert store.history("alice").changes == ()
    assert KeyStore(store.database).list("alice") == []
    assert stored(store, "bob") == [("likes", "bob's tea", "manual")]
    bad_user = kvmem("user", "erase", "--user", "not a user", "--yes")
    assert (bad_user.code, bad_user.stdout) == (2, "")


def test_config_option_is_accepted_everywhere(folder: Path) -> None:
    elsewhere = folder / "elsewhere"
    elsewhere.mkdir()
    # The first run migrates; the others then run side by side.
    from_env = invoke(
        ["memory", "list"], cwd=elsewhere, env={"KVMEM_CONFIG": str(folder / "memory.yaml")}
    )
    assert from_env.code == 0, from_env
    results = invoke_all(
        [
            ["--config", "../memory.yaml", "memory", "list"],
            ["memory", "--config", "../memory.yaml", "list"],
            ["memory", "list", "--config", "../memory.yaml"],
        ],
        elsewhere,
    )
    assert [(r.code, r.stdout, r.stderr) for r in results] == [(0, from_env.stdout, "")] * 3
    # The relative database path followed the config file, not the working directory.
    assert (folder / "kv.db").exists() and not (elsewhere / "kv.db").exists()


def test_config_problems_exit_2_naming_the_field(tmp_path: Path) -> None:
    files = {
        "typo.yaml": "memory:\n  tokenLimt: 5\n",
        "modle.yaml": "memory:\n  agent: {provider: openai, modle: m}\n",
        "unset.yaml": "memory:\n  agent: {provider: openai, model: m, apiKey: '${KVMEM_TEST_UNSET_VAR}'}\n",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    commands = [
        ["memory", "list", "--config", "typo.yaml"],
        ["keys", "list", "--config", "unset.yaml"],
        ["check", "--config", "missing.yaml"],
        ["check", "--config", "modle.yaml"],
        ["memory", "set", "facts"],  # bad usage: a missing argument
    ]
    results = invoke_all(commands, tmp_path)
    assert [(r.code, r.stdout) for r in results] == [(2, "")] * len(commands)
    assert [r.stderr for r in results[:4]] == [
        "kvmem: typo.yaml: invalid config:\n  memory.tokenLimt: unknown field; did you mean 'tokenLimit'?\n",
        "kvmem: unset.yaml: memory.agent.apiKey: environment variable KVMEM_TEST_UNSET_VAR is not set "
        "(write ${KVMEM_TEST_UNSET_VAR:-default} to give a default)\n",
        "kvmem: missing.yaml: cannot read the config file: No such file or directory\n",
        "kvmem: modle.yaml: invalid config:\n"
        "  memory.agent.modle: unknown field; did you mean 'model' or 'mode'?\n",
    ]
    assert "Error: Missing argument 'VALUE'." in results[4].stderr


def test_keys_create_list_revoke(kvmem: Callable[..., Result], folder: Path) -> None:
    (folder / "keys.yaml").write_text(
        "database: {url: 'sqlite:///kv.db'}\nauth: {mode: keys}\n", encoding="utf-8"
    )
    created = kvmem("keys", "create", "--user", "alice")
    assert (created.code, created.stderr) == (0, "")
    lines = created.stdout.splitlines()
    secret = lines[-1]
    assert secret.startswith("kvm_") and " " not in secret and len(secret) >= 40
    assert lines[0].startswith("created key_") and lines[0].endswith(
        " for user alice; store the key now, it is not shown again:"
    )
    key_id = lines[0].split()[1]
    other = kvmem("keys", "create", "--user", "bob").stdout.splitlines()[-1]

    listed, only_alice = invoke_all(
        [
            ["--config", "memory.yaml", "keys", "list"],
            ["--config", "memory.yaml", "keys", "list", "--user", "alice"],
        ],
        folder,
    )
    assert (listed.code, only_alice.code) == (0, 0)
    for output in (listed.stdout, only_alice.stdout):
        assert secret not in output and other not in output
        assert secret[len("kvm_") :] not in output
    keys = listed.json()["keys"]
    assert keys == [
        {
            "id": key_id,
            "user_id": "alice",
            "prefix": secret[:12],
            "created_at": ISO_TIME,
            "revoked_at": None,
        },
        {
            "id": keys[1]["id"],
            "user_id": "bob",
            "prefix": other[:12],
            "created_at": ISO_TIME,
            "revoked_at": None,
        },
    ]
    assert only_alice.json() == {"keys": keys[:1]}

    # The printed key authenticates against the app, as alice, until it is revoked.
    config = load_config(folder / "keys.yaml", environ={}).config
    database = Database.from_config(config.database)
    try:
        with TestClient(
            create_app(config, database=database), raise_server_exceptions=False
        ) as client:
            headers = {"Authorization": f"Bearer {secret}"}
            put = client.put("/memory/k", json={"value": "v"}, headers=headers)
            assert (put.status_code, put.json()["memory"]) == (201, entry("k", "v", 1))
            assert (
                client.get("/memory/k", headers={**headers, "X-User-Id": "alice"}).status_code
                == 200
            )
            # Sessions minted with the key (and bob's, minted with his) work until it is revoked.
            alice_session, bob_session = (
                {
                    "Authorization": "Bearer "
                    + client.post("/sessions", headers={"Authorization": f"Bearer {key}"}).json()[
                        "token"
                    ]
                }
                for key in (secret, other)
            )
            assert client.get("/memory/k", headers=alice_session).status_code == 200

            revoked, unknown = invoke_all(
                [
                    ["--config", "memory.yaml", "keys", "revoke", key_id],
                    ["--config", "memory.yaml", "keys", "revoke", "key_nope"],
                ],
                folder,
            )
            assert (revoked.code, revoked.stdout, revoked.stderr) == (
                0,
                f"revoked {key_id} of user alice; the user's sessions are ended\n",
                "",
            )
            assert (unknown.code, unknown.stderr) == (
                1,
                "kvmem: not_found: no API key with id 'key_nope'\n",
            )
            assert client.get("/memory", headers=headers).json() == {
                "error": {
                    "code": "unauthorized",
                    "message": "the API key is not valid (unknown or revoked)",
                }
            }
            assert (
                client.get("/memory", headers={"Authorization": f"Bearer {other}"}).status_code
                == 200
            )
            assert client.get("/memory", headers=alice_session).json() == {
                "error": {
                    "code": "unauthorized",
                    "message": "the session token is not valid (unknown, ended or expired)",
                }
            }
            assert client.get("/memory", headers=bob_session).status_code == 200
        assert [k.revoked_at is not None for k in KeyStore(database).list()] == [True, False]
    finally:
        database.dispose()


@pytest.mark.slow
def test_serve_answers_the_host_it_binds_and_refuses_other_names(tmp_path: Path) -> None:
    """`--host` overrides server.host, and the default server.allowed_hosts follows it."""
    # A direct-path chat model, never called: the default would import litellm beside start-up.
    (tmp_path / "local.yaml").write_text(
        "database: {url: 'sqlite:///kv.db'}\n"
        "chat: {model: openai/unused, api_base: 'http://127.0.0.1:9/v1'}\n"
    )
    hold = PortHold("127.0.0.2")  # given back once kvmem has exited
    url = f"http://127.0.0.2:{hold.port}"
    with (tmp_path / "serve.log").open("wb") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kvmem",
                "serve",
                "--config",
                "local.yaml",
                "--host",
                "127.0.0.2",
                "--port",
                str(hold.port),
            ],
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    try:
        deadline = time.monotonic() + 60
        with httpx.Client(timeout=1) as http:  # one client for every poll
            while True:
                assert process.poll() is None, (tmp_path / "serve.log").read_text()
                try:
                    served = http.get(f"{url}/memory")
                    break
                except httpx.TransportError:
                    assert time.monotonic() < deadline, "kvmem did not start"
                    time.sleep(0.05)
        assert served.status_code == 200
        refused = httpx.get(f"{url}/memory", headers={"Host": "evil.example"}, timeout=10)
        assert (refused.status_code, refused.json()["error"]["code"]) == (403, "host_not_allowed")
    finally:
        process.terminate()
        process.wait(20)
        hold.close()


def test_a_served_app_freezes_what_start_up_made_once_its_loads_end(
    database: Database, database_url: str
) -> None:
    """`kvmem serve` builds its app with `freeze_gc`: after the encoding's load (and litellm's,
    when it is imported) `gc.freeze()`, so full collections no longer
    walk the process's modules and tables (the 50-writer p99 was their pauses). Other apps,
    like this suite's own, freeze nothing. In a child process: a freeze would keep this
    worker's objects for good."""
    script = (
        "import gc, threading\n"
        "from starlette.testclient import TestClient\n"
        "from kvmem.server.app import create_app\n"
        "from kvmem.config import Config\n"
        "config = Config.model_validate({'database': {'url': %r}, 'chat': %r})\n"
        "for freeze in (False, True):\n"
        "    app = create_app(config, freeze_gc=freeze)\n"
        "    with TestClient(app, base_url='http://127.0.0.1') as client:\n"
        "        assert client.get('/memory').status_code == 200\n"
        "        for thread in threading.enumerate():\n"
        "            if thread.name in ('kvmem-tokenizer', 'kvmem-gc-freeze'):\n"
        "                thread.join(60)\n"
        "        print(freeze, gc.get_freeze_count() > 50_000)\n"
    ) % (database_url, {"model": "openai/unused", "api_base": "http://127.0.0.1:9/v1"})
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False, timeout=120
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "False False\nTrue True\n", "")


def test_the_freeze_collects_only_after_a_load_it_waited_for() -> None:
    """A collection walks every object start-up made (~50 ms holding the GIL): the freeze
    runs one only when it waited for a load (litellm's, long after ready), never on the way
    to ready; either way it freezes and turns the collector on. In a child process."""
    script = (
        "import gc, threading\n"
        "from kvmem.server.app import freeze_start_up\n"
        "runs = []\n"
        "gc.callbacks.append(lambda phase, info: phase == 'start' and runs.append(1))\n"
        "gc.disable()\n"
        "freeze_start_up(None)\n"
        "print(len(runs), gc.get_freeze_count() > 10_000, gc.isenabled())\n"
        "gc.unfreeze()\n"
        "gc.disable()\n"
        "load = threading.Thread(target=lambda: None)\n"
        "load.start()\n"
        "freeze_start_up(load)\n"
        "print(len(runs), gc.get_freeze_count() > 10_000, gc.isenabled())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False, timeout=120
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "0 True True\n1 True True\n", "")


def test_the_encoding_is_loaded_when_the_app_is_ready(
    database: Database, database_url: str
) -> None:
    """Ready means ready: once the lifespan has started (the server answers), the token
    encoding is loaded, so neither the first write nor the first agent run waits ~0.2 s for
    it. In a child process, whose first load of the encoding is this one."""
    script = (
        "from starlette.testclient import TestClient\n"
        "from kvmem.server.app import create_app\n"
        "from kvmem.config import Config\n"
        "from kvmem.tokens import TokenCounter\n"
        "config = Config.model_validate({'database': {'url': %r}, 'chat': %r})\n"
        "tokens = TokenCounter()\n"
        "with TestClient(create_app(config, tokens=tokens), base_url='http://127.0.0.1'):\n"
        "    print(tokens._encoding is not None)\n"
    ) % (database_url, {"model": "openai/unused", "api_base": "http://127.0.0.1:9/v1"})
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False, timeout=120
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "True\n", "")


def test_the_collector_is_off_only_while_kvmem_starts(
    database: Database, database_url: str
) -> None:
    """Importing the CLI pauses the garbage collector and leaves it as it found it; `kvmem
    serve` keeps it off through start-up (~0.1 s of CPU less), and the served app's freeze,
    once start-up's loads end, turns it back on: a server never runs without collections."""
    script = (
        "import gc, threading\n"
        "gc.disable()\n"
        "import kvmem.cli\n"
        "print(gc.isenabled())\n"
        "gc.enable()\n"
        "import importlib; importlib.reload(kvmem.cli)\n"
        "print(gc.isenabled())\n"
        "from starlette.testclient import TestClient\n"
        "from kvmem.server.app import create_app\n"
        "from kvmem.config import Config\n"
        "config = Config.model_validate({'database': {'url': %r}, 'chat': %r})\n"
        "gc.disable()  # as kvmem serve leaves it\n"
        "with TestClient(create_app(config, freeze_gc=True), base_url='http://127.0.0.1') as client:\n"
        "    assert client.get('/memory').status_code == 200\n"
        "    for thread in threading.enumerate():\n"
        "        if thread.name in ('kvmem-tokenizer', 'kvmem-gc-freeze'):\n"
        "            thread.join(60)\n"
        "    print(gc.isenabled())\n"
    ) % (database_url, {"model": "openai/unused", "api_base": "http://127.0.0.1:9/v1"})
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False, timeout=120
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "False\nTrue\nTrue\n", "")


@pytest.mark.slow
def test_serve_in_local_mode_refuses_a_public_host(tmp_path: Path) -> None:
    (tmp_path / "public.yaml").write_text(
        "server: {host: 0.0.0.0}\ndatabase: {url: 'sqlite:///kv.db'}\n"
    )
    (tmp_path / "local.yaml").write_text("database: {url: 'sqlite:///kv.db'}\n")
    results = run_all(
        [
            ["serve", "--config", "public.yaml"],
            ["serve", "--config", "local.yaml", "--host", "192.168.1.10", "--port", "0"],
        ],
        tmp_path,
    )

    def message(host: str) -> str:
        return (
            f"kvmem: auth.mode is local (no credentials), so kvmem only binds a loopback address; "
            f"{host!r} is not one. Use 127.0.0.1, or set auth.mode: keys.\n"
        )

    assert [(r.code, r.stdout, r.stderr) for r in results] == [
        (2, "", message("0.0.0.0")),
        (2, "", message("192.168.1.10")),
    ]
    assert not (tmp_path / "kv.db").exists()  # refused before touching the database


def test_db_current_and_upgrade(tmp_path: Path) -> None:
    (tmp_path / "memory.yaml").write_text("database: {url: 'sqlite:///data/kv.db'}\n")
    blank = invoke(["db", "current", "--config", "memory.yaml"], cwd=tmp_path)
    assert (blank.code, blank.stdout, blank.stderr) == (
        0,
        f"current: none (blank database)\nhead: {HEAD}\npending migrations: run `kvmem db upgrade`\n",
        "",
    )
    upgraded = invoke(["db", "upgrade", "--config", "memory.yaml"], cwd=tmp_path)
    assert (upgraded.code, upgraded.stdout) == (0, f"database at revision {HEAD}\n")
    assert (tmp_path / "data" / "kv.db").is_file()
    current = invoke(["db", "current", "--config", "memory.yaml"], cwd=tmp_path)
    assert (current.code, current.stdout) == (0, f"current: {HEAD}\nhead: {HEAD}\nup to date\n")


def test_unreachable_database_exits_2(tmp_path: Path) -> None:
    (tmp_path / "pg.yaml").write_text(
        "database: {url: 'postgresql+psycopg://kv:hunter2@127.0.0.1:9/kv'}\n"
    )
    for result in [invoke(["memory", "list", "--config", "pg.yaml"], cwd=tmp_path)]:
        assert result.code == 2, result
        assert result.stderr.startswith(
            "kvmem: cannot open database postgresql+psycopg://kv:***@127.0.0.1:9/kv: "
        )
        assert "hunter2" not in result.stderr


@pytest.mark.slow
def test_importing_the_cli_loads_neither_litellm_nor_tiktoken(tmp_path: Path) -> None:
    """Model: click's tests/test_imports.py, in a fresh interpreter. rich too: it draws the
    tables only when a command prints on a terminal (~120 ms to import)."""
    code = (
        "import json, sys\n"
        "import kvmem.cli\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'litellm', 'tiktoken', 'tiktoken_ext', 'openai', 'httpx', 'starlette', 'uvicorn', "
        "'rich'})))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert json.loads(done.stdout) == []


@pytest.mark.slow
def test_memory_list_loads_neither_litellm_nor_tiktoken(folder: Path) -> None:
    code = (
        "import atexit, sys\n"
        "atexit.register(lambda: print(sorted(m for m in sys.modules "
        "if m.split('.')[0] in {'litellm', 'tiktoken'})))\n"
        "from kvmem.cli import main\n"
        "main(['--config', 'memory.yaml', 'memory', 'list'])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=folder, timeout=60
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines()[-1] == "[]"
