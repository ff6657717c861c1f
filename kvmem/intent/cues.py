"""Cues the intent gate's classifier reads beside a message's n-grams: a few kinds of word
that mean the same in every language, so that what the model learns of "tonight" in one
language also counts for "stasera" and "今晚" in the rounds it has fewer of.

- `now`: a moment ("today", "tomorrow", "ce soir", "сегодня", "今日"): chit-chat's passing
  states and plans ("ugh long day, 40 tickets and its only 11am").
- `lasting`: a habit or a lasting state ("always", "every day", "siempre", "いつも"):
  facts about the user.
- `other`: someone else ("a customer", "my boss", "una amica", "客户"): tasks about other
  people's matters.
- `task`: a clause that starts as a task or a question ("write", "how do I", "come si",
  "怎么").
- `question`: a question mark; and the message's length, in five buckets.

Each is a feature of the logistic regression like any n-gram: the model learns from the
labelled rounds what each weighs; none decides anything alone. They read text already
normalized by kvmem.intent.gate.normalize (casefolded, accents dropped). Pure, no I/O.
"""

from __future__ import annotations

import re

_NOW = re.compile(
    r"\b(?:today|tonight|tomorrow|yesterday|this (?:morning|afternoon|evening|weekend|week)|right now|at the moment"
    r"|last night|next week|hoy|manana|ayer|esta (?:noche|manana|tarde|semana)|este finde|este fin de semana|oggi"
    r"|domani|ieri|stasera|stamattina|stanotte|stamani|questo weekend|aujourd'hui|demain|hier|ce soir|ce matin"
    r"|ce week-?end|cette semaine|heute|morgen|gestern|dieses wochenende|diese woche|hoje|amanha|ontem"
    r"|esse fim de semana|essa semana|hj|tmrw|tmr|2day|2nite)\b|сегодня|завтра|вчера|сейчас|на выходных|今天|明天|昨天"
    r"|今晚|周末|这周|刚才|今日|明日|昨日|今夜|今晩|週末|さっき|今朝"
)
_LASTING = re.compile(
    r"\b(?:always|usually|every (?:day|morning|week|time)|everyday|never|for years|since \d{4}|all my life|siempre"
    r"|todos los dias|cada dia|sempre|tutti i giorni|ogni giorno|toujours|tous les jours|jamais|immer|jeden tag|nie"
    r"|todo dia|todos os dias|nunca|habitualmente)\b|всегда|каждый день|никогда|总是|每天|一直|从来|いつも|毎日|ずっと"
    r"|普段"
)
_OTHER = re.compile(
    r"\b(?:customer|client|cliente|kunde|kundin|friend|boss|colleague|coworker|neighbou?r|roommate|amig[oa]|jefe|jefa"
    r"|amic[oa]|capo|collega|ami|amie|pote|collegue|chef|patron|freund|freundin|kollege|kollegin|chefin|chefe"
    r"|colega)\b|клиент|друг|подруг|начальни|коллег|客户|朋友|老板|同事|お客|友達|上司|同僚"
)
_TASK = re.compile(
    r"(?:^|[\n.!?] ?)(?:write|translate|summari[sz]e|make|give me|explain|fix|rewrite|list|create|help me|can you"
    r"|could you|how (?:do|can|to|long|much|many)|what|why|which|where|when|haz|escribe|traduce|dame|explica|como|que"
    r"|cual|scrivi|traduci|fammi|dammi|spiega|come|cosa|quale|quanto|ecris|traduis|fais|donne|explique|comment|quel"
    r"|quelle|combien|schreib|ubersetz|erklar|gib|wie|was|welche|escreve|traduz|faz|me da|qual|напиши|переведи"
    r"|сделай|объясни|как|что|почему|сколько)\b|(?:^|[\n。！？])(?:写|翻译|帮我|怎么|为什么|什么|如何|書いて|翻訳"
    r"|教えて|どう|なぜ)"
)
_CUES = (("now", _NOW), ("lasting", _LASTING), ("other", _OTHER), ("task", _TASK))
# Upper bounds (characters) of the length buckets; longer is "xl".
_LENGTHS = ((20, "xs"), (60, "s"), (150, "m"), (400, "l"))


def cues(normalized: str) -> set[str]:
    """The cue features of a normalized message (or clause): `c:<kind>` for each kind found,
    `c:question`, and `len:<bucket>`."""
    found = {f"c:{name}" for name, pattern in _CUES if pattern.search(normalized)}
    if "?" in normalized or "？" in normalized:
        found.add("c:question")
    size = next((name for limit, name in _LENGTHS if len(normalized) < limit), "xl")
    found.add(f"len:{size}")
    return found
