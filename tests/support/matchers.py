"""Values that compare equal to a family of values, for whole-body asserts on bodies with times."""

from __future__ import annotations

import re
from typing import Any

_ISO_UTC = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?Z")


class IsoTime:
    """Equal to any ISO 8601 UTC timestamp string with a `Z` suffix."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and _ISO_UTC.fullmatch(other) is not None

    def __repr__(self) -> str:
        return "<ISO 8601 UTC time>"


ISO_TIME: Any = IsoTime()


def entry(
    key: str, value: str, token_count: int, source: str = "manual", expires_at: Any = None
) -> dict[str, Any]:
    """An entry as the API shows it, with any timestamps (and no expiry, unless given)."""
    return {
        "key": key,
        "value": value,
        "token_count": token_count,
        "created_at": ISO_TIME,
        "updated_at": ISO_TIME,
        "source": source,
        "expires_at": expires_at,
    }
