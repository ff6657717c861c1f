"""`python -m tests.bench.train_gate [--loro] [--check]`: train the intent gate's classifier.

Trains the logistic regression of kvmem/intent/model.py on every labelled message in
tests/data and writes kvmem/intent/model.json. Positive ("touches memory"): explicit requests
and implicit updates, and the corpus's questions about memory and mentions of it (kept as
positives so the model learns nothing that would skip them; they pass the gate today, mostly
by their memory words, which always pass). Negative: chit-chat.

Deterministic: features are sorted strings, the SGD order comes from a fixed seed, weights
are rounded and near-zero ones pruned, so training again writes the same file (`--check`
exits 1 if the file differs from what training gives now).

The threshold is chosen a priori by a rule, never by a score on a held round: the highest
threshold (most skipping) at which, over the rounds left out of training in an inner
leave-one-round-out, the model skips at most 4 % of all their implicit updates and 1 % of
all their explicit requests (the issue's targets are 90 % and 98 % passed; the rules alone
lose about 2 % and 0.3 %). Features and training settings are fixed below.

`--loro` prints the cross-validated estimate: for each round of ROUNDS, train on everything else
(BASE_FILES always: the corpus, the tuning file, rounds 1-2 and the training messages),
choose the threshold on the remaining rounds only, and measure the combined gate (rules, then
the model) on the held round, beside the rules alone.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kvmem.intent import model as intent_model
from kvmem.intent.gate import UNRECOGNISED, IntentGate, model_may_read, model_may_skip, normalize

DATA = Path(__file__).resolve().parent.parent / "data"
MODEL_PATH = Path(intent_model.__file__).with_name(intent_model.MODEL_FILE)
BASE_FILES = (
    "intent_corpus",
    "intent_tuning",
    "intent_heldout",
    "intent_heldout2",
    "intent_training_a",
    "intent_training_b",
)
ROUNDS = tuple(range(3, 26))

SEED = 20250611
EPOCHS = 12
LEARNING_RATE = 0.5
L2 = 1e-4
PRUNE = 0.02  # weights smaller than this are dropped (keeps the file small)
DIGITS = 3
# The inner rule for the threshold: of all the held rounds' implicit updates and explicit
# requests, the model may skip at most this share. (Until 2026-12-04 the shares were 3 % and
# 1 % of those the rules leave unrecognised, about a third of the explicit requests: the
# explicit share bound at 0.30 on two or three romanized or dialect requests, memory words
# now; measured on rounds 16-19 with the model trained through 15, 0.46 instead of 0.30
# skipped 83.1 / 68.1 / 31.2 / 41.2 % of the chit-chat instead of 77.5 / 57.5 / 29.4 / 33.8 %,
# and passed 95.7-97.1 % of the implicit updates and 98.6-100 % of the explicit requests.)
MAX_IMPLICIT_LOSS = 0.04
MAX_EXPLICIT_LOSS = 0.01
HARD_WEIGHTS = (1.0, 3.0)
THRESHOLDS = tuple(round(0.02 * i, 2) for i in range(1, 50))


@dataclass(frozen=True)
class Example:
    """One labelled message, with what the rules say of it."""

    text: str
    label: str  # explicit, implicit, chitchat, memory_question, mention
    round: int  # 0 for BASE_FILES (the corpus, tuning file, rounds 1-2, training messages)
    normalized: str
    rules_pass: bool
    unrecognised: bool  # passed by the rules only for want of recognising it

    @property
    def positive(self) -> bool:
        return self.label != "chitchat"


def load_examples() -> list[Example]:
    gate = IntentGate(model=False)
    raw: list[tuple[str, str, int]] = []
    for name in BASE_FILES:
        for line in (DATA / f"{name}.jsonl").read_text(encoding="utf-8").splitlines():
            m = json.loads(line)
            raw.append((m["text"], m.get("label") or m["category"], 0))
    for n in ROUNDS:
        for line in (DATA / f"intent_heldout{n}.jsonl").read_text(encoding="utf-8").splitlines():
            m = json.loads(line)
            raw.append((m["text"], m["label"], n))
    examples = []
    for text, label, round_ in raw:
        reason = gate.reason(text)
        examples.append(
            Example(
                text, label, round_, normalize(text), reason is not None, reason == UNRECOGNISED
            )
        )
    return examples


@functools.cache
def _features(normalized: str) -> list[tuple[str, float]]:
    return sorted(intent_model.features(normalized).items())


def train(examples: Sequence[Example], hard_weight: float) -> tuple[float, dict[str, float]]:
    """Logistic regression by SGD over fixed-seed shuffles; weights rounded and pruned. The
    messages the rules pass as unrecognised (the only ones the model judges) weigh
    `hard_weight` times as much as the others."""
    # Features as indices into one list of weights (a dict lookup per feature and step made
    # training about 1.5 times slower); every feature of a message has the same value.
    index: dict[str, int] = {}
    rows = []
    for e in examples:
        feats = _features(e.normalized)
        rows.append(
            (
                [index.setdefault(f, len(index)) for f, _ in feats],
                feats[0][1] if feats else 0.0,
                e.positive,
                hard_weight if e.unrecognised else 1.0,
            )
        )
    values = [0.0] * len(index)
    bias = 0.0
    order = list(range(len(rows)))
    rng = random.Random(SEED)
    step = 0
    for _ in range(EPOCHS):
        rng.shuffle(order)
        for i in order:
            feats, v, positive, weight = rows[i]
            z = bias
            for j in feats:
                z += values[j] * v
            p = 1 / (1 + math.exp(-max(-30.0, min(30.0, z))))
            gradient = weight * (p - (1.0 if positive else 0.0))
            rate = LEARNING_RATE / (1 + step / len(rows))
            step += 1
            bias -= rate * gradient
            for j in feats:
                w = values[j]
                values[j] = w - rate * (gradient * v + L2 * w)
    weights = dict(zip(index, values, strict=True))
    kept = {f: round(w, DIGITS) for f, w in sorted(weights.items()) if abs(w) >= PRUNE}
    return round(bias, DIGITS), kept


@dataclass(frozen=True)
class Settings:
    """What the inner folds choose: how much the hard messages weigh, and the threshold."""

    hard_weight: float
    threshold: float


def model_of(examples: Sequence[Example], settings: Settings) -> intent_model.Model:
    bias, weights = train(examples, settings.hard_weight)
    return intent_model.Model(
        bias=bias,
        weights=weights,
        threshold=settings.threshold,
        training={"hard_weight": settings.hard_weight, "seed": SEED, "epochs": EPOCHS},
    )


def passes(example: Example, model: intent_model.Model | None) -> bool:
    """The combined gate: the rules, then (on what they pass as unrecognised) the model."""
    if not example.rules_pass:
        return False
    if model is None or not example.unrecognised:
        return True
    return not model_may_skip(example.normalized, model)


def choose_settings(examples: Sequence[Example], rounds: Sequence[int]) -> Settings:
    """The inner rule (module docstring), by leave-one-round-out over `rounds`: for each
    weight of the hard messages, the highest threshold that loses no more than allowed; then
    the weight that skips the most chit-chat at its threshold (the first, on a tie)."""
    total = {
        label: sum(e.label == label and e.round in rounds for e in examples)
        for label in ("implicit", "explicit")
    }
    best: tuple[int, Settings] | None = None
    for hard_weight in HARD_WEIGHTS:
        scored: list[tuple[Example, float]] = []
        for held in rounds:
            model = model_of([e for e in examples if e.round != held], Settings(hard_weight, 0.0))
            for e in examples:
                if e.round == held and e.unrecognised:
                    eligible = model_may_read(e.normalized)
                    scored.append((e, model.probability(e.normalized) if eligible else 1.0))
        threshold = 0.0
        for candidate in THRESHOLDS:
            lost = {"implicit": 0, "explicit": 0}
            for e, p in scored:
                if e.label in lost:
                    lost[e.label] += p < candidate
            if (
                lost["implicit"] <= MAX_IMPLICIT_LOSS * total["implicit"]
                and lost["explicit"] <= MAX_EXPLICIT_LOSS * total["explicit"]
            ):
                threshold = candidate
        skipped = sum(e.label == "chitchat" and p < threshold for e, p in scored)
        if best is None or skipped > best[0]:
            best = (skipped, Settings(hard_weight, threshold))
    assert best is not None
    return best[1]


def measure(
    examples: Sequence[Example], model: intent_model.Model | None
) -> dict[str, tuple[int, int]]:
    of = lambda label: [e for e in examples if e.label == label]  # noqa: E731
    return {
        "explicit": (sum(passes(e, model) for e in of("explicit")), len(of("explicit"))),
        "implicit": (sum(passes(e, model) for e in of("implicit")), len(of("implicit"))),
        "chitchat": (sum(not passes(e, model) for e in of("chitchat")), len(of("chitchat"))),
    }


def cell(counts: tuple[int, int]) -> str:
    hits, total = counts
    return f"{100 * hits / total:.1f} % ({hits}/{total})"


def loro(examples: Sequence[Example]) -> list[str]:
    """The leave-one-round-out table (markdown rows)."""
    lines = [
        "| held round | gate | threshold, hard weight | explicit passed | implicit passed | chit-chat skipped |",
        "|---|---|---:|---:|---:|---:|",
    ]
    sums: dict[str, list[float]] = {"rules": [0.0, 0.0, 0.0], "rules + model": [0.0, 0.0, 0.0]}
    for held in ROUNDS:
        training = [e for e in examples if e.round != held]
        settings = choose_settings(training, [r for r in ROUNDS if r != held])
        model = model_of(training, settings)
        heldout = [e for e in examples if e.round == held]
        for name, m in (("rules", None), ("rules + model", model)):
            numbers = measure(heldout, m)
            for i, counts in enumerate(numbers.values()):
                sums[name][i] += counts[0] / counts[1] / len(ROUNDS)
            shown = f"{settings.threshold:.2f}, x{settings.hard_weight:g}" if m else "-"
            lines.append(
                f"| {held} | {name} | {shown} | " + " | ".join(map(cell, numbers.values())) + " |"
            )
        print(lines[-2], lines[-1], sep="\n", flush=True)
    for name, values in sums.items():
        lines.append(
            f"| mean | {name} | | " + " | ".join(f"{100 * v:.1f} %" for v in values) + " |"
        )
    return lines


def build(examples: Sequence[Example]) -> intent_model.Model:
    """The shipped model: threshold by the inner rule over all rounds, trained on everything."""
    return model_of(examples, choose_settings(examples, ROUNDS))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loro", action="store_true", help="print the leave-one-round-out table")
    parser.add_argument("--check", action="store_true", help="exit 1 if the model file is stale")
    args = parser.parse_args(argv)
    examples = load_examples()
    if args.loro:
        print("\n".join(loro(examples)))
        return 0
    text = build(examples).to_json()
    if args.check:
        same = MODEL_PATH.read_text(encoding="utf-8") == text
        print("model file is up to date" if same else "model file differs from training")
        return 0 if same else 1
    MODEL_PATH.write_text(text, encoding="utf-8")
    print(f"wrote {MODEL_PATH} ({len(text.encode())} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
