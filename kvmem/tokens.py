"""Token counts with o200k_base, loaded offline from the encoding file that litellm ships.

tiktoken would download the encoding on first use; kvmem must work without a network, so it
reads litellm's copy explicitly (checking tiktoken's published hash) and builds the encoding
itself. Nothing here relies on litellm having been imported first.
"""

from __future__ import annotations

import binascii
import hashlib
import importlib.util
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from kvmem.late_imports import import_late

if TYPE_CHECKING:  # imported lazily: `kvmem memory list` must not pay for tiktoken
    import tiktoken

# The published sha256 of o200k_base.tiktoken (tiktoken_ext/openai_public.py).
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
# litellm names its copies by the sha1 of tiktoken's download URL.
O200K_FILENAME = "fb374d419588a4632f3f557e76b4b70aebbca790"
# o200k_base's split pattern and special tokens, as in tiktoken_ext/openai_public.py.
O200K_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
O200K_SPECIAL_TOKENS = {"<|endoftext|>": 199999, "<|endofprompt|>": 200018}


def litellm_encoding_file(filename: str = O200K_FILENAME) -> Path:
    """The path of an encoding file inside the installed litellm package (not imported)."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("litellm is not installed; kvmem needs its o200k_base encoding file")
    package = Path(next(iter(spec.submodule_search_locations)))
    return package / "litellm_core_utils" / "tokenizers" / filename


def load_o200k(path: Path | None = None) -> tiktoken.Encoding:
    """Build the o200k_base encoding from a local `.tiktoken` file, verifying its hash.

    The encoding encodes and decodes like tiktoken's own but cannot be pickled."""
    # Not behind litellm's import (seconds): the first write waits for this encoding.
    tiktoken = import_late("tiktoken", alone=False)
    path = path or litellm_encoding_file()
    contents = path.read_bytes()
    if hashlib.sha256(contents).hexdigest() != O200K_SHA256:
        raise RuntimeError(f"{path} is not the o200k_base encoding (hash mismatch)")
    # Each line is "<base64 token> <rank>", the ranks 0, 1, 2, ... in order (the hash above
    # vouches for the file): split once, every rank dropped and each token's rank taken from
    # its position (parsing 200,000 ints took ~25 ms of start-up's CPU), each token decoded
    # by binascii directly (base64.b64decode's checks per call made this 1.4 times slower).
    tokens = contents.split()
    del tokens[1::2]
    ranks = dict(zip(map(binascii.a2b_base64, tokens), range(len(tokens)), strict=True))
    encoding = tiktoken.Encoding(
        name="o200k_base",
        pat_str=O200K_PATTERN,
        mergeable_ranks=ranks,
        special_tokens=O200K_SPECIAL_TOKENS,
    )
    # The encoding copies the ranks into its Rust core, which does all the encoding and
    # decoding; it keeps this dict only to be pickled, which kvmem never does. Emptying it
    # frees a second copy of 200,000 byte strings (~25 MiB of a server's resident memory).
    ranks.clear()
    return encoding


class TokenCounter:
    """Counts o200k_base tokens; the encoding is loaded once (on first use, or by `load`),
    thread-safely."""

    def __init__(self, path: Path | None = None) -> None:
        self._path = path
        self._encoding: tiktoken.Encoding | None = None
        self._lock = threading.Lock()

    @property
    def encoding(self) -> tiktoken.Encoding:
        """The loaded encoding."""
        if self._encoding is None:
            with self._lock:
                if self._encoding is None:
                    self._encoding = load_o200k(self._path)
        return self._encoding

    def load(self) -> None:
        """Load the encoding now, if it is not loaded yet (the app does so at start-up)."""
        _ = self.encoding

    def count(self, text: str) -> int:
        """The number of tokens in `text`; special-token text counts as ordinary text."""
        return len(self.encoding.encode_ordinary(text))

    def keep_end(self, text: str, max_tokens: int) -> str:
        """The longest suffix of `text` that is at most `max_tokens` tokens."""
        tokens = self.encoding.encode_ordinary(text)
        if len(tokens) <= max_tokens:
            return text
        if max_tokens <= 0:
            return ""
        data = self.encoding.decode_bytes(tokens[len(tokens) - max_tokens :])
        # A token boundary can fall inside a character: drop that character's trailing bytes
        # (UTF-8 continuation bytes) rather than decode them to U+FFFD, which is not in `text`.
        start = 0
        while start < len(data) and data[start] & 0xC0 == 0x80:
            start += 1
        suffix = data[start:].decode("utf-8")
        # Encoding the suffix on its own may split its first word differently; trim to fit.
        while suffix and self.count(suffix) > max_tokens:
            suffix = suffix[1:]
        return suffix
