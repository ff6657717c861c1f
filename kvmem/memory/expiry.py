"""When a memory expires: reading `expires_at` and `expires_in` as people and models write them.

`expires_at` is an RFC 3339 date-time (a time without offset is UTC) or a date
(`YYYY-MM-DD`), which means the end of that day in UTC: "until Friday" stays true all Friday.
`expires_in` is seconds, or a count with a unit: `"90m"`, `"12h"`, `"3d"`, `"2w"` (and `"45s"`).
A moment not after now is refused: an entry that expires at once is no memory. Every refusal
is `BadRequest`, whose message says what is accepted. It touches no database.
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, time, timedelta

from kvmem.errors import BadRequest

# The furthest ahead an entry may expire: past it a date is a typo, and no datetime overflows.
MAX_AHEAD = timedelta(days=36_600)
END_OF_DAY = time(23, 59, 59, tzinfo=UTC)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}
_DURATION = re.compile(r"([0-9]{1,12})\s*([smhdw]?)")
_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
ACCEPTED_AT = "a date (YYYY-MM-DD, meaning the end of that day, UTC) or an RFC 3339 date-time"
ACCEPTED_IN = 'seconds, or a number with a unit: "90m", "12h", "3d", "2w"'


def parse_expires_at(text: str, field: str = "expires_at") -> datetime:
    """`text` as an aware UTC datetime: a date is the last second of that day."""
    cleaned = text.strip()
    try:
        if _DATE.fullmatch(cleaned):
            return datetime.combine(date.fromisoformat(cleaned), END_OF_DAY)
        moment = datetime.fromisoformat(cleaned.replace("z", "Z"))
    except ValueError as exc:
        raise BadRequest(f"{field} {text!r} is not {ACCEPTED_AT}") from exc
    if "T" not in cleaned.upper() and " " not in cleaned:
        raise BadRequest(f"{field} {text!r} is not {ACCEPTED_AT}")
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def parse_expires_in(value: int | str, field: str = "expires_in") -> timedelta:
    """`value` (seconds, or `"3d"` and the like) as a duration of at least one second."""
    if isinstance(value, bool):
        raise BadRequest(f"{field} must be {ACCEPTED_IN}, not a boolean")
    if isinstance(value, int):
        seconds = value
    else:
        match = _DURATION.fullmatch(value.strip().lower())
        if match is None:
            raise BadRequest(f"{field} {value!r} is not {ACCEPTED_IN}")
        seconds = int(match.group(1)) * _UNITS[match.group(2) or "s"]
    if seconds < 1:
        raise BadRequest(f"{field} must be at least one second")
    if seconds > MAX_AHEAD.total_seconds():
        raise BadRequest(f"{field} is more than {MAX_AHEAD.days} days")
    return timedelta(seconds=seconds)


def check_future(moment: datetime, now: datetime, field: str = "expires_at") -> datetime:
    """`moment` when it is after `now` (and within `MAX_AHEAD`), else `BadRequest`."""
    if moment <= now:
        raise BadRequest(
            f"{field} {moment.isoformat()} is not in the future (now is {now.isoformat()})"
        )
    if moment - now > MAX_AHEAD:
        raise BadRequest(f"{field} {moment.isoformat()} is more than {MAX_AHEAD.days} days ahead")
    return moment


def expiry_of(
    expires_at: str | None, expires_in: int | str | None, now: datetime
) -> datetime | None:
    """The moment a write's entry expires (None: never), from at most one of the two fields."""
    if expires_at is not None and expires_in is not None:
        raise BadRequest("give expires_at or expires_in, not both")
    if expires_in is not None:
        return now + parse_expires_in(expires_in)
    if expires_at is not None:
        return check_future(parse_expires_at(expires_at), now)
    return None
