"""The intent gate: its recall and skip rate on the labelled corpus and on the held-out round
(printed, and asserted at the targets), the small talk it skips and the messages it must
pass (it fails safe), trigger phrases, normalization, its config, and the gate deciding the
agent's state end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kvmem.config_loader import load_config
from kvmem.errors import ConfigError
from kvmem.intent import model as intent_model
from kvmem.intent.cues import cues
from kvmem.intent.gate import (
    LANGUAGES,
    MAX_SCANNED_CHARS,
    UNRECOGNISED,
    IntentGate,
    model_may_read,
    normalize,
)
from kvmem.intent.small_talk import MAX_SMALL_TALK_CHARS
from tests.bench import train_gate
from tests.support.apps import AGENT_MODEL, MAIN_MODEL, set_memory, wait_agents_idle
from tests.support.matchers import entry
from tests.support.upstream import Reply

CORPUS = Path(__file__).parent / "data" / "intent_corpus.jsonl"
# Written and committed before the fail-safe gate, never used to tune it (docs/agent.md, "Intent
# gate"); the tuning file is what the gate was tuned on besides CORPUS.
HELDOUT_ROUNDS = (
    Path(__file__).parent / "data" / "intent_heldout.jsonl",
    Path(__file__).parent / "data" / "intent_heldout2.jsonl",
)
TUNING = Path(__file__).parent / "data" / "intent_tuning.jsonl"
# Written blind by other authors as held-out rounds, measured once (docs/agent.md), then tuned
# on: tuning data now, asserted at the numbers reached less a small margin.
TUNING_ROUNDS = tuple(
    Path(__file__).parent / "data" / f"intent_heldout{n}.jsonl" for n in (3, 4, 5)
)
# Rounds 6 and 7, measured once on the rules (chit-chat skipped 30.9 / 69.1 %), and rounds 8
# 9, 10-11, 12-13 and 14-15, measured once on the rules and the classifier as then trained (78.1 /
# 74.4 / 61.9 / 62.5 / 63.8 / 68.8 / 78.8 / 56.9 %), are training data of the classifier now
# (kvmem/intent/model.py): (round, implicit, chit-chat skipped) asserted at the numbers reached
# less a margin.
TRAINED_ROUNDS = (
    (Path(__file__).parent / "data" / "intent_heldout6.jsonl", 0.92, 0.60),
    (Path(__file__).parent / "data" / "intent_heldout7.jsonl", 0.92, 0.80),
    (Path(__file__).parent / "data" / "intent_heldout8.jsonl", 0.92, 0.85),
    (Path(__file__).parent / "data" / "intent_heldout9.jsonl", 0.95, 0.85),
    (Path(__file__).parent / "data" / "intent_heldout10.jsonl", 0.95, 0.72),
    (Path(__file__).parent / "data" / "intent_heldout11.jsonl", 0.95, 0.75),
    (Path(__file__).parent / "data" / "intent_heldout12.jsonl", 0.95, 0.75),
    (Path(__file__).parent / "data" / "intent_heldout13.jsonl", 0.95, 0.75),
    (Path(__file__).parent / "data" / "intent_heldout14.jsonl", 0.92, 0.80),
    (Path(__file__).parent / "data" / "intent_heldout15.jsonl", 0.97, 0.58),
    # Rounds 16-19, measured once on the classifier trained through round 15 (77.5 / 57.5 /
    # 29.4 / 33.8 %), training data since 2026-12-04.
    (Path(__file__).parent / "data" / "intent_heldout16.jsonl", 0.95, 0.88),
    (Path(__file__).parent / "data" / "intent_heldout17.jsonl", 0.95, 0.82),
    (Path(__file__).parent / "data" / "intent_heldout18.jsonl", 0.95, 0.33),
    (Path(__file__).parent / "data" / "intent_heldout19.jsonl", 0.95, 0.45),
    # Rounds 20-22, measured once on the classifier trained through round 19 (explicit /
    # implicit / chit-chat skipped: 97.1 / 97.1 / 61.9 %, 100 / 100 / 85.0 %, 100 / 95.7 /
    # 62.5 %), training data since.
    (Path(__file__).parent / "data" / "intent_heldout20.jsonl", 0.95, 0.73),
    (Path(__file__).parent / "data" / "intent_heldout21.jsonl", 0.97, 0.88),
    (Path(__file__).parent / "data" / "intent_heldout22.jsonl", 0.95, 0.70),
    # Rounds 23-25, measured once on the classifier trained through round 22 (explicit /
    # implicit / chit-chat skipped: 100 / 92.9 / 89.4 %, 98.6 / 91.4 / 77.5 %, 100 / 94.3 /
    # 67.5 %), training data since.
    (Path(__file__).parent / "data" / "intent_heldout23.jsonl", 0.97, 0.92),
    (Path(__file__).parent / "data" / "intent_heldout24.jsonl", 0.95, 0.90),
    (Path(__file__).parent / "data" / "intent_heldout25.jsonl", 0.92, 0.83),
)
# Rounds 26-28, written blind before the shipped gate's design (cues) was fixed, unread until it
# was, and measured once on it (explicit / implicit / chit-chat skipped: 100 / 98.6 / 88.1 %,
# 100 / 87.1 / 91.2 %, 100 / 90.0 / 78.8 %), are neither tuning nor training data yet:
# asserted at those numbers less a margin.
MEASURED_ROUNDS = (
    (Path(__file__).parent / "data" / "intent_heldout26.jsonl", 0.95, 0.85),
    (Path(__file__).parent / "data" / "intent_heldout27.jsonl", 0.84, 0.88),
    (Path(__file__).parent / "data" / "intent_heldout28.jsonl", 0.87, 0.75),
    # Rounds 29-31, written blind after the shipped gate and measured once on it: 100 / 100 /
    # 85.0 %, 100 / 95.7 / 83.1 %, 100 / 94.3 / 78.1 %.
    (Path(__file__).parent / "data" / "intent_heldout29.jsonl", 0.97, 0.82),
    (Path(__file__).parent / "data" / "intent_heldout30.jsonl", 0.92, 0.80),
    (Path(__file__).parent / "data" / "intent_heldout31.jsonl", 0.91, 0.75),
    # Rounds 32-34, the same: 100 / 94.3 / 81.9 %, 100 / 91.4 / 78.1 %, 100 / 95.7 / 87.5 %.
    # Rounds 26-34 together: explicit 100 % (630/630), implicit 94.1 % (593/630), chit-chat
    # skipped 83.5 % (1,203/1,440).
    (Path(__file__).parent / "data" / "intent_heldout32.jsonl", 0.91, 0.78),
    (Path(__file__).parent / "data" / "intent_heldout33.jsonl", 0.88, 0.75),
    (Path(__file__).parent / "data" / "intent_heldout34.jsonl", 0.92, 0.84),
)
# The explicit requests a round's gate still misses, by design or not yet: round 13's
# "Por favor escreva em português de Portugal, não do Brasil" reads as a task for this answer;
# round 24's "всегда пиши цены в лари, ок?" ("always give prices in lari") as a task too.
EXPLICIT_MISSED = {"intent_heldout13": 1, "intent_heldout14": 1, "intent_heldout24": 1}
# Every held-out round in the order written: (round, least size, most texts repeated from the
# corpus, the tuning file or an earlier round). Later authors repeat some short chit-chat
# ("ciao!", "mdr", "草") and a few longer messages; docs/agent.md counts them.
# Texts repeated from earlier rounds, rounds 1-19 and 20 on.
_REPEATS_TO_19 = (0, 0, 0, 1, 1, 0, 11, 12, 12, 0, 0, 4, 2, 6, 5, 13, 10, 4, 8)
_REPEATS_FROM_20 = (15, 16, 26, 24, 16, 9, 23, 20, 16, 18, 23, 30, 20, 30, 23)
ROUNDS_WRITTEN = tuple(
    zip(
        (
            *HELDOUT_ROUNDS,
            *TUNING_ROUNDS,
            *(path for path, _, _ in (*TRAINED_ROUNDS, *MEASURED_ROUNDS)),
        ),
        (250, 120, 240, 240, 250, 265, 270, *(300,) * 27),  # rounds 8 on: 300 each
        (*_REPEATS_TO_19, *_REPEATS_FROM_20),
        strict=True,
    )
)
LABELS = ("explicit", "implicit", "chitchat")
CORPUS_LANGUAGES = ("en", "zh", "ru", "it", "es", "fr", "de", "pt", "ja")
INTENTS = ("explicit", "implicit")
NON_INTENTS = ("memory_question", "chitchat", "mention")
# The rounds the corpus was written in; each later one was measured before the gate was
# changed for it (docs/agent.md, "Intent gate", has those first numbers).
SPLITS = ("dev", "holdout", "unseen", "blind", "final")


@dataclass(frozen=True)
class Labelled:
    """One corpus message."""

    lang: str
    category: str
    intent: bool
    split: str
    text: str


def load_corpus() -> list[Labelled]:
    with CORPUS.open(encoding="utf-8") as lines:
        return [Labelled(**json.loads(line)) for line in lines]


def load_labelled(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8") as lines:
        return [json.loads(line) for line in lines]


def share(messages: Sequence[Labelled], passed: Callable[[Labelled], bool]) -> tuple[int, int]:
    return sum(passed(m) for m in messages), len(messages)


def percent(counts: tuple[int, int]) -> str:
    hits, total = counts
    return f"{100 * hits / total:5.1f} % ({hits}/{total})" if total else "-"


# --- the corpus --------------------------------------------------------------------------


def test_the_corpus_covers_every_language_and_category():
    corpus = load_corpus()
    assert len(corpus) >= 300
    assert {(m.lang, m.category) for m in corpus} == {
        (lang, category) for lang in CORPUS_LANGUAGES for category in INTENTS + NON_INTENTS
    }
    assert {m.split for m in corpus} == set(SPLITS)
    assert [m for m in corpus if m.intent != (m.category in INTENTS)] == []
    texts = [m.text for m in corpus]
    assert len(set(texts)) == len(texts)
    assert set(CORPUS_LANGUAGES) == set(LANGUAGES)


def test_recall_and_skip_rate_on_the_corpus_meet_the_targets():
    gate = IntentGate()
    corpus = load_corpus()
    passes = {m.text: gate.matches(m.text) for m in corpus}

    def measure(messages: Sequence[Labelled]) -> dict[str, tuple[int, int]]:
        of = lambda *categories: [m for m in messages if m.category in categories]  # noqa: E731
        return {
            "explicit recall": share(of("explicit"), lambda m: passes[m.text]),
            "implicit recall": share(of("implicit"), lambda m: passes[m.text]),
            "chit-chat skipped": share(of("chitchat"), lambda m: not passes[m.text]),
            "non-intents skipped": share(of(*NON_INTENTS), lambda m: not passes[m.text]),
        }

    overall = measure(corpus)
    rows = [("all", overall)]
    rows += [(f"split {s}", measure([m for m in corpus if m.split == s])) for s in SPLITS]
    rows += [
        (f"lang {lang}", measure([m for m in corpus if m.lang == lang]))
        for lang in CORPUS_LANGUAGES
    ]
    header = f"{'':12}" + "".join(f"{name:>26}" for name in overall)
    print(f"\nintent gate on {len(corpus)} labelled messages\n{header}")
    for label, numbers in rows:
        print(f"{label:12}" + "".join(f"{percent(c):>26}" for c in numbers.values()))
    misses = [(m.lang, m.category, m.text) for m in corpus if passes[m.text] != m.intent]
    print("misclassified:", *misses, sep="\n  ")

    explicit_hits, explicit_total = overall["explicit recall"]
    implicit_hits, implicit_total = overall["implicit recall"]
    chat_skipped, chat_total = overall["chit-chat skipped"]
    assert explicit_hits / explicit_total >= 0.98
    assert implicit_hits / implicit_total >= 0.98
    assert chat_skipped / chat_total >= 0.85


# --- the held-out round ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "size", "repeats"),
    ROUNDS_WRITTEN,
    ids=lambda value: value.stem if isinstance(value, Path) else str(value),
)
def test_a_held_out_round_is_new_and_covers_every_language(path, size, repeats):
    """Every round: each label in each language and mixed, no text twice, and none (rounds
    1-3, 6) or only the counted few (the others) already in the corpus, the tuning file or an
    earlier round."""
    heldout = load_labelled(path)
    assert len(heldout) >= size
    assert {(m["lang"], m["label"]) for m in heldout} == {
        (lang, label) for lang in (*CORPUS_LANGUAGES, "mixed") for label in LABELS
    }
    texts = [m["text"] for m in heldout]
    assert len(set(texts)) == len(texts)
    written = [p for p, _, _ in ROUNDS_WRITTEN]
    earlier = {m["text"] for other in written[: written.index(path)] for m in load_labelled(other)}
    tuned_on = {m.text for m in load_corpus()} | {m["text"] for m in load_labelled(TUNING)}
    repeated = [text for text in texts if text in tuned_on | earlier]
    print(f"\n{path.stem}: {len(repeated)} texts seen before:", *repeated, sep="\n  ")
    assert len(repeated) <= repeats
    # What the gate was tuned on may come back only as the short chit-chat any author writes
    # (round 17: "хорошо", "tá bom", "おはようございます"; round 18: "Valeu, ajudou muito!").
    assert [
        m["text"]
        for m in heldout
        if m["text"] in tuned_on and (m["label"] != "chitchat" or len(m["text"]) > 20)
    ] == []


def measure_round(
    path: Path,
) -> tuple[list[dict[str, str]], dict[str, bool], tuple[tuple[int, int], ...]]:
    """A round's messages, what the gate does with each, and (explicit passed, implicit
    passed, chit-chat skipped)."""
    gate = IntentGate()
    messages = load_labelled(path)
    passed = {m["text"]: gate.matches(m["text"]) for m in messages}
    of = lambda label: [m for m in messages if m["label"] == label]  # noqa: E731
    return (
        messages,
        passed,
        (
            share(of("explicit"), lambda m: passed[m["text"]]),
            share(of("implicit"), lambda m: passed[m["text"]]),
            share(of("chitchat"), lambda m: not passed[m["text"]]),
        ),
    )


@pytest.mark.parametrize("path", HELDOUT_ROUNDS, ids=lambda path: path.stem)
def test_a_held_out_round_meets_the_targets(path):
    """The regression guard for the table in docs/agent.md ("Intent gate"), whose numbers were measured on each round
    before any change made after looking at it."""
    heldout, passed, (explicit, implicit, skipped) = measure_round(path)
    print(
        f"\nheld-out: explicit {percent(explicit)}, implicit {percent(implicit)}, "
        f"chit-chat skipped {percent(skipped)}"
    )
    print(
        "misclassified:",
        *[
            (m["lang"], m["label"], m["text"])
            for m in heldout
            if passed[m["text"]] == (m["label"] == "chitchat")
        ],
        sep="\n  ",
    )
    assert explicit[0] / explicit[1] >= 0.98
    assert implicit[0] / implicit[1] >= 0.90
    assert skipped[0] / skipped[1] >= 0.80


@pytest.mark.parametrize(
    ("path", "implicit_floor", "skip_floor"),
    [(path, 0.97, 0.88) for path in TUNING_ROUNDS] + [*TRAINED_ROUNDS, *MEASURED_ROUNDS],
    ids=lambda value: value.stem if isinstance(value, Path) else str(value),
)
def test_a_tuning_round_keeps_the_numbers_reached(path, implicit_floor, skip_floor):
    """Rounds 3-5 were tuned on and rounds 6-9 trained on (they no longer estimate anything;
    docs/agent.md has the leave-one-round-out estimate): explicit 100 %, and implicit and
    chit-chat skipped at the numbers reached less a margin."""
    _, _, (explicit, implicit, skipped) = measure_round(path)
    print(
        f"\ntuning round: explicit {percent(explicit)}, implicit {percent(implicit)}, "
        f"chit-chat skipped {percent(skipped)}"
    )
    assert explicit[1] - explicit[0] == EXPLICIT_MISSED.get(path.stem, 0)
    assert implicit[0] / implicit[1] >= implicit_floor
    assert skipped[0] / skipped[1] >= skip_floor


# --- the classifier ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("what can I cook tonight?", {"c:now", "c:task", "c:question", "len:s"}),
        ("cosa cucino stasera", {"c:now", "c:task", "len:xs"}),
        ("今晚吃什么", {"c:now", "len:xs"}),
        ("I always take my coffee black", {"c:lasting", "len:s"}),
        ("私はいつも朝ごはんを食べない", {"c:lasting", "len:xs"}),
        ("un cliente mi ha scritto questo, come rispondo?", {"c:other", "c:question", "len:s"}),
        ("Клиент пишет: товар не пришёл", {"c:other", "len:s"}),
        ("ok", {"len:xs"}),
        ("x" * 500, {"len:xl"}),
    ],
)
def test_the_classifier_reads_the_same_cue_in_every_language(text, expected):
    """A moment, a habit, someone else, a task: one feature each whatever the language, so
    what the model learns of one language's words counts for the others."""
    assert cues(normalize(text)) == expected
    assert expected <= intent_model.feature_set(normalize(text))


def all_labelled_texts() -> list[str]:
    texts = [m.text for m in load_corpus()]
    for path in sorted((Path(__file__).parent / "data").glob("intent_*.jsonl")):
        if path != CORPUS:
            texts += [m["text"] for m in load_labelled(path)]
    return texts


def test_the_model_loads_once_and_scores_every_labelled_message():
    """Its cost per message is a benchmark's number (`python -m tests.bench.intent_gate`
    prints it), not asserted here: a mean under 2 ms of wall time failed once on a loaded
    worker when rounds 18-19 brought longer messages."""
    model = intent_model.load()
    assert intent_model.load() is model
    assert len(model.weights) > 1_000
    assert 0 < model.threshold < 1
    assert model.training["seed"] == train_gate.SEED
    path = Path(intent_model.__file__).with_name(intent_model.MODEL_FILE)
    assert path.stat().st_size < 3_000_000  # 2.8 MB trained on rounds 3-25
    texts = [normalize(t) for t in all_labelled_texts()]
    assert all(0 <= model.probability(text) <= 1 for text in texts)


def test_training_again_gives_the_same_weights():
    """The shipped file is what the committed script trains from tests/data, with the
    settings it records (the threshold chosen by inner leave-one-round-out, the seed)."""
    shipped = intent_model.load()
    examples = train_gate.load_examples()
    settings = train_gate.Settings(shipped.training["hard_weight"], shipped.threshold)
    assert train_gate.model_of(examples, settings) == shipped


def test_a_memory_word_always_passes_whatever_the_model_says():
    """Every labelled message with a memory word that the rules pass, the gate passes."""
    rules, gate = IntentGate(model=False), IntentGate()
    named = [t for t in all_labelled_texts() if not model_may_read(normalize(t))]
    assert len(named) > 500
    assert [t for t in named if rules.matches(t) and not gate.matches(t)] == []


@pytest.mark.parametrize(
    "text",
    [
        "remember lol",
        "haha ok forget it",
        "ok thanks, save that",
        "好的谢谢，记一下",
        "ok спасибо, запомни",
        "ahah grazie, ricordatelo",
        "jaja gracias, guárdalo",
        "merci, note-le",
        "danke, merk dir das",
        "valeu, anota aí",
        "ありがとう、覚えておいて",
    ],
)
def test_chit_chat_with_a_memory_word_passes(text):
    assert not model_may_read(normalize(text))
    assert IntentGate().matches(text)


@pytest.mark.parametrize(
    "text",
    [
        "I'm vegetarian",
        "I work as a nurse",
        "my son is 4",
        "I moved to Lyon last week",
        "I'm allergic to peanuts, what snacks are safe?",
        "Sono vegano",
        "Ich wohne in Köln",
        "Je suis enceinte",
        "我住在上海",
        "Я работаю врачом",
        "Trabajo como profesora",
        # first-person plural verbs, with no pronoun
        "abbiamo un labrador di 4 anni, strutture pet friendly in Puglia?",
        "Tenemos dos perros, ¿qué playa en Valencia los admite?",
    ],
)
def test_first_person_facts_pass_the_classifier(text):
    assert IntentGate().matches(text)


def test_a_message_longer_than_small_talk_never_reaches_the_model():
    text = "lol ok " * (MAX_SMALL_TALK_CHARS // 7 + 1)
    assert not model_may_read(normalize(text))
    assert IntentGate().matches(text)


# --- what is and is not an intent --------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "",
        "Thanks, that was helpful!",
        "ok cool 👍",
        "What's the weather like in Lisbon in May?",
        "How do I reverse a list in Python?",
        "Can you help me write a cover letter?",
        "Summarize this article for me.",
        "Translate this to Spanish: I love my cat.",
        "Why is my code so slow?\n```\nfor i in range(10**9): pass\n```",
        "谢谢，很有帮助！",
        "帮我把这句话翻译成英文：我很喜欢这个城市。",
        "Как приготовить борщ?",
        "Spiegami la fotosintesi.",
        "¿Qué hora es en Tokio?",
        "Donne-moi une recette de quiche.",
        "Erzähl mir einen Witz.",
        "Me indica uma série boa.",
        "ブラックホールとは何ですか？",
        # reactions: laughter, compliments to the assistant, elongated words
        "lmaooo ok that's actually funny",
        "jajaja buenísimo",
        "MDR t'es trop fort",
        "哈哈哈哈你好逗",
        "ахахах ну ты даёшь",
        "valeuuu",
        "www それな",
        # follow-ups on the previous answer
        "shorter please",
        "and in French?",
        "Can you make it shorter? Like two sentences max.",
        "no, I meant the second option. redo it with that",
        "lol no thats not what I meant",
        "Plus court stp",
        "mas corto porfa",
        "Nochmal, aber diesmal als Tabelle",
        "А теперь то же самое, но на английском.",
        "再短一点",
        "もう少し短くして",
        "non funziona, mi dà sempre lo stesso errore",
        # opinions on the options given, confusion
        "I think the second option is better",
        "Meglio la prima versione secondo me",
        "Мне кажется, второй вариант лучше звучит.",
        "I don't understand, can you explain it again?",
        "não entendi, pode explicar de novo?",
        "Tu peux détailler l'étape 3 ? je comprends pas d'où sort le 2π",
        # first-person words that frame a task, and lookalikes
        "What do you think I should name the function?",
        "¿Me redactas un correo para pedir una reunión?",
        "mi fai un riassunto dei promessi sposi in 5 righe",
        "Explique-moi la relativité comme si j'avais 10 ans",
        "what's a memory leak and how do I find one in node",
        "Was ist ein Speicherleck?",
        "Wie lange dauert ein Flug von Frankfurt nach New York?",
        "remind me what the difference between affect and effect is",
        # pasted code and errors around a question
        "why does this fail?\nfor i in range(len(a)+1):\n    print(a[i])",
        "почему у меня ошибка IndexError: list index out of range\n\na = [1, 2, 3]",
        "このエラーの意味を教えてください\nTypeError: Cannot read properties of undefined",
        "Oggi piove tantissimo.",
    ],
)
def test_small_talk_is_skipped(text):
    assert IntentGate().reason(text) is None


@pytest.mark.parametrize(
    "text",
    [
        # first-person facts, alone or inside a question or a task
        "I live in Lyon, what should I see?",
        "Vegan here, what can I cook tonight?",
        "Can you suggest recipes? No nuts, my son is allergic.",
        "fix this SQL, and btw I use Postgres 16",
        "Sono celiaco, cosa posso mangiare?",
        "Mi hijo es alérgico, ¿qué le doy?",
        "娘がナッツアレルギーなんだけど、おやつは何がいい？",
        "妊娠中ですが、寿司は食べても大丈夫ですか？",
        "怀孕了，能吃寿司吗？",
        "Переехал в Казань, что посмотреть?",
        # statements and fragments it does not recognise (pro-drop languages state facts
        # without a pronoun: "I'm diabetic", "pregnant, 5 months")
        "Soy diabética tipo 1.",
        "妊娠5ヶ月です。",
        # words that start a task in one language and a fact in another, once accents are
        # gone (Portuguese "dá", Italian "da"), and "name" that is not the verb
        "Da settembre insegno alle medie.",
        "Name's Bob, by the way.",
        # talk about memory: the agent decides, the gate does not guess
        "Do you remember what I said?",
        "What do you remember about me?",
    ],
)
def test_anything_not_recognised_as_small_talk_passes(text):
    assert IntentGate().reason(text) == UNRECOGNISED
    assert IntentGate(model=False).reason(text) == UNRECOGNISED


@pytest.mark.parametrize(
    "text",
    [
        # romanized and dialect memory requests (rounds 3, 7, 14, 18)
        "rmbr i take my coffee black no sugar lol",
        "jizhu wo bu chi la de, xiexie",
        "oboete oite, boku wa sakana ga taberarenai",
        "别再跟我提我前男友的事了，好吗？",
        "腰の話はもう出さんでええわ、治ったし",
        # standing instructions and updates (round 20)
        "今後、見積もりは全部税込表示でお願いします",
        "aggiorna: il negozio ora chiude alle 19:30 non alle 20",
        "Actualiza eso: entreno a las 7 de la mañana de lunes a viernes",
        "from now on keep your answers under 100 words",
        # an adoption, one's name
        "On a adopté un lapin nain, il peut manger des carottes ?",
        "Name's Bob, by the way.",
    ],
)
def test_the_classifier_never_judges_memory_words_standing_instructions_or_life_events(text):
    """These pass whatever the classifier would score them (several scored as chit-chat when
    it read them)."""
    assert not model_may_read(normalize(text))
    assert IntentGate().matches(text)


def test_a_momentary_statement_passes_the_rules_and_is_left_to_the_classifier():
    """The rules do not know it; the rounds' authors label such passing states chit-chat
    ("I'm tired today"), and the classifier trained on them may skip it."""
    assert IntentGate(model=False).reason("The heating is broken since Monday.") == UNRECOGNISED


@pytest.mark.parametrize(
    "text",
    [
        # first-person facts phrased like the chit-chat that is skipped: after a reaction, a
        # rejection or a follow-up, inside an opinion, next to code
        "haha, I'm pregnant!",
        "no, I meant I'm 34, not 43",
        "I think I'm allergic to penicillin",
        "shorter please, I'm reading on my phone",
        "The second option is better for me, I'm diabetic",
        "no, vivo a Roma",
        "nein, wohne in Köln",
        "いや、大阪に住んでいます",
        "jajaja, embarazada de 5 meses",
        "Besser ohne Fleisch, bin Vegetarier",
        "Лучше без мяса, не ем мясо",
        "Creo que soy celíaca",
        "mi fai una torta? sono celiaca",
        "on a adopté un chat hier, il faut quoi comme litière ?",
        "Uso sempre LibreOffice e mai Word, come si fa un indice automatico?",
        "Retired last month, hobby ideas?",
        "¿Embarazada de nuevo, qué hago?",
        "now in Berlin, any tips?",
        "ahora en Madrid, ¿qué me recomiendas?",
        "e-mail: bob@example.com",
        "换工作了",
        "妊娠してて",
        "I prefer the metric system",
        "recuérdame que mañana tengo dentista",
        "remind me to take my pills at 8",
        # a memory word always passes, even one that asks not to remember
        "не запоминай это, просто спрошу: сколько стоит развод?",
    ],
)
def test_facts_phrased_like_skipped_chit_chat_pass(text):
    """Near misses of the classes skipped above: the gate must still call the agent."""
    assert IntentGate().matches(text)


@pytest.mark.parametrize(
    ("text", "language"),
    [
        ("Remember that I'm vegetarian.", "en"),
        ("From now on call me Sam.", "en"),
        ("Call me Sam from now on.", "en"),
        ("Forget my address.", "en"),
        ("Actually I moved to Berlin.", "en"),
        ("My new email is sam@example.com", "en"),
        ("Please note I'm allergic to nuts.", "en"),
        ("Update my preferences: short answers.", "en"),
        ("I'm no longer vegan.", "en"),
        ("I changed jobs, I now work at Acme.", "en"),
        ("请记住我是素食者。", "zh"),
        ("Забудь мой адрес.", "ru"),
        ("D'ora in poi chiamami Sam.", "it"),
        ("Ya no vivo en Madrid.", "es"),
        ("Oublie mon adresse.", "fr"),
        ("Merk dir, dass ich Vegetarier bin.", "de"),
        ("Meu novo e-mail é ana@example.com.", "pt"),
        ("私の住所は忘れてください。", "ja"),
    ],
)
def test_requests_and_updates_are_intents_in_their_language(text, language):
    assert IntentGate().reason(text) == language


def test_trigger_phrases_match_as_substrings_ignoring_case_and_accents():
    text = "Onthoud DÁT ik vegetariër ben."
    assert IntentGate().reason(text) == UNRECOGNISED  # it passes, but is not recognised
    assert IntentGate(["onthoud dat"]).reason(text) == "phrase"
    assert IntentGate(["Ｏnthoud dát"]).reason(text) == "phrase"  # the phrase is normalized too
    # A phrase opens the gate even for what would be skipped as small talk.
    small_talk = "What's the weather like in Lisbon in May?"
    assert IntentGate().reason(small_talk) is None
    assert IntentGate(["LISBON"]).reason(small_talk) == "phrase"


def test_normalization():
    assert normalize("  Mémorise\u2019 QUE\t\tÇa ") == "memorise' que ca"
    assert normalize("ＲＥＭＥＭＢＥＲ") == "remember"  # full-width letters (NFKC)
    assert normalize("Запомни мой ёж") == "запомни мои еж"  # й and ё lose their marks
    assert normalize("ベジタリアンです") == "ベジタリアンです"  # Japanese voicing marks stay
    assert normalize("one\n  two  \nthree") == "one\ntwo\nthree"


def test_a_long_message_is_read_at_both_ends():
    padding = "lorem ipsum " * MAX_SCANNED_CHARS
    gate = IntentGate()
    assert gate.reason(f"Remember that I'm vegetarian. {padding}") == "en"
    assert gate.reason(f"{padding} Remember that I'm vegetarian.") == "en"
    # A request buried in the middle of a long paste is not looked for (the gate stays
    # cheap), but such a message is no small talk, so it still passes.
    assert gate.reason(f"{padding} Remember that I'm vegetarian. {padding}") == UNRECOGNISED
    # Small talk is looked for only in messages of up to MAX_SMALL_TALK_CHARS.
    assert gate.reason("Why is the sky blue? " * (MAX_SMALL_TALK_CHARS // 21)) is None
    assert gate.reason("Why is the sky blue? " * (MAX_SMALL_TALK_CHARS // 21 + 1)) == UNRECOGNISED


# --- config ------------------------------------------------------------------------------


def test_the_gate_is_off_by_default(write_config):
    agent = load_config(write_config("memory: {agent: {}}\n"), environ={}).config.memory.agent
    assert (agent.trigger, agent.trigger_phrases) == ("always", [])


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            "memory: {agent: {trigger: sometimes}}\n",
            "memory.agent.trigger: Input should be 'always' or 'intent' (got 'sometimes')",
        ),
        (
            "memory: {agent: {trigger_phrases: ['ok', '  ']}}\n",
            "memory.agent.trigger_phrases: Value error, a trigger phrase must not be blank",
        ),
        (
            "memory: {agent: {trigger_phrases: 'remember'}}\n",
            "memory.agent.trigger_phrases: Input should be a valid list (got 'remember')",
        ),
    ],
)
def test_bad_gate_settings_are_config_errors(write_config, text, problem):
    path = write_config(text)
    with pytest.raises(ConfigError) as raised:
        load_config(path, environ={})
    assert str(raised.value) == f"{path}: invalid config:\n  {problem}"


# --- end to end --------------------------------------------------------------------------


def chat(client, message: str, **body: Any) -> dict[str, Any]:
    response = client.post("/chat", json={"message": message, **body})
    assert response.status_code == 200, response.text
    return response.json()


def test_with_trigger_intent_chit_chat_makes_no_agent_call(
    upstream, chat_sections, make_client, tokens
):
    client = make_client(**chat_sections(agent={"trigger": "intent"}))
    upstream.script(AGENT_MODEL, Reply(content=None, tool_calls=[set_memory("diet", "vegetarian")]))

    first = chat(client, "What's the weather like in Lisbon in May?")
    assert first["memory"] == {"injected": [], "agent": "gated", "updates": []}
    second = chat(client, "Remember that I'm vegetarian.", conversation_id=first["conversation_id"])
    assert second["memory"]["agent"] in ("running", "done")
    wait_agents_idle(client)

    (request,) = upstream.received(AGENT_MODEL)  # one call: the chit-chat made none
    assert request.messages[1]["content"].endswith(
        "# Current Chat:\n"
        "Human: What's the weather like in Lisbon in May?\n"
        "AI: ok\n"
        "Human: Remember that I'm vegetarian."
    )
    assert client.get("/memory").json()["memories"] == [
        entry("diet", "vegetarian", tokens.count("vegetarian"), source="agent")
    ]


def test_with_trigger_always_chit_chat_calls_the_agent(upstream, chat_sections, make_client):
    client = make_client(**chat_sections())
    body = chat(client, "What's the weather like in Lisbon in May?")
    assert body["memory"]["agent"] in ("running", "done")
    wait_agents_idle(client)
    assert len(upstream.received(AGENT_MODEL)) == 1


def test_only_the_newest_user_message_opens_the_gate(upstream, chat_sections, make_client):
    client = make_client(**chat_sections(agent={"trigger": "intent", "trigger_phrases": ["jot"]}))

    def complete(*messages: tuple[str, str]) -> None:
        body = {
            "model": f"openai/{MAIN_MODEL}",
            "messages": [{"role": role, "content": text} for role, text in messages],
        }
        response = client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text

    complete(
        ("user", "Remember that I'm vegetarian."),
        ("assistant", "Noted."),
        ("user", "What's a good pasta recipe?"),
    )
    complete(
        ("user", "What's a good pasta recipe?"),
        ("assistant", "Try this."),
        ("user", "Jot this down: no mushrooms."),
    )
    wait_agents_idle(client)
    (request,) = upstream.received(AGENT_MODEL)
    assert request.messages[1]["content"].endswith("Human: Jot this down: no mushrooms.")


@pytest.mark.slow
def test_the_gate_benchmark_runs():
    """`python -m tests.bench.intent_gate --quick` still works (its numbers are not checked)."""
    result = subprocess.run(
        [sys.executable, "-m", "tests.bench.intent_gate", "--quick"],
        cwd=Path(__file__).resolve().parents[1],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "## Intent gate: agent calls on a 12-message conversation" in result.stdout
    assert "| intent |" in result.stdout
    assert "## Intent gate: the held-out rounds" in result.stdout


def test_a_newest_message_without_text_keeps_the_gate_shut(upstream, chat_sections, make_client):
    client = make_client(**chat_sections(agent={"trigger": "intent"}))
    image = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]
    body = {
        "model": f"openai/{MAIN_MODEL}",
        "messages": [
            {"role": "user", "content": "Remember that I'm vegetarian."},
            {"role": "assistant", "content": "Noted."},
            {"role": "user", "content": image},
        ],
    }
    assert client.post("/v1/chat/completions", json=body).status_code == 200
    body["messages"][-1] = {"role": "user", "content": "Forget my address."}
    assert client.post("/v1/chat/completions", json=body).status_code == 200
    wait_agents_idle(client)
    (request,) = upstream.received(AGENT_MODEL)
    assert request.messages[1]["content"].endswith("Human: Forget my address.")


def test_the_gate_is_imported_and_made_at_start_up_only_when_the_trigger_is_intent() -> None:
    """The server's modules do not import the gate (~45 ms of CPU at start-up that
    `trigger: always`, the default, never uses); `trigger: intent` makes it, model read, as
    the agent is built (while the server starts, not on the first chat)."""
    script = (
        "import sys\n"
        "import kvmem.server.app\n"
        "from kvmem.agent.memory_agent import intent_gate\n"
        "from kvmem.config import AgentConfig\n"
        "print('kvmem.intent.gate' in sys.modules, intent_gate(AgentConfig()), intent_gate(None))\n"
        "gate = intent_gate(AgentConfig(trigger='intent'))\n"
        "print(type(gate).__name__, gate._model is not None, gate.matches('remember that I am vegan'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False, timeout=120
    )
    assert (done.returncode, done.stdout, done.stderr) == (
        0,
        "False None None\nIntentGate True True\n",
        "",
    )
