"""Token counting: kvmem's offline o200k_base must be tiktoken's o200k_base, token for token."""

from __future__ import annotations

import hashlib
import tracemalloc
from pathlib import Path

import pytest
import tiktoken
from tiktoken_ext import openai_public

from kvmem.tokens import O200K_SHA256, TokenCounter, litellm_encoding_file, load_o200k

TEXTS = [
    "",
    "Prefers short answers.",
    "Hello, world! I'm here, you're there, they'll come.  Multiple   spaces\tand\ttabs.",
    "line one\nline two\r\n\r\nline four\n\n\n",
    "Numbers 1234567890 and 3.14159 and -42, 1,000,000.",
    "héllo wörld, ça va? Ünïcödé façade naïve coöperate",
    "日本語のテキストです。中文文本。한국어 텍스트.",
    "Emoji 😀👍🏽 family 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵 and ﷽",
    "Arabic مرحبا بالعالم and Hebrew שלום עולם and Devanagari नमस्ते",
    "combining e\u0301 a\u0308 and zero\u200bwidth",
    "<|endoftext|>",
    "special tokens as text: <|endoftext|> and <|endofprompt|> stay ordinary",
    "def f(x):\n    return {'a': [1, 2, 3]}  # code\n",
    "The quick brown fox jumps over the lazy dog. " * 50,
]


@pytest.fixture(scope="module")
def reference() -> tiktoken.Encoding:
    """tiktoken's own o200k_base, read from litellm's copy through tiktoken's cache (offline).

    Built with `Encoding(**o200k_base())` rather than `get_encoding`, so that an encoding some
    other import already registered in this process cannot stand in for the real thing.
    """
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TIKTOKEN_CACHE_DIR", str(litellm_encoding_file().parent))
        return tiktoken.Encoding(**openai_public.o200k_base())


def test_the_litellm_file_is_tiktokens_o200k_base() -> None:
    path = litellm_encoding_file()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == O200K_SHA256
    # tiktoken names its cached copies by the sha1 of the download URL.
    url = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"
    assert path.name == hashlib.sha1(url.encode()).hexdigest()


@pytest.mark.parametrize("text", TEXTS)
def test_counts_equal_tiktoken(
    tokens: TokenCounter, reference: tiktoken.Encoding, text: str
) -> None:
    assert tokens.encoding.encode_ordinary(text) == reference.encode_ordinary(text)
    assert tokens.count(text) == len(reference.encode_ordinary(text))


def test_encoding_definition_equals_tiktoken(
    tokens: TokenCounter, reference: tiktoken.Encoding
) -> None:
    assert tokens.encoding.name == "o200k_base"
    assert tokens.encoding._pat_str == reference._pat_str
    assert tokens.encoding._special_tokens == reference._special_tokens
    assert tokens.encoding.n_vocab == reference.n_vocab == 200019


def test_every_token_decodes_as_tiktokens(
    tokens: TokenCounter, reference: tiktoken.Encoding
) -> None:
    ordinary = sorted(reference._mergeable_ranks.values())
    assert len(ordinary) == 199998
    assert tokens.encoding.decode_bytes(ordinary) == reference.decode_bytes(ordinary)
    assert [tokens.encoding.decode_single_token_bytes(t) for t in ordinary[::997]] == [
        reference.decode_single_token_bytes(t) for t in ordinary[::997]
    ]


def test_the_encoding_keeps_no_python_copy_of_its_ranks() -> None:
    """tiktoken's Rust core holds the 200,000 ranks; the dict they were built from, kept
    beside it, would be ~25 MiB more of a server's memory. tracemalloc sees what Python
    allocates (the dict and its byte strings), not what the Rust core does."""
    tracemalloc.start()
    try:
        encoding = load_o200k()
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(encoding.encode_ordinary("hello")) == 1
    assert held < 2 * 1024 * 1024


def test_special_token_text_counts_as_ordinary_text(
    tokens: TokenCounter, reference: tiktoken.Encoding
) -> None:
    text = "<|endoftext|>"
    assert reference.encode(text, allowed_special="all") == [199999]
    assert tokens.count(text) == len(reference.encode(text, disallowed_special=())) == 7


def test_known_counts(tokens: TokenCounter) -> None:
    assert [
        tokens.count(t) for t in ["", "hello", "Prefers short answers.", "hello hello hello"]
    ] == [
        0,
        1,
        5,
        3,
    ]


def test_keep_end_returns_short_text_unchanged(tokens: TokenCounter) -> None:
    text = "a short text"
    assert tokens.keep_end(text, tokens.count(text)) == text
    assert tokens.keep_end(text, 1000) == text


def test_keep_end_with_zero_tokens_is_empty(tokens: TokenCounter) -> None:
    assert tokens.keep_end("anything at all", 0) == ""


def test_keep_end_keeps_the_end(tokens: TokenCounter) -> None:
    text = " ".join(f"word{i}" for i in range(200))
    kept = tokens.keep_end(text, 10)
    assert text.endswith(kept)
    assert kept.endswith("word199")
    assert "word0 " not in kept
    assert tokens.count(kept) == 10
    assert len(tokens.keep_end(text, 11)) > len(kept)


@pytest.mark.parametrize("text", [t for t in TEXTS if t])
def test_keep_end_is_a_suffix_within_the_bound(tokens: TokenCounter, text: str) -> None:
    total = tokens.count(text)
    for bound in range(total + 1):
        kept = tokens.keep_end(text, bound)
        assert text.endswith(kept), (bound, kept)
        assert "\ufffd" not in kept or "\ufffd" in text
        assert tokens.count(kept) <= bound, (bound, kept)
    assert tokens.keep_end(text, total) == text


def test_a_file_with_the_wrong_hash_is_refused(tmp_path: Path) -> None:
    fake = tmp_path / "o200k_base.tiktoken"
    fake.write_bytes(b"aGVsbG8= 0\nd29ybGQ= 1\n")
    with pytest.raises(RuntimeError) as raised:
        load_o200k(fake)
    assert str(raised.value) == f"{fake} is not the o200k_base encoding (hash mismatch)"

    counter = TokenCounter(fake)
    with pytest.raises(RuntimeError) as raised:
        counter.count("hello")
    assert str(raised.value) == f"{fake} is not the o200k_base encoding (hash mismatch)"


def test_a_truncated_copy_of_the_real_file_is_refused(tmp_path: Path) -> None:
    lines = litellm_encoding_file().read_bytes().splitlines(keepends=True)
    truncated = tmp_path / "truncated.tiktoken"
    truncated.write_bytes(b"".join(lines[:-1]))
    with pytest.raises(RuntimeError) as raised:
        TokenCounter(truncated).count("hello")
    assert str(raised.value) == f"{truncated} is not the o200k_base encoding (hash mismatch)"


def test_the_real_file_by_path_loads(tmp_path: Path, reference: tiktoken.Encoding) -> None:
    copy = tmp_path / "o200k_base.tiktoken"
    copy.write_bytes(litellm_encoding_file().read_bytes())
    counter = TokenCounter(copy)
    assert counter.count(TEXTS[5]) == len(reference.encode_ordinary(TEXTS[5]))
