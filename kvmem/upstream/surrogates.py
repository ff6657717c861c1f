"""Surrogates in a model's answer: a pair split across streamed chunks joined, a lone one replaced.

JSON may write a character outside the Basic Multilingual Plane as an escaped UTF-16 pair
(`"\\ud83d\\ude00"`). Python's `json` joins a pair inside one string but keeps a lone half
(`"\\ud800"`) as a lone surrogate, which no UTF-8 encoder takes: written to a client it
raised, the route answered 500 or its stream was cut. Some servers (JavaScript ones, which
cut strings by UTF-16 unit) also split a pair across two chunks of a stream. An answer is
data from outside, so both clients pass each one through here before anyone reads it:

- `clean_answer` replaces every lone surrogate in a whole answer (any string, keys too)
  with U+FFFD;
- `ChunkSurrogates`, one per stream, does the same for each chunk, and first joins a pair
  split across chunks: a high surrogate that ends a delta's text field (`content`,
  `reasoning_content`, ...) is held until the next chunk of the same choice (`index`) says
  whether its low half follows. Pairs split inside tool-call arguments are not joined (each
  half becomes U+FFFD); no known server splits those.

Each returns how many surrogates it replaced, which the clients count in
`kvmem_upstream_lone_surrogates_total`. It knows nothing of HTTP or of the clients.
"""

from __future__ import annotations

import re
from typing import Any

REPLACEMENT = "\ufffd"
_SURROGATE = re.compile("[\ud800-\udfff]")
_HIGH = ("\ud800", "\udbff")
# An answer's raw bytes that may hold a surrogate: an escaped one, or one written as the
# three bytes UTF-8 forbids (ED A0-BF xx), which `json.loads` of bytes lets through.
_MAYBE_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")


def may_hold_surrogates(raw: bytes) -> bool:
    """Whether an answer's (or an event's) raw JSON may decode to a surrogate; False means
    it cannot, so its parsed form need not be walked."""
    # Three substring scans (memchr-fast) first: the regex costs ~2 us on a typical chunk.
    if b"\\ud" not in raw and b"\\uD" not in raw and b"\xed" not in raw:
        return False
    return _MAYBE_SURROGATE.search(raw) is not None


def clean_text(text: str) -> tuple[str, int]:
    """`text` with each adjacent high+low pair joined into its character and each lone
    surrogate replaced by U+FFFD, and how many were replaced."""
    if text.isascii() or _SURROGATE.search(text) is None:
        return text, 0
    cleaned = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return cleaned, cleaned.count(REPLACEMENT) - text.count(REPLACEMENT)


def clean_answer(value: Any) -> tuple[Any, int]:
    """`value` (a parsed answer: dicts, lists, strings, numbers) with every lone surrogate
    replaced, dicts and lists changed in place, and how many were replaced."""
    if isinstance(value, str):
        return clean_text(value)
    count = 0
    if isinstance(value, dict):
        renamed: list[tuple[str, str]] = []
        for key, item in value.items():
            cleaned, replaced = clean_answer(item)
            if cleaned is not item:  # a string changed (a pair joined, a half replaced)
                value[key] = cleaned
            count += replaced
            if isinstance(key, str):
                new_key, replaced = clean_text(key)
                if new_key is not key:
                    renamed.append((key, new_key))
                    count += replaced
        for key, new_key in renamed:
            value[new_key] = value.pop(key)
    elif isinstance(value, list):
        for position, item in enumerate(value):
            cleaned, replaced = clean_answer(item)
            if cleaned is not item:
                value[position] = cleaned
            count += replaced
    return value, count


class ChunkSurrogates:
    """One stream's surrogates: `clean` each chunk in order, then `finish` once."""

    def __init__(self) -> None:
        # (choice index, delta field) -> the high surrogate that ended its last text.
        self._held: dict[tuple[Any, str], str] = {}
        self._last: dict[str, Any] = {}

    def clean(self, chunk: dict[str, Any], suspect: bool = True) -> int:
        """Clean `chunk` in place; how many surrogates were replaced. `suspect=False` (the
        raw event held none, see `may_hold_surrogates`) skips the walk unless a high
        surrogate is held."""
        self._last = chunk
        if not suspect and not self._held:
            return 0
        count = 0
        choices = chunk.get("choices")
        if isinstance(choices, list):
            for position, choice in enumerate(choices):
                if isinstance(choice, dict) and isinstance(choice.get("delta"), dict):
                    count += self._clean_delta(choice.get("index", position), choice["delta"])
        return count + clean_answer(chunk)[1]

    def _clean_delta(self, index: Any, delta: dict[str, Any]) -> int:
        count = 0
        try:
            hash(index)
        except TypeError:
            index = repr(index)
        for held_index, name in list(self._held):
            if held_index == index and not isinstance(delta.get(name), str):
                # The pair was not continued: the held half is lone.
                del self._held[held_index, name]
                delta[name] = REPLACEMENT
                count += 1
        for name, text in delta.items():
            if not isinstance(text, str):
                continue
            high = self._held.pop((index, name), "")
            text = high + text
            if text and _HIGH[0] <= text[-1] <= _HIGH[1]:
                self._held[index, name] = text[-1]
                text = text[:-1]
            delta[name], replaced = clean_text(text)
            count += replaced
        return count

    def finish(self) -> tuple[dict[str, Any] | None, int]:
        """After the last chunk: a chunk carrying U+FFFD for each high surrogate still held
        (the stream ended before its low half), or None, and how many that is."""
        if not self._held:
            return None, 0
        deltas: dict[Any, dict[str, str]] = {}
        for (index, name), _ in self._held.items():
            deltas.setdefault(index, {})[name] = REPLACEMENT
        held, self._held = len(self._held), {}
        chunk: dict[str, Any] = {
            name: self._last[name]
            for name in ("id", "object", "created", "model")
            if name in self._last
        }
        chunk["choices"] = [
            {"index": index, "delta": delta, "finish_reason": None}
            for index, delta in deltas.items()
        ]
        return chunk, held
