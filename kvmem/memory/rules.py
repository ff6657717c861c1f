"""The write rules every path applies (REST, CLI, import, the memory agent): key format,
`validKeys` and `charLimit`. `tokenLimit` needs the stored total and lives in the store."""

from __future__ import annotations

from dataclasses import dataclass

from kvmem.config import KEY_PATTERN, RESERVED_KEYS, MemoryConfig, reserved_keys_text
from kvmem.errors import BadRequest, EmptyValue, InvalidKey, KeyNotAllowed, ValueTooLong


@dataclass(frozen=True)
class MemoryRules:
    """What a key and a value must satisfy before they are stored."""

    valid_keys: tuple[str, ...] | None = None
    char_limit: int = 10_000
    token_limit: int | None = None

    @classmethod
    def from_config(cls, memory: MemoryConfig) -> MemoryRules:
        """The rules of a `memory:` block."""
        return cls(
            valid_keys=tuple(memory.valid_keys) if memory.valid_keys else None,
            char_limit=memory.char_limit,
            token_limit=memory.token_limit,
        )

    def check_key_format(self, key: str) -> str:
        """`key` if it is well formed (the rule for reads too), else `InvalidKey`."""
        if not KEY_PATTERN.fullmatch(key) or key in RESERVED_KEYS:
            raise InvalidKey(
                f"invalid key {key!r}: a key is 1-128 characters of a-z, 0-9 and _, "
                f"starts with a letter, and is not {reserved_keys_text()}"
            )
        return key

    def check_key(self, key: str) -> str:
        """`key` if it may be written: well formed and, when set, one of `validKeys`."""
        self.check_key_format(key)
        if self.valid_keys is not None and key not in self.valid_keys:
            raise KeyNotAllowed(
                f"key {key!r} is not allowed; valid keys: {', '.join(self.valid_keys)}",
                valid_keys=list(self.valid_keys),
            )
        return key

    def clean_value(self, value: str) -> str:
        """`value` stripped, if it is non-empty and within `charLimit`."""
        value = value.strip()
        if "\x00" in value:
            raise BadRequest("the value contains a NUL character, which cannot be stored")
        if not value:
            raise EmptyValue("the value is empty")
        if len(value) > self.char_limit:
            raise ValueTooLong(
                f"the value is {len(value)} characters; the limit is {self.char_limit}",
                char_limit=self.char_limit,
                length=len(value),
            )
        return value
