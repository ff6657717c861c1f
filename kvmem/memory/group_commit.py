"""Group commit for SQLite: writes queued in the same moment share one transaction.

SQLite has one writer at a time, and each write transaction pays for its own `BEGIN
IMMEDIATE` and `COMMIT` while holding the process's writer lock. `GroupCommit` runs one
writer thread that takes whatever writes are queued when it looks (at most `max_batch`; it
never waits for more, so a lone write is not delayed) and runs them in one transaction, each
inside its own SAVEPOINT: a write refused by a rule (`MemoryFull`, a bad key) is rolled back
to its savepoint and fails alone, and the writes after it see what the ones before it did.
Every caller is answered only after the COMMIT, so a crash loses only unanswered writes. On
a database error anywhere in a batch (a statement or the COMMIT) the batch is rolled back
and each of its writes is run again in a transaction of its own, so each gets its own result.

A write is a `Prepare`: called in the writer thread outside any transaction (validation,
token counting; an error there answers the write at once), it returns the function that
writes on a connection (`Database.writing_prebuilt`'s: the bare sqlite3 connection, on
which a write runs prebuilt Core statements only). This module knows nothing of memory
entries; `MemoryStore` uses it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError

from kvmem.db.driver_connection import DriverConnection
from kvmem.db.engine import Database
from kvmem.errors import StoreUnavailable

Write = Callable[[Connection | DriverConnection], Any]
Prepare = Callable[[], Write]
MAX_BATCH = 64


@dataclass
class _Job:
    prepare: Prepare
    future: Future[Any] = field(default_factory=Future)


_STOP = object()
_SAVEPOINT = "SAVEPOINT kvmem_write"
_ROLLBACK_TO = "ROLLBACK TO kvmem_write"
_RELEASE = "RELEASE kvmem_write"


class GroupCommit:
    """A writer thread that commits queued writes in batches (see the module docstring)."""

    def __init__(
        self,
        database: Database,
        max_batch: int = MAX_BATCH,
        on_batch: Callable[[int], None] | None = None,
    ) -> None:
        self.database = database
        self.max_batch = max_batch
        self._on_batch = on_batch  # told each batch's size before it runs (tests, metrics)
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()  # orders `submit`'s puts before `stop`'s sentinel
        self._running = False
        self._thread: threading.Thread | None = None

    @property
    def pending(self) -> int:
        """How many writes are queued and not yet taken by the writer thread."""
        return self._queue.qsize()

    def start(self) -> None:
        """Start the writer thread."""
        with self._lock:
            if self._running:
                return
            self._thread = threading.Thread(target=self._serve, name="kvmem-writer", daemon=True)
            self._thread.start()
            self._running = True

    def stop(self) -> None:
        """Answer every write queued so far, then end the writer thread; later writes are
        refused by `submit` (their callers run them themselves)."""
        with self._lock:
            if not self._running:
                return
            self._running = False
            self._queue.put(_STOP)
        assert self._thread is not None
        self._thread.join()

    def submit(self, prepare: Prepare) -> Future[Any] | None:
        """Queue a write; its future holds the write's result once committed, or its error.
        None when the writer is not running or this is the writer thread itself: the caller
        then runs the write on its own."""
        if threading.current_thread() is self._thread:
            return None
        job = _Job(prepare)
        with self._lock:
            if not self._running:
                return None
            self._queue.put(job)
        return job.future

    def _serve(self) -> None:
        stopping = False
        while not stopping:
            first = self._queue.get()
            if first is _STOP:
                return
            jobs = [first]
            # Only what is already queued: a lone write is never held back for company.
            while len(jobs) < self.max_batch:
                try:
                    job = self._queue.get_nowait()
                except queue.Empty:
                    break
                if job is _STOP:
                    stopping = True
                    break
                jobs.append(job)
            try:
                self._run(jobs)
            except BaseException as exc:  # a bug: no caller is left waiting for ever
                for job in jobs:
                    if not job.future.done():
                        job.future.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise

    def _run(self, jobs: list[_Job]) -> None:
        ready: list[tuple[_Job, Write]] = []
        for job in jobs:
            if not job.future.set_running_or_notify_cancel():
                continue
            try:
                ready.append((job, job.prepare()))
            except Exception as exc:
                job.future.set_exception(exc)
        if self._on_batch is not None and ready:
            self._on_batch(len(ready))
        if len(ready) == 1:
            self._alone(*ready[0])
        elif ready:
            self._batch(ready)

    def _batch(self, ready: list[tuple[_Job, Write]]) -> None:
        outcomes: list[tuple[Any, Exception | None]] = []
        try:
            with self.database.writing_prebuilt() as connection:
                # On the bare sqlite3 connection (`kvmem.db.driver_connection`): through
                # SQLAlchemy, its statements and nested transactions cost most of a write.
                assert isinstance(connection, DriverConnection)
                for _job, write in ready:
                    connection.run(_SAVEPOINT)
                    try:
                        result = write(connection)
                    except (SQLAlchemyError, StoreUnavailable):
                        raise
                    except Exception as exc:  # a refusal: this write only
                        connection.run(_ROLLBACK_TO)
                        connection.run(_RELEASE)
                        outcomes.append((None, exc))
                        continue
                    connection.run(_RELEASE)
                    outcomes.append((result, None))
        except Exception:
            # The database failed somewhere: nothing of the batch is committed. Each write
            # alone gets its own true result (most often all but one succeed).
            for job, write in ready:
                self._alone(job, write)
            return
        for (job, _write), (result, error) in zip(ready, outcomes, strict=True):
            if error is None:
                job.future.set_result(result)
            else:
                job.future.set_exception(error)

    def _alone(self, job: _Job, write: Write) -> None:
        try:
            with self.database.writing_prebuilt() as connection:
                result = write(connection)
        except Exception as exc:
            job.future.set_exception(exc)
        else:
            job.future.set_result(result)
