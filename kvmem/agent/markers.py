"""Memory markers in a model's reply: `[MEMORY: key = value]` and `[FORGET: key]`.

With `memory.agent.placement: inline` the main model writes memory itself by ending its reply
with markers. `MarkerFilter` is fed the reply as it arrives, in chunks of any size, and gives
back the text a client may see; the markers it cut out are collected in `markers`. It knows
nothing of HTTP, chunks' JSON shapes or the store: kvmem/chat/main_call.py feeds it, and
kvmem/agent/inline_writes.py applies what it collected, with every check of a tool call.

The rules:
- A marker begins with exactly `[MEMORY:` or `[FORGET:` and ends at the first `]`; a value
  therefore cannot hold `]`. `[MEMORY: k = v]` sets `k` (the value is everything after the
  first `=`, both sides stripped); `[FORGET: k]` deletes it. A `[MEMORY:` marker without `=`
  is still cut out, collected with an error, and never applied.
- Only text that could still begin a marker is held back: a trailing `[`, `[M`, ... up to the
  opener, and from the opener on until its `]`. Everything else is passed on at once, and a
  look-alike (`[1, 2]`, `[MEMO]`, `[MEMORY]`, a Markdown link) as soon as a character rules
  the marker out.
- A held candidate is released as text once it could no longer fit `max_chars` (a marker
  longer than that is not one), so a stray opener cannot hold the rest of a reply back.
- Whitespace at the end of the visible text is held too, and dropped if only markers (and
  whitespace) follow it to the end of the reply, so markers leave no blank lines behind.
- At the end of the reply a marker that was opened and never closed (cut by `max_tokens` or
  by a client that left) is dropped, text and all, and never applied; a held partial opener
  (`[MEM`) is shown, since it never became a marker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

SET_OPENER = "[MEMORY:"
FORGET_OPENER = "[FORGET:"
OPENERS = (SET_OPENER, FORGET_OPENER)
MARKER_CLOSE = "]"
# Room for the opener, a 128-character key, " = " and spaces, beyond the value's charLimit.
MARKER_OVERHEAD = 192


def marker_limit(char_limit: int) -> int:
    """The longest marker (opener to `]`) that can hold a value of `char_limit` characters."""
    return char_limit + MARKER_OVERHEAD


@dataclass(frozen=True)
class Marker:
    """One marker cut out of a reply: set (`value` given) or delete; `error` when malformed."""

    op: Literal["set", "delete"]
    key: str
    value: str | None = None
    error: str | None = None


def parse_marker(text: str) -> Marker:
    """The marker `text` spells (opener to `]`, both included)."""
    body = text[len(SET_OPENER) : -len(MARKER_CLOSE)]
    if text.startswith(FORGET_OPENER):
        return Marker("delete", body.strip())
    key, equals, value = body.partition("=")
    if not equals:
        return Marker("set", body.strip(), error="a [MEMORY: ...] marker needs 'key = value'")
    return Marker("set", key.strip(), value.strip())


class MarkerFilter:
    """Cuts markers out of a reply fed in chunks; `markers` holds those cut so far."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self.markers: list[Marker] = []
        self.cut = False  # a marker was left open at the end of the reply
        self._held = ""  # a candidate marker, from its `[`
        self._spaces = ""  # whitespace at the end of the visible text, not passed on yet
        self._marker_last = False  # a marker came after the last visible text

    def feed(self, text: str) -> str:
        """The part of the reply so far that a client may see now, given its next chunk."""
        out: list[str] = []
        buffer, self._held = self._held + text, ""
        start = 0
        while True:
            bracket = buffer.find("[", start)
            if bracket < 0:
                self._visible(buffer[start:], out)
                break
            self._visible(buffer[start:bracket], out)
            end = self._marker_end(buffer, bracket)
            if end is None:  # may still become a marker
                self._held = buffer[bracket:]
                break
            if end == bracket:  # not a marker: the bracket is text
                self._visible("[", out)
                start = bracket + 1
                continue
            self.markers.append(parse_marker(buffer[bracket:end]))
            self._marker_last = True
            start = end
        return "".join(out)

    def finish(self) -> str:
        """The rest of the reply a client may see, once the reply has ended."""
        out: list[str] = []
        if self._held.startswith(OPENERS):
            self.cut = True
            self._marker_last = True
        else:
            self._visible(self._held, out)
        self._held = ""
        if not self._marker_last:
            out.append(self._spaces)
        self._spaces = ""
        return "".join(out)

    def _marker_end(self, buffer: str, start: int) -> int | None:
        """Where the marker at `start` ends; `start` when there is none, None when the text
        so far cannot tell."""
        rest = len(buffer) - start
        for opener in OPENERS:
            if buffer.startswith(opener, start):
                close = buffer.find(MARKER_CLOSE, start + len(opener), start + self.max_chars)
                if close >= 0:
                    return close + 1
                return None if rest < self.max_chars else start
            if rest < len(opener) and opener.startswith(buffer[start:]):
                return None
        return start

    def _visible(self, text: str, out: list[str]) -> None:
        """Pass `text` on, holding back the whitespace it ends with."""
        if not text:
            return
        shown = text.rstrip()
        if not shown:
            self._spaces += text
            return
        out.append(self._spaces + shown)
        self._spaces = text[len(shown) :]
        self._marker_last = False


def strip_markers(text: str, max_chars: int) -> tuple[str, list[Marker], bool]:
    """A whole reply without its markers, the markers, and whether one was left open."""
    markers = MarkerFilter(max_chars)
    shown = markers.feed(text) + markers.finish()
    return shown, markers.markers, markers.cut
