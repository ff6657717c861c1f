"""The intent gate: may a chat message be skipped, or could it ask to remember, update or
forget something about the user?

`memory.agent.trigger: intent` calls the memory agent's model only when the newest user
message passes this gate, which saves the second model call on the (many) turns that are
plain chat. The gate fails safe: a missed "forget my address" is a broken promise, an extra
agent call only a cost. So it skips only what it positively recognises as small talk
(kvmem/intent/small_talk.py: greetings, thanks, acknowledgements, questions about the world, tasks
with no first-person fact) and passes everything else, recognised or not.

What the rules pass only for want of recognising it, a small learned classifier may still
skip when it is confident the message is chit-chat (kvmem/intent/model.py: a logistic
regression on character n-grams, weights shipped as package data, read once when the first gate is built); a message
with a memory word or a life event, or longer than small talk, always passes
(`model_may_read`). Otherwise it is pure: compiled patterns per language, no I/O. Messages
are normalized first (NFKC, casefold, Latin and Cyrillic accents dropped, curly apostrophes
straightened), so "Mémorise", "MEMORISE" and "memorise" read the same. Every language is tried on every
message: users mix languages and a short message says too little to detect one.

`reason` says why a message passes: the language of a recognised memory request
("remember that I'm vegetarian", "forget my address", "actually I moved to Berlin"), an
operator's trigger phrase, or `unrecognised` (not small talk, so the agent decides). It is
a cost filter, not a judge: the agent still decides what, if anything, to write.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

from kvmem.intent import model as intent_model
from kvmem.intent.patterns import KEYWORD_RULES, PATTERNS
from kvmem.intent.small_talk import MAX_SMALL_TALK_CHARS, is_small_talk
from kvmem.intent.words import LIFE_EVENTS, MEMORY_WORDS, STANDING

# Latin and Cyrillic diacritics (U+0300-U+036F) are dropped; Japanese voicing marks
# (U+3099, U+309A) are kept, since dropping them would change the word.
_COMBINING_ACCENTS = re.compile("[\u0300-\u036f]")
_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'", "`": "'"})

LANGUAGES: tuple[str, ...] = tuple(PATTERNS)

# A message is read from both ends at most this far: a memory request in the middle of a
# 100 KB paste is rare, and the gate must stay cheap on any input.
MAX_SCANNED_CHARS = 4_000


def normalize(text: str) -> str:
    """`text` as the patterns read it: NFKC, casefolded, accents dropped, apostrophes
    straightened and whitespace collapsed."""
    text = _strip_accents(unicodedata.normalize("NFKC", text).casefold().translate(_APOSTROPHES))
    return "\n".join(" ".join(line.split()) for line in text.splitlines())


def _strip_accents(text: str) -> str:
    decomposed = unicodedata.normalize("NFD", text)
    return unicodedata.normalize("NFC", _COMBINING_ACCENTS.sub("", decomposed))


def _compile(pattern: str) -> re.Pattern[str]:
    # MULTILINE: each line of a message starts a sentence too.
    return re.compile(_strip_accents(pattern), re.MULTILINE)


@dataclass(frozen=True)
class _KeywordRule:
    """A keyword that counts unless the text just before or after it vetoes it."""

    keyword: re.Pattern[str]
    before: re.Pattern[str]  # searched in up to 40 characters before the keyword
    after: re.Pattern[str]  # matched right after the keyword

    def search(self, text: str) -> bool:
        """Whether some occurrence of the keyword in `text` is not vetoed."""
        for found in self.keyword.finditer(text):
            if self.before.search(text[max(0, found.start() - 40) : found.start()]):
                continue
            if self.after.match(text, found.end()):
                continue
            return True
        return False


# What the classifier never skips: words of memory, life events and standing instructions.
_ALWAYS_PASS = re.compile(
    "|".join(f"(?:{_strip_accents(w)})" for w in (*MEMORY_WORDS, *LIFE_EVENTS, *STANDING))
)


def model_may_read(normalized: str) -> bool:
    """Whether the model may judge a message the rules pass as unrecognised: it names no
    memory ("remember", "forget", "save", "记", "забудь"...), no life event ("pregnant",
    "retired", "怀孕"...) and no standing instruction ("from now on", "今後", "update:"),
    which always pass, and is short enough to be small talk."""
    return len(normalized) <= MAX_SMALL_TALK_CHARS and not _ALWAYS_PASS.search(normalized)


def model_may_skip(normalized: str, model: intent_model.Model) -> bool:
    """Whether a message the rules pass as unrecognised may still be skipped: the model may
    read it and is confident it is chit-chat."""
    return model_may_read(normalized) and model.is_chit_chat(normalized)


# What `reason` answers for a message that is neither a recognised request nor small talk.
UNRECOGNISED = "unrecognised"


class IntentGate:
    """Decides whether a message may be skipped: only small talk is; recognised memory
    requests (built-in patterns plus the operator's `trigger_phrases`, matched
    case-insensitively as substrings) and anything unrecognised pass."""

    def __init__(self, extra_phrases: Sequence[str] = (), *, model: bool = True) -> None:
        self._languages = {
            lang: _compile("|".join(f"(?:{p})" for p in patterns))
            for lang, patterns in PATTERNS.items()
        }
        self._keyword_rules = {
            lang: tuple(_KeywordRule(*map(_compile, rule)) for rule in rules)
            for lang, rules in KEYWORD_RULES.items()
        }
        self._phrases = tuple(dict.fromkeys(p for p in map(normalize, extra_phrases) if p))
        # Read now (~0.1 s, once per process), when the agent is built, not in a request.
        self._model = intent_model.load() if model else None

    def matches(self, text: str) -> bool:
        """Whether the agent should read `text`: False only for recognised small talk."""
        return self.reason(text) is not None

    def reason(self, text: str) -> str | None:
        """Why `text` passes: the language code of a recognised memory request, `phrase`,
        or `unrecognised` (not small talk); None when it is small talk and may be skipped."""
        if len(text) > 2 * MAX_SCANNED_CHARS:
            text = f"{text[:MAX_SCANNED_CHARS]}\n{text[-MAX_SCANNED_CHARS:]}"
        normalized = normalize(text)
        if any(phrase in normalized for phrase in self._phrases):
            return "phrase"
        for language, pattern in self._languages.items():
            if pattern.search(normalized):
                return language
            if any(rule.search(normalized) for rule in self._keyword_rules.get(language, ())):
                return language
        if is_small_talk(normalized):
            return None
        if self._model is not None and model_may_skip(normalized, self._model):
            return None
        return UNRECOGNISED
