"""Small talk: the messages the intent gate may skip because they cannot touch memory.

The gate fails safe (kvmem/intent/gate.py): it calls the memory agent for every message except
those this module positively recognises. A message is small talk when every sentence of it
is one of

- social: greetings, thanks, acknowledgements, laughter, goodbyes ("thanks!", "ok cool",
  "好的，明白了", "ahah bella questa");
- a question ("why is the sky blue?", "富士山の高さは？", "wie hoch ist die Zugspitze?");
- a task ("write a prime checker", "translate ...", "summarise this", "erklär mir ...");
- a follow-up on the previous answer ("shorter please", "and in French?", "that's not what I
  meant", "still doesn't work"), or an opinion on the options it gave ("I think the second
  one is better"); a bare "no" or "wait" is peeled off like a social word, so what follows
  must be recognised on its own ("no, vivo a Roma" is not small talk);
- a remark on the day or the weather ("Oggi piove tantissimo");

and, outside quotes and code, nothing in it speaks of the user: no first-person word ("I",
"my", "我", "мой", "sono", "私"...) once the first-person words that only frame a task are
set aside ("help me", "how do I", "tell me", "I think", "I don't understand", "spiegami",
"帮我", "por onde começo") and the lookalikes ("memory leak", "New York"), no word
of memory ("remember", "forget", "note", "记", "забудь", "覚え"...) and no word of change
("now", "anymore", "new", "jetzt", "теперь", "现在", "もう", "ました"...). Anything else —
a statement, a fragment, a first-person fact inside a question — is not small talk, and the
agent decides. So "I moved to Lyon, what should I see?" is not skipped, while "What should I
see in Lyon?" is.

Pasted code and error output are set aside sentence by sentence when they name neither the
user nor memory ("for i in range(3):" is code, its "i" no one), but a message of code alone is
not small talk.

The tables live in kvmem/intent/phrases.py (sentences) and kvmem/intent/words.py
(words of the user, of memory, of change, and their lookalikes), written for text normalized
by kvmem.intent.gate.normalize (casefolded; accents are stripped at compile time, as they are from
messages), for English, Chinese, Russian, Italian, Spanish, French, German, Portuguese and
Japanese, all tried on every message. This module does not decide what passes the gate (kvmem/intent/gate.py does) and knows
nothing of config or the agent.
"""

from __future__ import annotations

import re
import unicodedata

from kvmem.intent.phrases import (
    CODE,
    FOLLOW_UPS,
    OPINION_COMPARISONS,
    OPINION_OPTIONS,
    POLITE,
    QUESTIONS,
    REMARKS,
    REQUESTS,
    SOCIAL,
    TASKS,
)
from kvmem.intent.words import (
    ABOUT_THE_USER,
    FIRST_PERSON,
    FRAMES,
    MEMORY_WORDS,
    NOT_ABOUT_THE_USER,
)

_ACCENTS = re.compile("[\u0300-\u036f]")

# Longer messages are not read as small talk: a paste that long is material for a task and
# almost always speaks of someone, and reading it sentence by sentence would cost tens of ms.
MAX_SMALL_TALK_CHARS = 2_000


def _compile(*alternatives: str, flags: int = 0) -> re.Pattern[str]:
    pattern = "|".join(f"(?:{a})" for a in alternatives)
    plain = unicodedata.normalize("NFC", _ACCENTS.sub("", unicodedata.normalize("NFD", pattern)))
    return re.compile(plain, flags)


# Quoted text and code are material for a task ("translate 'I love my cat'"), not facts.
# (normalize turns backticks into apostrophes, so a code fence reads ''' here.)
_QUOTED = _compile(
    r"(?:```|''').*?(?:```|'''|$)",
    r"`[^`\n]*`",
    r'"[^"\n]*"',
    r"“[^”\n]*”",
    r"«[^»\n]*»",
    r"„[^“”\n]*[“”]",
    r"「[^」\n]*」",
    r"『[^』\n]*』",
    r"(?<![\w])'[^'\n]{2,}'(?![\w])",
    flags=re.DOTALL,
)
# After a translation request's colon comes the text to translate.
_TRANSLATE_COLON = _compile(
    r"\b(?:translate|traduci|traduce|traduis|ubersetz|übersetz|traduz|переведи|перевести)\w*[^:\n：]{0,40}[:：].*$",
    r"翻译[^:\n：]{0,20}[:：].*$",
    flags=re.DOTALL,
)
_SENTENCE = re.compile(r"(?:[^.!?。！？;；\n]|\.(?=\S))+[.!?。！？;；]*")
_QUESTION_MARK = re.compile(r"[?？]\s*$")

_SOCIAL = _compile(*SOCIAL)
# A Chinese sentence-final particle may follow ("你好呀"), and Chinese and Japanese write no
# spaces, so there a phrase may run straight on ("哈哈你好逗"); a Latin or Cyrillic one must end
# at a word's end.
_SOCIAL_PREFIX = re.compile(
    rf"^[\W_]*(?:{_SOCIAL.pattern})[呀啊哇哦啦嘛吧ー〜]*(?![^\W\d_\u3040-\u30ff\u3400-\u9fff])[\W_]*"
)
# Abbreviations do not end a sentence ("Docker vs. virtual machines").
_ABBREVIATION = re.compile(r"\b(vs|etc|e\.g|i\.e|z\.b|bzw|usw|ca|dr|mr|mrs|ms|prof|st|nr)\. ")
# "valeuuu", "lmaooo", "thanksss": a letter said three times or more is read once.
_ELONGATED = re.compile(r"([^\W\d_])\1{2,}")

_QUESTION = _compile(*QUESTIONS)

_TASK = _compile(
    rf"^{POLITE}(?:{'|'.join(TASKS)})(?![\w'])",  # not "name's Bob"
    rf"^(?:{'|'.join(REQUESTS)})\b",
    rf"^{POLITE}(?:帮我|给我|写|翻译|总结|解释|讲|介绍|推荐|列出|列举|生成|计算|修改|改|优化|分析|比较|说说|讲讲|描述|告诉我|用|做|画|设计"
    r"|把(?:这|那|上面|下面|以上|它)|精简|缩短|改写|重写|加上|去掉|继续)",
    # A Japanese request ends in the te-form: "短くして", "作って", "教えてください"; a bare
    # te-form only after a verb that asks for work ("妊娠してて" states a fact).
    r"(?:て|で)(?:ください|下さい|くれませんか|もらえますか|ほしい|欲しい)[。！!〜ー:]*$",
    r"(?:教えて|書いて|訳して|翻訳して|説明して|要約して|まとめて|作って|考えて|直して|計算して|調べて"
    r"|比較して|見せて|提案して|紹介して|描いて|挙げて|手伝って|[くに]して|続けて|変えて|やり直して|書き直して"
    r"|言い換えて)(?:ください|下さい|くれ|くれる|ほしい|欲しい)?(?:ませんか)?[。！!〜ー:]*$",
)
_FOLLOW_UP = _compile(*(f"^(?:{f})" for f in FOLLOW_UPS))
_OPINION_COMPARISON = _compile(*OPINION_COMPARISONS)
_OPINION_OPTION = _compile(*OPINION_OPTIONS)
_REMARK = _compile(*REMARKS)
_CODE = _compile(*CODE)
# Code names no one: a loop's "i" is not the user, but a pasted line with "my" or "remember"
# is read as prose.
_NAMES_SOMEONE = _compile(*FIRST_PERSON, *MEMORY_WORDS)
_LOOP_VARIABLE = re.compile(r"\bi\b(?!')")

_FRAMES = _compile(*FRAMES, *NOT_ABOUT_THE_USER)
_ABOUT_THE_USER = _compile(*ABOUT_THE_USER)


def is_small_talk(normalized: str) -> bool:
    """Whether a normalized message is positively small talk (see the module docstring)."""
    if len(normalized) > MAX_SMALL_TALK_CHARS:
        return False
    text = _ELONGATED.sub(r"\1", _ABBREVIATION.sub(r"\1 ", normalized))
    text = _TRANSLATE_COLON.sub(" ", _QUOTED.sub(" ", text))
    remainders = []
    code = False
    for found in _SENTENCE.finditer(text):
        sentence = found.group().strip()
        if _is_code(sentence):
            code = True  # read only around a question or task ("why does this fail?")
            continue
        # Social words are peeled off the front ("thanks! ok, so why...?") until what is
        # left asks or sets a task ("show me..." is a task, not the Portuguese "show!").
        while not _asks_or_tasks(sentence) and (social := _SOCIAL_PREFIX.match(sentence)):
            if social.end() == 0:
                break
            sentence = sentence[social.end() :]
        if not re.search(r"[^\W_]", sentence):
            continue
        if not _asks_or_tasks(sentence):
            return False
        remainders.append(sentence)
    if code and not remainders:
        return False
    return not _ABOUT_THE_USER.search(_FRAMES.sub(" ", "\n".join(remainders)))


def _asks_or_tasks(sentence: str) -> bool:
    """Whether a sentence asks, sets a task, or follows up on the previous answer."""
    return bool(
        _QUESTION_MARK.search(sentence)
        or _QUESTION.search(sentence)
        or _TASK.search(sentence)
        or _FOLLOW_UP.search(sentence)
        or _REMARK.search(sentence)
        or (_OPINION_COMPARISON.search(sentence) and _OPINION_OPTION.search(sentence))
    )


def _is_code(sentence: str) -> bool:
    return bool(
        _CODE.search(sentence) and not _NAMES_SOMEONE.search(_LOOP_VARIABLE.sub(" ", sentence))
    )
