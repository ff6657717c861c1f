"""The write rules every path applies (REST, CLI, import, the memory agent): key format,
`validKeys` and `charLimit`. `tokenLimit` needs the stored total and lives in the store.

With `memory.scopes` a user's memory has layers: their own (scope `""`, which every chat
sees) and one per scope, each with its own rules (`MemoryRules.layer`). A key belongs to one
layer, so the agent's writes route by key (`MemoryRules.scope_of_write`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvmem.config import KEY_PATTERN, RESERVED_KEYS, MemoryConfig, reserved_keys_text
from kvmem.errors import BadRequest, EmptyValue, InvalidKey, KeyNotAllowed, ValueTooLong

OWN = ""  # the scope of the person's own layer (null in the API)
SCOPE_PATTERN = re.compile(r"[A-Za-z0-9._:@/-]{1,128}")


@dataclass(frozen=True)
class MemoryRules:
    """What a key and a value must satisfy before they are stored (in one layer)."""

    valid_keys: tuple[str, ...] | None = None
    char_limit: int = 10_000
    token_limit: int | None = None
    # The scoped layer's rules (None: no `memory.scopes`); their keys are not the own layer's.
    scoped: MemoryRules | None = None
    # On the scoped layer: whether a scoped turn sees and writes its scope only.
    isolated: bool = False
    # On the scoped layer: how many scopes holding entries one user may have (None: any).
    max_scopes: int | None = None

    @classmethod
    def from_config(cls, memory: MemoryConfig) -> MemoryRules:
        """The rules of a `memory:` block (the person's own layer, holding the scoped one)."""
        scopes = memory.scopes
        scoped = None
        if scopes is not None:
            scoped = cls(
                valid_keys=tuple(scopes.valid_keys),
                char_limit=scopes.char_limit or memory.char_limit,
                token_limit=scopes.token_limit
                if scopes.token_limit is not None
                else memory.token_limit,
                isolated=scopes.isolated,
                max_scopes=scopes.max_scopes,
            )
        return cls(
            valid_keys=tuple(memory.valid_keys) if memory.valid_keys else None,
            char_limit=memory.char_limit,
            token_limit=memory.token_limit,
            scoped=scoped,
        )

    def scope(self, name: str | None) -> str:
        """The scope a request named (None: the person's own layer, `OWN`), if it is well
        formed and this server keeps scopes; else `BadRequest`."""
        if name is None:
            return OWN
        if self.scoped is None:
            raise BadRequest(
                "this server keeps no scopes (memory.scopes is not configured); send no scope"
            )
        if not SCOPE_PATTERN.fullmatch(name):
            raise BadRequest(
                "invalid scope: a scope is 1-128 characters of A-Z, a-z, 0-9 and . _ : @ / -"
            )
        return name

    def layer(self, scope: str) -> MemoryRules:
        """The rules of the layer `scope` (`OWN`: these)."""
        if scope == OWN:
            return self
        if self.scoped is None:  # `scope` checks this first; a caller that did not is wrong
            raise BadRequest("this server keeps no scopes (memory.scopes is not configured)")
        return self.scoped

    def is_scoped_key(self, key: str) -> bool:
        """Whether `key` is kept per scope (one of `memory.scopes.validKeys`)."""
        return self.scoped is not None and key in (self.scoped.valid_keys or ())

    def scope_of_write(self, key: str, turn_scope: str) -> str:
        """The layer an agent write of `key` goes to in a turn of `turn_scope`: a scoped key
        to the turn's scope, any other key to the person's own; `KeyNotAllowed` when the turn
        cannot write there (a scoped key in an unscoped turn, an own key in an isolated one)."""
        scoped = self.scoped
        if scoped is not None and key in (scoped.valid_keys or ()):
            if turn_scope == OWN:
                raise KeyNotAllowed(
                    f"key {key!r} is kept per scope and this chat names no scope; "
                    f"keys for this chat: {self._keys_text(self)}",
                    valid_keys=list(self.valid_keys or ()),
                )
            return turn_scope
        if turn_scope != OWN and scoped is not None and scoped.isolated:
            raise KeyNotAllowed(
                f"key {key!r} is not allowed: this chat's scope is isolated; "
                f"keys for this chat: {self._keys_text(scoped)}",
                valid_keys=list(scoped.valid_keys or ()),
            )
        return OWN

    @staticmethod
    def _keys_text(rules: MemoryRules) -> str:
        return ", ".join(rules.valid_keys) if rules.valid_keys else "any key not kept per scope"

    def check_key_format(self, key: str) -> str:
        """`key` if it is well formed (the rule for reads too), else `InvalidKey`."""
        if not KEY_PATTERN.fullmatch(key) or key in RESERVED_KEYS:
            raise InvalidKey(
                f"invalid key {key!r}: a key is 1-128 characters of a-z, 0-9 and _, "
                f"starts with a letter, and is not {reserved_keys_text()}"
            )
        return key

    def check_key(self, key: str) -> str:
        """`key` if it may be written: well formed and, when set, one of `validKeys` (and on
        the own layer of a server with scopes, not a scoped key)."""
        self.check_key_format(key)
        if self.is_scoped_key(key):
            assert self.scoped is not None and self.scoped.valid_keys is not None
            raise KeyNotAllowed(
                f"key {key!r} is kept per scope: name the scope to write it "
                f"(scoped keys: {', '.join(self.scoped.valid_keys)})",
                valid_keys=list(self.scoped.valid_keys),
            )
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
