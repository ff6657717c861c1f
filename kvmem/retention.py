"""The history sweep: every replica deletes expired changes at start and then hourly.

The write path prunes a user's expired changes as they write (`kvmem.history`); this sweep
covers users who stopped writing, so that `memory.history.keep_days` holds for everyone
without a cron job. It knows nothing of HTTP; the app's lifespan runs and cancels it.
"""

from __future__ import annotations

import asyncio
import logging

from kvmem.errors import StoreUnavailable
from kvmem.store import MemoryStore

log = logging.getLogger("kvmem.retention")

SWEEP_EVERY_SECONDS = 3600.0


async def sweep_history(store: MemoryStore, every: float = SWEEP_EVERY_SECONDS) -> None:
    """Delete expired changes now and every `every` seconds, until cancelled."""
    loop = asyncio.get_running_loop()
    while True:
        job = loop.run_in_executor(None, store.prune_expired_history)
        try:
            deleted = await asyncio.shield(job)
        except asyncio.CancelledError:
            # Shutting down: let a running sweep end before the database is closed under it.
            await asyncio.gather(job, return_exceptions=True)
            raise
        except StoreUnavailable as exc:  # the store is down: try again next time
            log.warning("history sweep skipped, store unavailable: %s", exc)
        except Exception:  # a bug here must not end the sweep for good, nor the server
            log.exception("history sweep failed")
        else:
            if deleted:
                log.info("history sweep deleted %d expired changes", deleted)
        await asyncio.sleep(every)
