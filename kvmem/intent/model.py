"""The intent gate's learned second opinion: how likely a normalized message is to touch
memory, by a logistic regression on character n-grams and words.

The rules (kvmem/intent/small_talk.py) skip only what they positively recognise, and other authors'
chit-chat (conversational follow-ups, reactions, temporary states, first-person tasks) mostly
goes unrecognised. kvmem/intent/gate.py asks this model about those messages only: a message the
rules pass may still be skipped when the model is confident it is chit-chat, never one that
names memory or is too long to be small talk (kvmem/intent/gate.py decides that, not this module).

This module owns the features (`features`: n-grams and words, and the cues of
kvmem/intent/cues.py), the weights' file format and loading it, and scoring. The weights are
package data, `kvmem/intent/model.json`, written by `python -m tests.bench.train_gate` from the
labelled messages in tests/data (deterministic: training again gives the same file); they are
read once, when the first gate is built (kvmem/intent/gate.py). Pure Python and the standard
library: no download, no numpy. It reads text already normalized by kvmem.intent.gate.normalize
and imports nothing of kvmem but the cues.
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass, field
from importlib import resources

from kvmem.intent.cues import cues

MODEL_FILE = "model.json"
# 2: the cues (kvmem/intent/cues.py) are features too.
FORMAT = 2

# Character n-grams of each word padded with a space at both ends ("_hi_" gives "_h", "hi",
# "i_", "_hi", "hi_", "_hi_"), and each word as a whole.
NGRAM_SIZES = (2, 3, 4)
# Only so much of a message is read: longer ones never reach the model (they are not small talk).
MAX_CHARS = 2_000
# Clauses end at sentence marks and commas, in Latin and CJK punctuation.
_CLAUSE_END = re.compile(r"[.!?;,\n。！？；，、]+")


def feature_set(normalized: str) -> set[str]:
    """The message's n-grams and words (see NGRAM_SIZES), and its cues."""
    text = normalized[:MAX_CHARS]
    found = cues(text)
    for word in text.split():
        found.add(f"w:{word}")
        padded = f" {word} "
        for size in NGRAM_SIZES:
            found.update(padded[start : start + size] for start in range(len(padded) - size + 1))
    return found


def features(normalized: str) -> dict[str, float]:
    """The message's features and their values: each present n-gram and word 1, scaled so
    that the vector has length 1 (a long message does not weigh more than a short one)."""
    found = feature_set(normalized)
    return dict.fromkeys(found, 1 / math.sqrt(len(found))) if found else {}


@dataclass(frozen=True)
class Model:
    """Weights of a logistic regression: P(touches memory) = sigmoid(bias + sum w·x), and the
    threshold below which a message is read as chit-chat."""

    bias: float
    weights: dict[str, float]
    threshold: float
    training: dict[str, float] = field(default_factory=dict)  # how it was trained, to rebuild

    def probability(self, normalized: str) -> float:
        """How likely the message touches memory (explicit request or implicit update): the
        highest of the whole message's score and each clause's, so that a fact before a
        question ("I live in Lyon, what should I see?") is not outvoted by the question."""
        clauses = [c for c in _CLAUSE_END.split(normalized[:MAX_CHARS]) if c.strip()]
        scores = [self._score(normalized)]
        if len(clauses) > 1:
            scores += map(self._score, clauses)
        return max(scores)

    def _score(self, normalized: str) -> float:
        found = feature_set(normalized)
        get = self.weights.get
        z = self.bias + (sum(get(f, 0.0) for f in found) / math.sqrt(len(found)) if found else 0.0)
        return 1 / (1 + math.exp(-max(-30.0, min(30.0, z))))

    def is_chit_chat(self, normalized: str) -> bool:
        """Whether the model is confident the message does not touch memory."""
        return self.probability(normalized) < self.threshold

    def to_json(self) -> str:
        """The file's text: sorted keys, one line per weight, so diffs stay readable."""
        body = {
            "format": FORMAT,
            "features": {"ngram_sizes": list(NGRAM_SIZES), "words": True, "cues": True},
            "bias": self.bias,
            "threshold": self.threshold,
            "training": self.training,
            "weights": dict(sorted(self.weights.items())),
        }
        return (
            json.dumps(body, ensure_ascii=False, indent=0, separators=(",", ":"), sort_keys=True)
            + "\n"
        )

    @classmethod
    def from_json(cls, text: str) -> Model:
        body = json.loads(text)
        if body.get("format") != FORMAT:
            raise ValueError(f"unknown intent model format {body.get('format')!r}")
        return cls(
            bias=float(body["bias"]),
            weights={str(k): float(v) for k, v in body["weights"].items()},
            threshold=float(body["threshold"]),
            training=dict(body.get("training", {})),
        )


@functools.cache
def load() -> Model:
    """The shipped model, read from package data on first use and kept."""
    return Model.from_json(resources.files("kvmem.intent").joinpath(MODEL_FILE).read_text("utf-8"))
