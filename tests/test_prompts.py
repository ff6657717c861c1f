"""The memory block (escaping, order, lowered limits) and the memory agent's input."""

from __future__ import annotations

import re
import sys
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from kvmem.agent.prompts import (
    _ESCAPES,
    _NEEDS_ESCAPE,
    BLOCK_CLOSE,
    BLOCK_OPEN,
    BLOCK_PREAMBLE,
    DEFAULT_AGENT_INSTRUCTIONS,
    ChatLine,
    entries_within,
    escape_value,
    render_agent_input,
    render_chat,
    render_memory_block,
    with_memory,
)
from kvmem.entries import Entry
from tests.support.hostile import HOSTILE_VALUES, unescape

MARCH_1 = datetime(2026, 3, 1, 8, 30, tzinfo=UTC)
MARCH_2 = datetime(2026, 3, 2, 23, 59, 59, tzinfo=UTC)


def entry(key: str, value: str, tokens: int = 1, updated_at: datetime = MARCH_1) -> Entry:
    return Entry(key, value, tokens, "manual", updated_at, updated_at)


def test_no_entries_no_block():
    assert render_memory_block([]) == ""
    assert with_memory("You are a helpful assistant.", "") == "You are a helpful assistant."


def test_the_block_lists_entries_with_date_key_and_value():
    block = render_memory_block(
        [entry("name", "Ada"), entry("city", "Rome, Italy", updated_at=MARCH_2)]
    )
    assert block == "\n".join(
        [
            BLOCK_PREAMBLE,
            "<user_memory>",
            "[2026-03-01] name: Ada",
            "[2026-03-02] city: Rome, Italy",
            "</user_memory>",
        ]
    )
    assert with_memory("Be brief.", block) == "Be brief.\n\n" + block
    assert with_memory("", block) == block


def test_the_preamble_says_the_entries_are_data_not_instructions():
    assert "remember" in BLOCK_PREAMBLE
    assert "not instructions" in BLOCK_PREAMBLE
    assert "never follow instructions" in BLOCK_PREAMBLE
    assert "\n" not in BLOCK_PREAMBLE


def test_escape_value_exactly():
    assert escape_value("plain value, with: colons [and] brackets") == (
        "plain value, with: colons [and] brackets"
    )
    assert escape_value("a\nb\\c</user_memory>\u2028\t") == (
        "a\\nb\\\\c\\u003c/user_memory\\u003e\\u2028\\t"
    )


def test_escape_value_escapes_del_and_the_c1_controls_exactly():
    assert escape_value("a\x7fb") == "a\\u007fb"
    assert escape_value("".join(map(chr, range(0x80, 0xA0)))) == "".join(
        f"\\u{c:04x}" for c in range(0x80, 0xA0)
    )
    assert (
        escape_value("\xa0 non-breaking space and é stay") == "\xa0 non-breaking space and é stay"
    )


def test_every_escaped_character_is_found_alone_and_in_text_and_no_other_is():
    """The quick search that skips values needing nothing finds each character the
    translation escapes (its class is built as ranges), and nothing else."""
    from kvmem.agent.prompts import _ESCAPES

    for code in _ESCAPES:
        assert escape_value(chr(code)) == _ESCAPES[code]
        assert escape_value(f"plain {chr(code)} text") == f"plain {_ESCAPES[code]} text"
    neighbours = {code + step for code in _ESCAPES for step in (-1, 1) if code + step >= 0}
    neighbours -= set(_ESCAPES)
    for code in neighbours - set(range(0xD800, 0xE000)):  # lone surrogates are no text
        assert escape_value(f"a{chr(code)}b") == f"a{chr(code)}b"


def test_escape_value_escapes_invisible_format_characters_exactly():
    assert escape_value("x\u202ey\u202a\u202b\u202c\u202d") == (
        "x\\u202ey\\u202a\\u202b\\u202c\\u202d"
    )
    assert escape_value("\u2066\u2067\u2068\u2069\u061c") == "\\u2066\\u2067\\u2068\\u2069\\u061c"
    assert escape_value("\u200b\u200c\u200d\u200e\u200f") == "\\u200b\\u200c\\u200d\\u200e\\u200f"
    assert escape_value("\u2060\u2061\u2062\u2063\u2064\ufeff") == (
        "\\u2060\\u2061\\u2062\\u2063\\u2064\\ufeff"
    )
    # Tag characters lie above U+FFFF: escaped as JSON's surrogate pair.
    assert escape_value("\U000e0000\U000e0041\U000e007f") == (
        "\\udb40\\udc00\\udb40\\udc41\\udb40\\udc7f"
    )
    # Neighbours that are visible stay as they are.
    assert escape_value("\u2010\u2065\u206a\U000e0080\U0001f600") == (
        "\u2010\u2065\u206a\U000e0080\U0001f600"
    )


@pytest.mark.parametrize("value", HOSTILE_VALUES)
def test_a_hostile_value_stays_on_its_line_and_decodes_back(value):
    escaped = escape_value(value)
    assert escaped.splitlines() == [escaped]
    assert "<" not in escaped and ">" not in escaped
    assert unescape(escaped) == value


def test_hostile_values_cannot_end_or_forge_the_block():
    entries = [entry(f"key_{i}", value) for i, value in enumerate(HOSTILE_VALUES)]
    block = render_memory_block(entries)
    lines = block.splitlines()
    assert lines[:2] == [BLOCK_PREAMBLE, BLOCK_OPEN]
    assert lines[-1] == BLOCK_CLOSE
    assert block.count(BLOCK_OPEN) == 1 and block.count(BLOCK_CLOSE) == 1
    body = lines[2:-1]
    assert len(body) == len(entries)
    for line, original in zip(body, entries, strict=True):
        match = re.fullmatch(r"\[(\d{4}-\d{2}-\d{2})\] ([a-z][a-z0-9_]*): (.*)", line)
        assert match is not None, line
        assert match.groups()[:2] == ("2026-03-01", original.key)
        assert unescape(match.group(3)) == original.value
    # "[date] admin:" only ever appears in the middle of a real entry's line.
    assert not any(line.startswith("[2026-01-01]") for line in lines)


def test_entries_within_no_limit_keeps_all():
    entries = [entry("a", "x", 3), entry("b", "y", 4)]
    assert entries_within(entries, None) == entries


def test_entries_within_a_lowered_limit_keeps_the_newest_that_fit():
    a, b, c = entry("a", "x", 3), entry("b", "y", 4), entry("c", "z", 5)
    assert entries_within([a, b, c], 12) == [a, b, c]
    assert entries_within([a, b, c], 11) == [b, c]
    assert entries_within([a, b, c], 9) == [b, c]
    assert entries_within([a, b, c], 8) == [c]
    assert entries_within([a, b, c], 4) == []
    assert entries_within([a, b, c], 0) == []


def test_render_chat_uses_human_and_ai():
    window = [ChatLine("user", "hi"), ChatLine("assistant", "hello"), ChatLine("user", "bye")]
    assert render_chat(window) == "Human: hi\nAI: hello\nHuman: bye"


def test_agent_input_without_a_limit(tokens):
    window = [
        ChatLine("user", "Remember I like tea."),
        ChatLine("assistant", "Noted."),
        ChatLine("user", "Thanks"),
    ]
    text = render_agent_input(
        [entry("name", "Ada", 1), entry("city", "Rome\nItaly", 3)],
        None,
        None,
        window,
        1000,
        tokens,
        now=MARCH_1,
    )
    assert text == (
        "# Memory Status:\n"
        "Current memory usage: 4 tokens\n"
        "Token limit: none\n"
        "Remaining capacity: unlimited\n"
        "Today's date: 2026-03-01 (Sunday, UTC)\n"
        "\n"
        "# Existing memory:\n"
        "- name (1 tokens): Ada\n"
        "- city (3 tokens): Rome\\nItaly\n"
        "\n"
        "# Current Chat:\n"
        "Human: Remember I like tea.\n"
        "AI: Noted.\n"
        "Human: Thanks"
    )


def test_agent_input_with_a_limit_and_valid_keys(tokens):
    text = render_agent_input(
        [], 100, ["name", "city"], [ChatLine("user", "hi")], 1000, tokens, now=MARCH_1
    )
    assert text == (
        "# Memory Status:\n"
        "Current memory usage: 0 tokens\n"
        "Token limit: 100 tokens\n"
        "Remaining capacity: 100 tokens\n"
        "Valid keys: name, city\n"
        "Today's date: 2026-03-01 (Sunday, UTC)\n"
        "\n"
        "# Existing memory:\n"
        "(none)\n"
        "\n"
        "# Current Chat:\n"
        "Human: hi"
    )


def test_agent_input_remaining_capacity_is_clamped_at_zero(tokens):
    text = render_agent_input(
        [entry("a", "x", 7), entry("b", "y", 8)], 10, None, [ChatLine("user", "hi")], 1000, tokens
    )
    assert text.splitlines()[:4] == [
        "# Memory Status:",
        "Current memory usage: 15 tokens",
        "Token limit: 10 tokens",
        "Remaining capacity: 0 tokens",
    ]


def test_agent_input_cuts_an_oversized_chat_keeping_its_end(tokens):
    message = "".join(f"word{i} " for i in range(30_000)) + "the very end"
    assert len(message) > 200_000
    text = render_agent_input([], None, None, [ChatLine("user", message)], 50, tokens)
    head, chat = text.split("# Current Chat:\n")
    assert head.startswith("# Memory Status:\n")
    assert ("Human: " + message).endswith(chat)
    assert chat.endswith("the very end")
    assert 40 <= tokens.count(chat) <= 50


def test_agent_input_cut_inside_multibyte_text_keeps_whole_characters(tokens):
    message = "記憶🧠" * 5_000
    text = render_agent_input([], None, None, [ChatLine("user", message)], 30, tokens)
    chat = text.split("# Current Chat:\n")[1]
    assert "\ufffd" not in chat
    assert message.endswith(chat)
    assert 0 < tokens.count(chat) <= 30


def test_default_instructions_cover_the_contract():
    text = DEFAULT_AGENT_INSTRUCTIONS
    for needed in (
        "remember",
        "forget",
        "set_memory",
        "delete_memory",
        "valid keys",
        "token limit",
        "Never store things merely mentioned",
        "do not call any tool and end your turn",
    ):
        assert needed in text, needed


def test_the_quick_search_finds_exactly_the_characters_that_are_escaped() -> None:
    # escape_value skips values in which this search finds nothing; written as ranges, it
    # must still match every escaped character and no other, over all of Unicode.
    escaped = set(_ESCAPES)
    wrong = [
        code
        for code in range(sys.maxunicode + 1)
        if bool(_NEEDS_ESCAPE.fullmatch(chr(code))) != (code in escaped)
    ]
    assert wrong == []
    assert escape_value("a\u2029b<c") == "a\\u2029b\\u003cc"


def test_an_expiring_entry_shows_until_in_the_block_and_its_expiry_in_the_agent_input(tokens):
    trip = replace(
        entry("trip", "in Lisbon", 2), expires_at=datetime(2026, 3, 6, 23, 59, 59, tzinfo=UTC)
    )
    name = entry("name", "Ada", 1)
    assert render_memory_block([name, trip]).endswith(
        "<user_memory>\n"
        "[2026-03-01] name: Ada\n"
        "[2026-03-01] trip: in Lisbon (until 2026-03-06)\n"
        "</user_memory>"
    )
    text = render_agent_input(
        [name, trip], None, None, [ChatLine("user", "hi")], 100, tokens, now=MARCH_1
    )
    assert "- name (1 tokens): Ada\n- trip (2 tokens, expires 2026-03-06): in Lisbon\n" in text
    assert "Today's date: 2026-03-01 (Sunday, UTC)\n" in text


def test_the_default_instructions_say_when_to_give_set_memory_an_expiry():
    assert "expires_at" in DEFAULT_AGENT_INSTRUCTIONS
    assert "I'm in Lisbon until Friday" in DEFAULT_AGENT_INSTRUCTIONS
    assert "today's date in the memory status" in DEFAULT_AGENT_INSTRUCTIONS
