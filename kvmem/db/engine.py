"""The database: engine setup, sessions and transactions, and running the migrations.

SQLite runs in WAL mode with a busy timeout, and write transactions start with
`BEGIN IMMEDIATE`, so that a check-then-write (the `tokenLimit` check) can never interleave
with another writer. On PostgreSQL the same guarantee comes from a row lock on the user
(`MemoryStore` takes it through `lock_user`).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any, cast

from sqlalchemy import bindparam, create_engine, event, insert, select, text
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection, CursorResult, Engine, Result, make_url
from sqlalchemy.exc import (
    InterfaceError,
    InternalError,
    OperationalError,
    ProgrammingError,
)
from sqlalchemy.orm import Session, sessionmaker

from kvmem.config import DatabaseConfig
from kvmem.db.driver_connection import DriverConnection, DriverResult
from kvmem.db.tables import User
from kvmem.entries import utcnow
from kvmem.errors import StoreUnavailable

SQLITE_BUSY_TIMEOUT_MS = 10_000
# While readers keep an erasure's WAL checkpoint from finishing, it is tried again this often
# (each try gives up at once rather than wait: a waiting checkpoint holds writers back).
WAL_RETRY_SECONDS = 0.5
_WRITE = "kvmem_write"
LOCK_USER_ATTEMPTS = 20
# PostgreSQL: undefined_table, undefined_column, read_only_sql_transaction.
_UNAVAILABLE_STATES = {"42P01", "42703", "25006"}
# `lock_user`'s statements, built once (every write runs them).
_NEW_USER: dict[str, Any] = {"id": bindparam("id"), "created_at": bindparam("created_at")}
_SQLITE_ADD_USER = sqlite_insert(User).values(_NEW_USER).on_conflict_do_nothing()
_PG_LOCK_USER = select(User.id).where(User.id == bindparam("id")).with_for_update()


@functools.cache
def _pg_add_user() -> Any:
    """PostgreSQL's insert-if-missing of a user row, built on first use: importing SQLAlchemy's
    PostgreSQL dialect (~20 ms of CPU) is not something a SQLite server's start-up needs."""
    from sqlalchemy.dialects.postgresql import insert as pg_insert

    return pg_insert(User).values(_NEW_USER).on_conflict_do_nothing()


def create_db_engine(config: DatabaseConfig) -> Engine:
    """An engine for `config.url`, with kvmem's SQLite pragmas and transaction handling."""
    url = make_url(config.url)
    if url.get_backend_name() == "sqlite":
        _prepare_sqlite_folder(url.database)
        engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
        event.listen(engine, "connect", _sqlite_on_connect)
        event.listen(engine, "begin", _sqlite_on_begin)
        return engine
    return create_engine(
        url,
        pool_size=config.pool_size,
        max_overflow=config.max_overflow,
        pool_pre_ping=True,
    )


def _prepare_sqlite_folder(database: str | None) -> None:
    if database and database != ":memory:" and not database.startswith("file:"):
        Path(database).parent.mkdir(parents=True, exist_ok=True)


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    # Take transaction control away from the sqlite3 module so that "begin" below decides
    # between a deferred (read) and an immediate (write) transaction.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA foreign_keys=ON")
    # NORMAL is WAL's recommended level: a commit is durable against a process crash (kill -9
    # loses no acknowledged write; the tests check it) and the WAL is synced at checkpoints,
    # so a power cut may lose the last commits but never corrupts the file. FULL would add
    # an fsync to every commit and cap concurrent writers at the disk's fsync rate.
    cursor.execute("PRAGMA synchronous=NORMAL")
    # Deleted content is overwritten with zeros, not left in free pages: an erased user's
    # text (DELETE /me, kvmem user erase) must be gone from the file, not merely unlinked.
    cursor.execute("PRAGMA secure_delete=ON")
    cursor.close()


def _sqlite_on_begin(connection: Any) -> None:
    write = connection.get_execution_options().get(_WRITE, False)
    connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


def rowcount(result: Result[Any] | DriverResult) -> int:
    """The rows an UPDATE or DELETE matched. `Session.execute` is typed to return a `Result`;
    for those statements it is a `CursorResult`, which counts them (as `DriverResult` does)."""
    return cast("CursorResult[Any] | DriverResult", result).rowcount


class WriterTurn:
    """SQLite's one writer at a time within this process, requests before maintenance.

    Threads of this process take turns on an in-process lock instead of racing for the file
    lock, whose busy handler sleeps the losers for growing intervals (the benchmark measured
    a 4x worse p99 that way). The lock is a plain threading.Lock, which promises no order; a
    `background` writer (the history sweep) additionally waits until no other writer is
    waiting, so a long series of its short transactions never keeps a request's write out
    for more than one of them.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting = 0  # writers (not background) waiting for or about to take the lock
        self._idle = threading.Condition(threading.Lock())

    @property
    def waiting(self) -> int:
        """How many writers (not background ones) wait for the lock."""
        return self._waiting

    @contextmanager
    def turn(self, *, background: bool = False) -> Iterator[None]:
        """Hold the writer lock for the block."""
        if background:
            while True:
                with self._idle:
                    self._idle.wait_for(lambda: self._waiting == 0)
                self._lock.acquire()
                if not self._waiting:  # no writer came while this one waited for the lock
                    break
                self._lock.release()
        else:
            with self._idle:
                self._waiting += 1
            try:
                self._lock.acquire()
            finally:
                with self._idle:
                    self._waiting -= 1
                    if not self._waiting:
                        self._idle.notify_all()
        try:
            yield
        finally:
            self._lock.release()


class Database:
    """Owns the engine; hands out read and write sessions that map driver errors to 503."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.dialect = engine.dialect.name
        self._read = sessionmaker(engine, expire_on_commit=False)
        self._write_engine = engine.execution_options(**{_WRITE: True})
        self._write = sessionmaker(self._write_engine, expire_on_commit=False)
        self._writers = WriterTurn() if self.dialect == "sqlite" else None
        # Set while erased text may still be in SQLite's WAL (`empty_wal`); /healthz says so.
        self.wal_pending = False
        self._wal_retry: threading.Thread | None = None
        self._wal_lock = threading.Lock()
        self._disposed = threading.Event()

    @classmethod
    def from_config(cls, config: DatabaseConfig) -> Database:
        """A database for the configured URL."""
        return cls(create_db_engine(config))

    @contextmanager
    def reading(self) -> Iterator[Session]:
        """A session for reads only."""
        with self._translate_errors(), self._read() as session, session.begin():
            yield session

    @contextmanager
    def writing(self, *, background: bool = False) -> Iterator[Session]:
        """A write transaction: committed when the block ends, rolled back if it raises.
        A `background` one (maintenance) waits on SQLite until no request's write waits."""
        # SQLite has one writer at a time: threads of this process take turns (`WriterTurn`).
        with (
            self._writer_turn(background),
            self._translate_errors(),
            self._write() as session,
            session.begin(),
        ):
            yield session

    def _writer_turn(self, background: bool = False) -> AbstractContextManager[Any]:
        return self._writers.turn(background=background) if self._writers else nullcontext()

    @contextmanager
    def reading_cursor(self) -> Iterator[Any]:
        """SQLite only: a DB-API cursor in a read transaction, for the read on every chat
        request's path (`MemoryStore.snapshot`). SQLAlchemy's connection, events and result
        objects cost ~0.5 ms around two queries that take ~30 µs; here, statements compiled
        once run straight on the pooled sqlite3 connection."""
        dbapi = self.engine.dialect.dbapi
        assert dbapi is not None  # SQLite's driver module, loaded with the engine
        try:
            # The pool may raise the driver's own errors (a file it cannot open) unwrapped.
            with self._translate_errors():
                connection = self.engine.raw_connection()  # pooled, pre-pinged
            try:
                cursor = connection.cursor()
                cursor.execute("BEGIN")  # deferred: one consistent read snapshot of the WAL
                try:
                    yield cursor
                finally:
                    cursor.execute("ROLLBACK")  # nothing was written
            finally:
                connection.close()  # back to the pool
        except (dbapi.OperationalError, dbapi.InterfaceError) as exc:
            raise StoreUnavailable(f"the memory store is unavailable: {exc}") from exc

    @contextmanager
    def writing_connection(self) -> Iterator[Connection]:
        """A write transaction as `writing`, on a bare connection: no ORM session around it,
        for the hottest write path (`MemoryStore.set`), whose statements are all Core."""
        with (
            self._writer_turn(),
            self._translate_errors(),
            self._write_engine.begin() as connection,
        ):
            yield connection

    @contextmanager
    def writing_prebuilt(self) -> Iterator[Connection | DriverConnection]:
        """A write transaction for prebuilt Core statements only (`MemoryStore.set`'s and
        `delete`'s): on SQLite on the bare sqlite3 connection (`kvmem.db.driver_connection`),
        which spares the ~1 ms of SQLAlchemy work a write otherwise spends holding the one
        writer's turn; elsewhere `writing_connection`. Committed when the block ends."""
        if self.dialect != "sqlite":
            with self.writing_connection() as connection:
                yield connection
            return
        dbapi = self.engine.dialect.dbapi
        assert dbapi is not None  # sqlite3, loaded with the engine
        with self._writer_turn(), self._translate_errors():
            try:
                pooled = self.engine.raw_connection()  # pooled, pre-pinged
            except (dbapi.OperationalError, dbapi.InterfaceError) as exc:
                raise StoreUnavailable(f"the memory store is unavailable: {exc}") from exc
            try:
                raw = pooled.driver_connection
                assert raw is not None  # a checked-out connection has its driver's
                driver = DriverConnection(raw, self.engine.dialect)
                driver.run("BEGIN IMMEDIATE")
                try:
                    yield driver
                    driver.run("COMMIT")
                except BaseException:
                    # A failed COMMIT (a deferred constraint) leaves the transaction open.
                    if raw.in_transaction:
                        raw.rollback()
                    raise
            finally:
                pooled.close()  # back to the pool

    def checkpoint(self) -> None:
        """SQLite only (elsewhere nothing): copy the write-ahead log into the database file
        as far as readers allow, without taking the writer's turn (a PASSIVE checkpoint;
        writers go on meanwhile). Bulk maintenance calls it, so that the WAL it grows is not
        checkpointed inside some request's COMMIT instead."""
        if self.dialect != "sqlite":
            return
        with self._translate_errors(), self.engine.connect() as connection:
            connection.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)")

    def lock_user(self, session: Session | Connection | DriverConnection, user_id: str) -> None:
        """Create the user's row if missing and hold it locked until the transaction ends.

        On SQLite the `BEGIN IMMEDIATE` of every write transaction already serializes writers;
        on PostgreSQL the row lock serializes one user's writers across processes.
        """
        values = {"id": user_id, "created_at": utcnow()}
        connection = session.connection() if isinstance(session, Session) else session
        if self.dialect == "sqlite":
            connection.execute(_SQLITE_ADD_USER, values)
        elif self.dialect == "postgresql":
            # A user being erased (DELETE /me) still has its row when the insert looks, and
            # no longer when the lock is granted: then insert again, now that it is gone
            # (again, if another erasure got the lock first: erasures are rare, this is bound).
            for _attempt in range(LOCK_USER_ATTEMPTS):
                connection.execute(_pg_add_user(), values)
                if connection.execute(_PG_LOCK_USER, {"id": user_id}).first() is not None:
                    return
            raise StoreUnavailable(f"could not lock user {user_id!r}: it keeps being erased")
        elif (
            connection.execute(
                select(User.id).where(User.id == user_id).with_for_update(), {}
            ).first()
            is None
        ):
            connection.execute(insert(User).values(values), {})

    @contextmanager
    def _translate_errors(self) -> Iterator[None]:
        try:
            yield
        except (OperationalError, InterfaceError) as exc:
            # Unreachable server, locked or read-only file, full disk, a missing table on
            # SQLite: the store is down, not the request wrong.
            raise StoreUnavailable(f"the memory store is unavailable: {exc.orig}") from exc
        except (ProgrammingError, InternalError) as exc:
            # PostgreSQL's undefined table/column (a database never migrated, or damaged) and
            # read-only transactions (a standby) mean the store is down too. Other errors of
            # these kinds are bugs and stay 500s.
            if getattr(exc.orig, "sqlstate", None) not in _UNAVAILABLE_STATES:
                raise
            raise StoreUnavailable(f"the memory store is unavailable: {exc.orig}") from exc

    def empty_wal(self) -> bool:
        """`truncate_wal`; when readers keep it from finishing, it is retried in a thread
        every `WAL_RETRY_SECONDS` until it does, and `wal_pending` is true meanwhile (an
        erasure's text stays in the WAL only as long as a reader holds its snapshot)."""
        # While a retry is under way, readers were holding the WAL a moment ago: no waiting.
        if self.truncate_wal(wait=not self.wal_pending):
            with self._wal_lock:
                self.wal_pending = False  # (the retry thread ends at its next try)
            return True
        with self._wal_lock:
            self.wal_pending = True
            if self._wal_retry is None:
                self._wal_retry = threading.Thread(
                    target=self._retry_truncate, name="kvmem-wal-retry", daemon=True
                )
                self._wal_retry.start()
        return False

    def _retry_truncate(self) -> None:
        while not self._disposed.wait(WAL_RETRY_SECONDS):
            try:
                done = self.truncate_wal(wait=False)
            except StoreUnavailable:
                done = False  # the database is away for now: try again
            if done:
                with self._wal_lock:
                    self.wal_pending = False
                    self._wal_retry = None
                return

    def truncate_wal(self, *, wait: bool = True) -> bool:
        """SQLite: copy the WAL into the database file and empty it, so that deleted text
        (overwritten with zeros there by `secure_delete`) is gone from both files. True when
        done; False when readers kept it from finishing within the busy timeout, or at once
        when `wait` is false (see `empty_wal`, which tries again until it is done).
        Elsewhere nothing: True."""
        if self.dialect != "sqlite":
            return True
        dbapi = self.engine.dialect.dbapi
        assert dbapi is not None  # SQLite's driver module, loaded with the engine
        try:
            with self._translate_errors():
                connection = self.engine.raw_connection()
            try:
                # Outside any transaction (autocommit, see `_sqlite_on_connect`), and between
                # this process's writers; the busy handler waits out other processes' readers.
                with self._writer_turn():
                    cursor = connection.cursor()
                    if not wait:
                        cursor.execute("PRAGMA busy_timeout=0")
                    try:
                        busy, _, _ = cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                    finally:
                        if not wait:  # back to the pool as every connection is
                            cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
                        cursor.close()
            finally:
                connection.close()
        except (dbapi.OperationalError, dbapi.InterfaceError) as exc:
            raise StoreUnavailable(f"the memory store is unavailable: {exc}") from exc
        return not busy

    def ping(self) -> bool:
        """Whether the database answers a trivial query."""
        try:
            with self.reading() as session:
                session.execute(text("SELECT 1"))
        except StoreUnavailable:
            return False
        return True

    def dispose(self) -> None:
        """Close every pooled connection (and stop retrying a WAL checkpoint)."""
        self._disposed.set()
        self.engine.dispose()
