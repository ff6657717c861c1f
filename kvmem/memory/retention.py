"""The sweeps: every replica deletes expired changes, and expires the entries whose
`expires_at` has come, at start and then hourly.

The sweep deletes in short transactions of `SWEEP_BATCH` changes, each in its own worker
thread job, resting as long as a batch took between them (the event loop is served
meanwhile); on SQLite each starts only when no request's write is waiting for the writer
(`WriterTurn`), so no write waits behind the sweep for longer than one batch, however many
changes expired, and each batch checkpoints the WAL it grew outside the writer's turn.

The write path prunes a user's expired changes as they write (`kvmem.memory.history`); this sweep
covers users who stopped writing, so that `memory.history.keep_days` holds for everyone
without a cron job. Entries are expired the same way, `EXPIRE_BATCH` per transaction
(`kvmem.memory.expirations`): reads expire a user's due entries as they find them, and this
sweep does it for users nobody reads. It knows nothing of HTTP; the app's lifespan runs and
cancels it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from kvmem.errors import StoreUnavailable
from kvmem.memory.expirations import EXPIRE_BATCH, expire_due_any
from kvmem.memory.store import MemoryStore

log = logging.getLogger("kvmem.retention")

SWEEP_EVERY_SECONDS = 3600.0
# Expired changes deleted per transaction by the sweep: each holds SQLite's writer ~2 ms.
SWEEP_BATCH = 200


def prune_expired_batch(store: MemoryStore, batch: int = SWEEP_BATCH) -> int:
    """Delete up to `batch` changes older than `keep_days`, of any user, in one short
    transaction that a request's write never waits behind (on SQLite it starts only when
    no other write is waiting); how many. The one query not scoped by user: it is
    maintenance, and reads nothing back."""
    with store.database.writing(background=True) as session:
        deleted = store.history_log.prune_all(session, batch)
    if deleted:
        store.database.checkpoint()
    return deleted


def prune_expired_history(store: MemoryStore, batch: int = SWEEP_BATCH) -> int:
    """Delete every user's changes older than `keep_days`, `batch` per transaction, in this
    thread; how many (`prune_expired_batch` until none is left)."""
    total = 0
    while True:
        deleted = prune_expired_batch(store, batch)
        total += deleted
        if deleted < batch:
            return total


def expire_due_batch(store: MemoryStore, batch: int = EXPIRE_BATCH) -> int:
    """Expire up to `batch` entries whose `expires_at` has come, of any user, in one short
    transaction that a request's write never waits behind (as `prune_expired_batch`); how
    many."""
    with store.database.writing(background=True) as session:
        return expire_due_any(session.connection(), store.history_log, store.clock(), batch)


async def sweep_history(store: MemoryStore, every: float = SWEEP_EVERY_SECONDS) -> None:
    """Delete expired changes and expire due entries now and every `every` seconds, until
    cancelled."""
    while True:
        try:
            deleted = await sweep_once(store)
            expired = await expire_once(store)
        except StoreUnavailable as exc:  # the store is down: try again next time
            log.warning("history sweep skipped, store unavailable: %s", exc)
        except Exception:  # a bug here must not end the sweep for good, nor the server
            log.exception("history sweep failed")
        else:
            if deleted:
                log.info("history sweep deleted %d expired changes", deleted)
            if expired:
                log.info("expiry sweep expired %d entries", expired)
        await asyncio.sleep(every)


async def sweep_once(store: MemoryStore, batch: int = SWEEP_BATCH) -> int:
    """Delete every expired change, `batch` per transaction, each in a worker thread of its
    own, yielding to the event loop between them; how many."""
    return await _in_batches(prune_expired_batch, store, batch)


async def expire_once(store: MemoryStore, batch: int = EXPIRE_BATCH) -> int:
    """Expire every due entry, `batch` per transaction, as `sweep_once` runs; how many."""
    return await _in_batches(expire_due_batch, store, batch)


async def _in_batches(
    step: Callable[[MemoryStore, int], int], store: MemoryStore, batch: int
) -> int:
    loop = asyncio.get_running_loop()
    total = 0
    while True:
        started = loop.time()
        job = loop.run_in_executor(None, step, store, batch)
        try:
            deleted = await asyncio.shield(job)
        except asyncio.CancelledError:
            # Shutting down: let a running batch end before the database is closed under it.
            await asyncio.gather(job, return_exceptions=True)
            raise
        total += deleted
        if deleted < batch:
            return total
        # Rest as long as the batch took: the writer is free at least half of the time, so
        # most writes arriving during a long sweep do not even wait for one batch.
        await asyncio.sleep(loop.time() - started)
