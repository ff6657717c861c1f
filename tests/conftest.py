"""Shared fixtures: each test builds its own small world from a config and a migrated database."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from kvmem.config import Config  # noqa: E402
from kvmem.db.engine import Database  # noqa: E402
from kvmem.db.migrate import ensure_current, upgrade  # noqa: E402
from kvmem.errors import KvmemError  # noqa: E402
from kvmem.memory.rules import MemoryRules  # noqa: E402
from kvmem.memory.store import MemoryStore  # noqa: E402
from kvmem.server.app import create_app  # noqa: E402
from kvmem.server.http_protocol import uvicorn_options  # noqa: E402
from kvmem.tokens import TokenCounter  # noqa: E402
from tests.support.apps import AGENT_MODEL, LOCAL_URL, MAIN_MODEL, LiveServer  # noqa: E402
from tests.support.pg import POSTGRES_ENV  # noqa: E402

# Forces `chat.client` in `chat_sections` for a whole run ("direct" or "litellm"); unset, a
# module marked `both_clients` runs each such test on both, the others on `auto`.
CHAT_CLIENT_ENV = "KVMEM_TEST_CHAT_CLIENT"


# A Python object's repr (`<ssl.SSLContext object at 0x7f...>`): no error a person reads has one.
OBJECT_REPR = re.compile(r"<[^<>]*\bobject at 0x[0-9A-Fa-f]+>")


@pytest.fixture(autouse=True)
def no_object_reprs_in_errors(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every error kvmem makes in this process while a test runs (every error body, every
    agent failure kept for /healthz: each is a `KvmemError`) is checked for a Python object's
    repr, which says nothing to the person who reads it; one fails the test at its teardown.
    Servers in child processes (`kvmem serve`) are not seen here."""
    found: list[str] = []
    make = KvmemError.__init__

    def checked(self: KvmemError, message: str, **details: Any) -> None:
        text = f"{message} {details}"
        if OBJECT_REPR.search(text):
            found.append(text)
        make(self, message, **details)

    monkeypatch.setattr(KvmemError, "__init__", checked)
    yield
    assert not found, f"errors with a Python object's repr: {found}"


@pytest.fixture(scope="session")
def tokens() -> TokenCounter:
    """One token counter for the whole run (loading o200k_base takes a moment)."""
    return TokenCounter()


def pytest_configure(config: pytest.Config) -> None:
    """The markers this conftest acts on."""
    config.addinivalue_line(
        "markers",
        f"both_clients: run each test using chat_sections on the direct client and on litellm "
        f"(unless {CHAT_CLIENT_ENV} forces one)",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run each test that touches the database once per backend, and each test of a
    `both_clients` module that calls models once per client."""
    if (
        "chat_client" in metafunc.fixturenames
        and metafunc.definition.get_closest_marker("both_clients")
        and not os.environ.get(CHAT_CLIENT_ENV)
    ):
        metafunc.parametrize("chat_client", ["direct", "litellm"])
    if "backend" in metafunc.fixturenames:
        backends = ["sqlite"]
        if os.environ.get(POSTGRES_ENV) and not metafunc.definition.get_closest_marker(
            "sqlite_only"
        ):
            backends.append("postgresql")
        metafunc.parametrize("backend", backends)


@pytest.hookimpl(wrapper=True, specname="pytest_collection_modifyitems")
def pytest_check_xdist_groups(config: pytest.Config, items: list[pytest.Item]) -> Iterator[None]:
    """In a pytest-xdist worker with `--dist loadgroup`, every test of an `xdist_group` must
    carry the group in its node id once collection ends, or the scheduler spreads the group
    over all workers (each then starts the group's servers and browser for itself: pytest 9.2
    with xdist 3.8 did, silently: 1,022 s of CPU instead of 926 s). Fail instead: the
    run stops at collection (xdist reports it as an internal error naming a grouped test)."""
    yield
    if not hasattr(config, "workerinput") or not config.getvalue("loadgroup"):
        return
    ungrouped = [
        item.nodeid
        for item in items
        if item.get_closest_marker("xdist_group") and "@" not in item.nodeid
    ]
    if ungrouped:
        raise pytest.UsageError(
            f"pytest-xdist did not group {len(ungrouped)} tests marked xdist_group "
            f"(e.g. {ungrouped[0]}): this pytest and pytest-xdist do not work together"
        )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without a PostgreSQL server to test against, PostgreSQL-only tests are deselected.

    Tests marked `slow` run first: the run's worker processes (pytest-xdist, `-n` in
    pyproject.toml) take tests in this order, so the long ones start at once, side by side,
    instead of one of them starting last and running alone at the end."""
    if not os.environ.get(POSTGRES_ENV):
        kept = [item for item in items if not item.get_closest_marker("postgres_only")]
        deselected = [item for item in items if item.get_closest_marker("postgres_only")]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = kept
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: slow first


@pytest.fixture
def make_client_for_url(tokens: TokenCounter) -> Iterator[Callable[[str], TestClient]]:
    """A started app on a database URL of the test's choosing (migrations not run)."""
    clients: list[TestClient] = []

    def make(url: str) -> TestClient:
        config = Config.model_validate({"database": {"url": url}})
        client = TestClient(
            create_app(config, tokens=tokens), base_url=LOCAL_URL, raise_server_exceptions=False
        )
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A fresh PostgreSQL database for this run (for this worker, under pytest-xdist),
    migrated, dropped at the end."""
    from tests.support.pg import fresh_database

    admin_url = os.environ.get(POSTGRES_ENV)
    if not admin_url:
        raise RuntimeError(f"{POSTGRES_ENV} is not set")
    # One per pytest-xdist worker too (each is a session of its own): named for the worker.
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with fresh_database(admin_url, f"kvmem_test_{worker}") as url:
        db = Database.from_config(Config.model_validate({"database": {"url": url}}).database)
        upgrade(db.engine)
        db.dispose()
        yield url


@pytest.fixture
def database_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """This test's database: a fresh SQLite file, or the run's PostgreSQL database emptied."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'kvmem.db'}"
    from tests.support.pg import empty_tables

    url = request.getfixturevalue("postgres_url")
    empty_tables(url)
    return url


@pytest.fixture
def make_config(database_url: str) -> Callable[..., Config]:
    """Build a Config from section dicts, on this test's database."""

    def make(**sections: Any) -> Config:
        data = {"database": {"url": database_url}, **sections}
        return Config.model_validate(data)

    return make


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite database migrated to the newest schema once for the run (once per worker
    under pytest-xdist: each has its own temporary folder): each test's database starts as a
    copy of it (running the migrations per test cost ~55 ms of CPU each)."""
    path = tmp_path_factory.mktemp("template") / "kvmem.db"
    db = Database.from_config(
        Config.model_validate({"database": {"url": f"sqlite:///{path}"}}).database
    )
    upgrade(db.engine)
    db.dispose()
    # The last connection's close checkpoints the WAL into the file: the file is the database.
    leftovers = [p.name for p in path.parent.iterdir() if p != path]
    assert not leftovers, f"the template database left {leftovers} beside it"
    return path


@pytest.fixture
def database(database_url: str, backend: str, request: pytest.FixtureRequest) -> Iterator[Database]:
    """This test's database, migrated to the newest schema: on SQLite a copy of the run's
    migrated template, on PostgreSQL the run's database (migrated once, emptied per test)."""
    if backend == "sqlite":
        shutil.copyfile(
            request.getfixturevalue("sqlite_template"), database_url.removeprefix("sqlite:///")
        )
    db = Database.from_config(Config.model_validate({"database": {"url": database_url}}).database)
    # At HEAD already, unless a test moved the run's PostgreSQL database: then this migrates.
    ensure_current(db.engine)
    yield db
    db.dispose()


@pytest.fixture
def make_store(database: Database, tokens: TokenCounter) -> Callable[..., MemoryStore]:
    """A MemoryStore on this test's database with the rules of a `memory:` block."""

    def make(**memory: Any) -> MemoryStore:
        config = Config.model_validate({"memory": memory})
        return MemoryStore(
            database,
            MemoryRules.from_config(config.memory),
            tokens,
            keep_days=config.memory.history.keep_days,
        )

    return make


@pytest.fixture
def make_client(
    make_config: Callable[..., Config], database: Database, tokens: TokenCounter
) -> Iterator[Callable[..., TestClient]]:
    """A started app (lifespan run) for a config built from section dicts."""
    clients: list[TestClient] = []

    def make(**sections: Any) -> TestClient:
        app = create_app(make_config(**sections), database=database, tokens=tokens)
        client = TestClient(app, base_url=LOCAL_URL, raise_server_exceptions=False)
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


@pytest.fixture
def make_value(tokens: TokenCounter) -> Callable[[int], str]:
    """A value of exactly `n` o200k_base tokens ("hello hello ...")."""

    def make(n: int) -> str:
        value = " ".join(["hello"] * n)
        assert tokens.count(value) == n
        return value

    return make


@pytest.fixture
def write_config(tmp_path: Path) -> Callable[..., Path]:
    """Write a memory.yaml (text as given) into this test's folder; returns its path."""

    def write(text: str, name: str = "memory.yaml") -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return path

    return write


@pytest.fixture
def upstream() -> Iterator[Any]:
    """A scripted OpenAI-compatible upstream on 127.0.0.1 (see tests/upstream.py)."""
    from tests.support.upstream import ScriptedUpstream

    server = ScriptedUpstream().start()
    yield server
    server.stop()


@pytest.fixture
def chat_client() -> str:
    """`chat.client` for `chat_sections`: KVMEM_TEST_CHAT_CLIENT, else `auto` (which is the
    direct client for the scripted upstream's `openai/` models)."""
    return os.environ.get(CHAT_CLIENT_ENV) or "auto"


@pytest.fixture
def chat_sections(upstream: Any, chat_client: str) -> Callable[..., dict[str, Any]]:
    """Config sections for a main model and a memory agent, both on the scripted upstream,
    called by `chat_client`."""

    def make(
        memory: dict[str, Any] | None = None,
        agent: dict[str, Any] | None = None,
        chat: dict[str, Any] | None = None,
        **sections: Any,
    ) -> dict[str, Any]:
        agent_section = {
            "provider": "openai",
            "model": AGENT_MODEL,
            "api_base": upstream.url,
            "api_key": "agent-key",
            "grace_seconds": 3,
            **(agent or {}),
        }
        return {
            "chat": {
                "model": f"openai/{MAIN_MODEL}",
                "api_base": upstream.url,
                "api_key": "main-key",
                "timeout": 10,
                "client": chat_client,
                **(chat or {}),
            },
            "memory": {"agent": agent_section, **(memory or {})},
            **sections,
        }

    return make


@pytest.fixture
def make_server(
    make_config: Callable[..., Config], database: Database, tokens: TokenCounter
) -> Iterator[Callable[..., LiveServer]]:
    """A live kvmem server (real sockets) for a config built from section dicts."""
    servers: list[LiveServer] = []

    def make(**sections: Any) -> LiveServer:
        config = make_config(**sections)
        app = create_app(config, database=database, tokens=tokens)
        # Served as `kvmem serve` serves it (the HTTP protocol with its bounds).
        server = LiveServer(app, **uvicorn_options(config.server)).start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()
