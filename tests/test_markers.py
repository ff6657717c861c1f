"""The marker filter (kvmem/agent/markers.py): markers never leak, look-alikes pass unchanged, at
any chunk boundaries."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from kvmem.agent.markers import Marker, MarkerFilter, marker_limit, strip_markers

LIMIT = marker_limit(200)

# Text that only looks like a marker; no concatenation of these spells `[MEMORY:` or
# `[FORGET:` (no piece starts with a letter of an opener's tail or with `:`).
LOOK_ALIKES = [
    "[1, 2]",
    "[MEMO]",
    "[MEMORY]",
    "[FORGET]",
    "[text](https://example.com)",
    "[M",
    "[FORG",
    "[MEMORY",
    "[MEMORY ",
    " MEMORY: x = y]",
    "]",
    " ",
    "\n",
    "hello",
    "wörld 🎉",
    "= ",
    "[",
    "[]",
]
KEYS = st.sampled_from(["name", "city", "Bad Key", "a_1"])
VALUES = st.text(
    alphabet=st.characters(blacklist_characters="]", blacklist_categories=("Cs",)), max_size=30
).map(str.strip)


@st.composite
def markers(draw: st.DrawFn) -> tuple[str, Marker]:
    key = draw(KEYS)
    if draw(st.booleans()):
        value = draw(VALUES)
        spaces = draw(st.sampled_from(["", " ", "  "]))
        return f"[MEMORY:{spaces}{key}{spaces}={spaces}{value}]", Marker("set", key, value)
    return f"[FORGET: {key}]", Marker("delete", key)


@st.composite
def replies(draw: st.DrawFn) -> tuple[str, str, list[Marker]]:
    """A reply of look-alikes and markers (perhaps a cut marker at the end), the text a client
    must see and the markers written."""
    parts = draw(st.lists(st.one_of(st.sampled_from(LOOK_ALIKES), markers()), max_size=12))
    cut = draw(st.sampled_from(["", "", "[MEMORY: city = Pa", "[FORGET:", "[FORGET: na"]))
    reply, shown, written = "", "", []
    marker_last = False
    for part in parts:
        if isinstance(part, tuple):
            reply += part[0]
            written.append(part[1])
            marker_last = True
        else:
            reply += part
            shown += part
            marker_last = marker_last and not part.strip()
    reply += cut
    if marker_last or cut:
        shown = shown.rstrip()
    return reply, shown, written


def run(chunks: list[str]) -> tuple[str, list[Marker]]:
    markers_ = MarkerFilter(LIMIT)
    shown = "".join(markers_.feed(chunk) for chunk in chunks) + markers_.finish()
    return shown, markers_.markers


def split(text: str, cuts: list[int]) -> list[str]:
    bounds = [0, *sorted(set(cuts)), len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


@settings(max_examples=250)
@given(replies(), st.lists(st.integers(0, 400), max_size=20))
def test_markers_never_leak_at_any_chunk_boundaries(
    reply: tuple[str, str, list[Marker]], cuts: list[int]
) -> None:
    text, shown, written = reply
    chunks = split(text, [c for c in cuts if c <= len(text)])
    assert run(chunks) == (shown, written)
    assert run(list(text)) == (shown, written)  # one character at a time


def test_a_reply_split_at_every_set_of_boundaries() -> None:
    text = "Noted [1]. [MEMORY: city = Paris][FORGET: name]"
    expected = ("Noted [1].", [Marker("set", "city", "Paris"), Marker("delete", "name")])
    for size in range(4):  # every split into at most four chunks
        for cuts in itertools.combinations(range(1, len(text)), size):
            assert run(split(text, list(cuts))) == expected


def test_look_alikes_are_passed_on_as_soon_as_they_are_ruled_out() -> None:
    markers_ = MarkerFilter(LIMIT)
    assert [markers_.feed(c) for c in ["See [", "1, 2", "] and [M", "EMO", "] [MEMORY", "]"]] == [
        "See",
        " [1, 2",
        "] and",
        "",
        " [MEMO]",
        " [MEMORY]",
    ]
    assert markers_.feed("[text](u)") == "[text](u)"
    assert (markers_.finish(), markers_.markers) == ("", [])


def test_text_that_cannot_begin_a_marker_is_not_held() -> None:
    markers_ = MarkerFilter(LIMIT)
    assert markers_.feed("Hello") == "Hello"
    assert markers_.feed(", world!") == ", world!"
    assert markers_.feed(" [MEMORY: a") == ""  # the space waits: it may end the reply
    assert markers_.feed(" = b] Bye.") == "  Bye."


def test_a_candidate_longer_than_the_limit_is_released_as_text() -> None:
    markers_ = MarkerFilter(30)
    assert markers_.feed("[MEMORY: k = ") == ""
    assert markers_.feed("x" * 16) == ""  # with its `]` it would be 30 characters
    assert markers_.feed("x") == "[MEMORY: k = " + "x" * 17
    assert markers_.feed("]") == "]"
    assert markers_.feed("[MEMORY: k = " + "x" * 16 + "]") == ""
    assert markers_.markers == [Marker("set", "k", "x" * 16)]


def test_the_limit_fits_the_longest_key_and_a_value_of_char_limit_characters() -> None:
    """`marker_limit(charLimit)` must leave room for the opener, a 128-character key (the
    longest a key may be), " = " and a value as long as `charLimit` allows, spaced loosely."""
    key, value = "k" * 128, "v" * 200
    for spaced in (f"[MEMORY: {key} = {value}]", f"[MEMORY:  {key}  =  {value}  ]"):
        markers_ = MarkerFilter(marker_limit(200))
        shown = "".join(markers_.feed(spaced[i : i + 7]) for i in range(0, len(spaced), 7))
        assert (shown + markers_.finish(), markers_.markers) == ("", [Marker("set", key, value)])
    forget = f"[FORGET:  {key}  ]"
    assert strip_markers(forget, marker_limit(0)) == ("", [Marker("delete", key)], False)


def test_a_marker_cut_off_at_the_end_is_dropped_and_not_collected() -> None:
    assert strip_markers("Sure.\n\n[MEMORY: name = Bo", LIMIT) == ("Sure.", [], True)
    assert strip_markers("Cut at [MEM", LIMIT) == ("Cut at [MEM", [], False)


def test_markers_leave_no_trailing_blank_lines_but_other_whitespace_stays() -> None:
    assert strip_markers("Done.\n\n[FORGET: a]\n[FORGET: b]\n", LIMIT) == (
        "Done.",
        [Marker("delete", "a"), Marker("delete", "b")],
        False,
    )
    assert strip_markers("Line\n", LIMIT) == ("Line\n", [], False)
    assert strip_markers("A [FORGET: a] B\n", LIMIT) == ("A  B\n", [Marker("delete", "a")], False)


def test_a_set_marker_without_a_value_is_collected_with_an_error() -> None:
    assert strip_markers("ok [MEMORY: name]", LIMIT) == (
        "ok",
        [Marker("set", "name", error="a [MEMORY: ...] marker needs 'key = value'")],
        False,
    )
    assert strip_markers("[MEMORY: note = a = b]", LIMIT)[1] == [Marker("set", "note", "a = b")]
