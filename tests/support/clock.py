"""A clock a test moves by hand, for the store's expiry (`MemoryStore.clock`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

START = datetime(2030, 3, 4, 10, 0, 0, tzinfo=UTC)  # a Monday


class Clock:
    """A clock the test moves (the store's, for expiry): `START` until advanced."""

    def __init__(self, now: datetime = START) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)
