"""The intent gate: does a chat message ask to remember, update or forget something about
the user?

`memory.agent.trigger: intent` calls the memory agent's model only when the newest user
message passes this gate, which saves the second model call on the (many) turns that are
plain chat. It is pure: compiled patterns per language, no model and no I/O. Messages are
normalized first (NFKC, casefold, Latin and Cyrillic accents dropped, curly apostrophes
straightened), so "Mémorise", "MEMORISE" and "memorise" read the same. Every language is
tried on every message: users mix languages and a short message says too little to detect
one.

The patterns favour requests over mentions. "Remember that I'm vegetarian", "forget my
address" and "actually I moved to Berlin" pass; "do you remember what I said?", "I can't
remember the movie's name" and "memory leak in my code" do not. It is a cost filter, not a
judge: the agent still decides what, if anything, to write.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# Latin and Cyrillic diacritics (U+0300-U+036F) are dropped; Japanese voicing marks
# (U+3099, U+309A) are kept, since dropping them would change the word.
_COMBINING_ACCENTS = re.compile("[\u0300-\u036f]")
_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'", "`": "'"})

# Where a sentence (and so an imperative) starts: the beginning, after punctuation, or after
# a softener such as "please".
_EN_START = r"(?:^|[.!?,;:\-()]\s*|\b(?:please|pls|plz|kindly|and|also|so|ok|okay|hey|oh)\s+|\b(?:can|could|would|will)\s+you\s+(?:please\s+)?)"
_ROMANCE_START = r"(?:^|[.!?,;:\-()¿¡]\s*)"

_PATTERNS: dict[str, tuple[str, ...]] = {
    "en": (
        r"\b(?:note|jot|write) down\b",
        r"\b(?:make|take) (?:a )?note\b",
        r"\bnote to self\b",
        r"\b(?:don't|do not|never|dont)\s+forget\s*(?::|that\b|my\b|i\b|i'm\b|about me\b)",
        r"\b(?:keep|bear) in mind\b",
        r"\bfor (?:future reference|next time|the record)\b",
        r"\bjust so you know\b",
        r"\b(?:from now on|from here on|going forward|moving forward|henceforth|in future conversations)\b",
        _EN_START + r"call me\b(?!\s+(?:back|later|tomorrow|crazy|old[- ]fashioned|a\b|when|if)\b)",
        r"\b(?:refer to me|address me) as\b",
        r"\b(?:stop|quit|don't|do not|dont) calling me\b|\b(?:don't|do not|dont) call me\b",
        # forget / delete what is stored
        r"\b(?:delete|remove|erase|wipe|clear|drop|purge)\b[^.?!]{0,40}\b(?:about me|my\b|what you (?:know|stored|saved|remember|have)|(?:the|that|this) (?:note|memory|entry|fact)|from (?:your )?memory|everything you)",
        r"\b(?:stop|quit) (?:remembering|storing|saving|keeping)\b",
        r"\b(?:don't|do not|dont) (?:remember|store|save|keep)\b[^.?!]{0,30}\babout (?:me|my)\b",
        # store / save into memory
        r"\b(?:save|store|record|memori[sz]e)\s+(?:this|that)?\s*:",
        r"\b(?:save|store|record|log)\s+(?:that\s+)?(?:my|i\b|i'm\b)",
        r"\b(?:save|store|put|add|write|keep|record|remove|delete|erase|drop|clear|take)\b[^.?!]{0,60}\b(?:in|to|into|from|out of) (?:your|the) memory\b",
        r"\b(?:save|store|put|add|keep|record|remove|delete|erase|drop|clear)\s+(?:my|that i|that my)\b[^.?!]{0,60}\b(?:in|to|into|from) memory\b",
        r"\bkeep track of\b[^.?!]{0,30}\b(?:i|i'm|my|me|that)\b",
        # update / change a fact about the user
        r"\b(?:update|change|correct|fix|edit|set|replace)\s+my\s+(?:\w+\s+){0,2}?(?:name|nickname|e-?mail|address|phone|number|preferences?|profile|details|info|information|birthday|job|title|role|pronouns|location|city|timezone|time zone|diet|memory|memories|settings)\b",
        r"(?:^|[.!?]\s*)update\s*:",
        # implicit updates: a fact about the user that has changed
        r"^actually,?\s+(?:i|i'm|i've|my|we)\b",
        r"\b(?:i|i'm|i am|my \w+(?: \w+)?)\b[^.?!]{0,30}\bno longer\b",
        r"\bi(?:'m| am|'m not| am not|'m not| don't| do not| dont)\b[^.?!]{0,40}\b(?:anymore|any more)\b",
        r"\bi(?:'ve| have)?\s+(?:just\s+|recently\s+|finally\s+)?(?:moved|relocated)\s+(?:to|from|out|back|in)\b",
        r"\bi(?:'ve| have)?\s+(?:just\s+|recently\s+)?(?:changed|switched)\s+(?:jobs?|careers?|teams?|companies|employers?|my\b|from\b|to\b)",
        r"\bi (?:now|currently) (?:live|work|use|go by|am|have)\b",
        r"\bmy new (?:e-?mail|address|phone|number|job|name|last name|surname|title|role|employer|company|boss|city|home|partner|username|handle|pronouns)\b",
        r"\bmy (?:e-?mail|address|phone(?: number)?|number|name|last name|surname|job|title|pronouns)(?: has)? (?:changed|is now)\b",
        r"\bmy (?:\w+ ){1,3}is \S+(?: \S+)? now\b",
        r"(?:^|[.!?]\s*)correction\b",
        r"\b(?:i|we) (?:just )?got (?:married|divorced|engaged)\b",
        r"\bi (?:quit|gave up|stopped) (?:smoking|drinking|my job|eating|being)\b",
        r"\b(?:i|we|i'm|we're|i've|we've)\b[^.?!]{0,15}\b(?:broke up|split up|got (?:married|divorced|engaged)|pregnant|retired|graduated|had a baby)\b",
        r"\b(?:started|got|have|found|took|accepted) (?:a )?new (?:job|position|role|number|phone|address|e-?mail|partner|name)\b",
        r"\bi(?:'m| am) (?:a |an )?\w+ now\b|\bi(?:'m| am) now\b",
        r"\b(?:my \w+|i) (?:just )?turned \d+",
        r"\bturns out (?:i|i'm|i am|my)\b|\bi'm not \w+ after all\b",
        r"\bi(?:'ve| have)? (?:just )?became\b|\bi(?:'ve| have) become\b",
        r"\b(?:don't|do not|dont|stop|never) (?:suggest|recommend|offer|give|show|send)(?:ing)?\b[^.?!]{0,40}\b(?:anymore|any more|again)\b",
        r"\bi(?:'ve| have)? (?:finally |just )?(?:stopped|quit) (?:\w+ing)\b",
        r"\b(?:i|i'm|i am|we|we're)\b[^.?!]{0,40}\b(?:anymore|any more|no longer)\b",
    ),
    "zh": (
        r"(?:^|[\s,.;:!。；、]|请|帮我|麻烦你?|你要|要|一定要|务必|给我)(?:记住|记下来?|记一下|记录一下|记录下来|记录|记着|记好|牢记)",
        r"(?:^|[\s,.;:!。；]|请|你要|要|一定要|务必)记得(?![^。?!]*[吗么?])",
        r"(?:别|不要|千万别|千万不要)忘(?:了|记)",
        r"忘(?:掉|了吧|记吧)",
        r"把[^。?!]{1,20}忘(?:掉|了)",
        r"(?:删除|删掉|清除|抹掉|去掉|移除)[^。?!]{0,20}(?:我|记忆|记录|信息)",
        r"(?:我|记忆|记录|信息)[^。?!]{0,20}(?:删除|删掉|清除|抹掉|去掉|移除)",
        r"更新(?:一下)?我的|更新一下",
        r"我的[^。?!]{0,10}(?:改成|改为|换成|变成|更新为)",
        r"(?:记忆|记录|记住的)[^。?!]{0,10}删(?:了|掉|除)",
        r"戒(?:烟|酒)了|我(?:现在|已经)?不再",
        r"(?:把|将)我的[^。?!]{0,20}(?:改成|改为|换成|更新为|更新成)",
        r"(?:^|[\s,.;:!。；])(?:以后|今后|往后|之后|从现在(?:开始|起)|从今(?:天|以后)(?:开始|起)?)(?:请|都|就|你|回答|叫|称呼|用|别|不要)",
        r"(?:叫我|称呼我|喊我)[^。?!]{0,10}(?:就行|就好|吧)",
        r"(?:^|[\s,.;:!。；、])(?:叫我|称呼我)|(?:不要|别)(?:再)?(?:叫我|称呼我)",
        # implicit updates
        r"其实我(?:已经|现在|早就)?(?:搬|换|不|已经|结|离|辞)",
        r"我(?:已经|刚|刚刚)?搬(?:到|去|家)",
        r"我(?:现在|已经|早就)?(?:不再|不)(?:住|吃|喝|抽|用|做|在|是)[^。?!,]{0,12}了",
        r"(?:换|辞)(?:了)?(?:工作|职业|公司)|跳槽",
        r"我的新(?:邮箱|地址|电话|手机号?|号码|名字|工作|公司|电子邮件)|换了?新|新(?:手机号|号码|邮箱|地址|电话号码)",
        r"我现在(?:住在|住|在[^。?!]{1,10}(?:工作|上班|读书)|是)",
        r"我的[^。?!]{0,10}(?:以后|今后|往后)",
        r"(?:以后|今后|往后)[^。?!]{0,20}(?:别|不要|都要|都用|记得)",
        r"(?:离职|辞职|退休|毕业|创业)了",
        r"我(?:已经|刚|刚刚)?(?:从[^。?!]{1,10})?调到",
        r"(?:更正|纠正)(?:一下)?",
        r"我(?:已经)?(?:结婚|离婚|订婚)了",
        r"现在在[^。?!]{1,10}(?:上班|工作)",
    ),
    "ru": (
        r"\b(?:запомни|запомните|зафиксируи|зафиксируите|учти|учтите|имеи в виду|имеите в виду|не забываи|не забываите|не забудь|не забудьте|впредь|с этого момента|отныне|в дальнеишем|называи меня|зови меня|обращаися ко мне)\b",
        r"\b(?:запиши|запишите|отметь|отметьте|сохрани|сохраните)\b(?:\s+себе)?\s*(?:,?\s*что\b|:|мо|в памят|обо мне)",
        r"(?:^|[.!?,;:]\s*|пожалуиста,?\s+)забудь(?:те)?\b",
        r"\b(?:удали|удалите|сотри|сотрите|убери|уберите)\b[^.?!]{0,30}(?:\bмо|обо мне|из памяти|информац|то, что|всё|все)",
        r"\b(?:обнови|обновите|измени|измените|поменяи|поменяите)\b[^.?!]{0,10}\bмо",
        # implicit updates
        r"\bя больше не\b|(?:^|[.!?,;:]\s*|и\s+)больше не \w+(?:аи|яи|еи|и|ь)\b",
        r"\bя (?:стал|стала|окончил|окончила|закончил|закончила)\b",
        r"\bя (?:уже |теперь )?не (?:живу|работаю|ем|пью|курю|пользуюсь|веган|вегетарианец|вегетарианка)\b",
        r"\bя (?:недавно |уже )?(?:переехал|переехала|переехали|сменил|сменила|поменял|поменяла|бросил|бросила|женился|вышла замуж|развелся|развелась|уволился|уволилась)\b",
        r"\bмо(?:и|я|е) нов(?:ыи|ая|ое|ые)\b",
        r"\bпоправка\b",
        r"\bу меня (?:теперь |сеичас )?нов(?:ыи|ая|ое|ые)\b",
        r"\bвообще-то,? я\b",
        r"\bтеперь (?:я )?(?:живу|работаю)\b",
    ),
    "it": (
        _ROMANCE_START + r"(?:per favore,?\s+|ti prego,?\s+)?(?:ricorda|ricordatelo|memorizza|annota|segna|dimentica|scorda)\b(?!\s+(?:quando|come|cosa|dove|chi|se\b))",
        r"\b(?:ricordati|ricordatevi|segnati|annotati|memorizza|scordati|dimenticati|dimenticatelo)\b(?!\s+(?:quando|come|cosa|dove|chi|se\b))",
        r"\bprendi nota\b",
        r"\bricorda(?:lo|la|li|le|telo|tela)\b",
        r"\b(?:salva|salvati|registra)\b\s*(?:che|:|il mio|la mia|i miei|le mie)",
        r"\b(?:salva|aggiungi|metti|tieni)\b[^.?!]{0,30}\bnella (?:tua )?memoria\b",
        r"\btieni (?:presente|a mente|conto)\b",
        r"\bnon (?:dimenticare|scordare|scordarti|dimenticarti)\b",
        r"\b(?:cancella|elimina|rimuovi)\b[^.?!]{0,30}(?:quello che sai|\bmi\b|\bmio\b|\bmia\b|\bmiei\b|\bmie\b|memoria|di me\b)",
        r"\b(?:aggiorna|cambia|modifica)\s+(?:la|il|le|i|lo)?\s*(?:mia|mio|mie|miei)\b",
        r"\b(?:d'ora|da ora|da adesso|da oggi) in (?:poi|avanti)\b",
        r"\bchiamami\b",
        # implicit updates
        r"\bin realta,? (?:mi sono|sono|ho|abito|vivo|lavoro|non)\b",
        r"\bnon sono piu\b",
        r"\bnon (?:abito|vivo|lavoro|mangio|bevo|fumo|uso) piu\b",
        r"\b(?:mi sono|ci siamo) (?:\w+ )?(?:trasferit[oaie]|sposat[oaie]|separat[oaie])\b",
        r"\b(?:ho|abbiamo) (?:un|una|un') ?(?:\w+ )?nuov[oa]\b",
        r"\bho cambiato (?:lavoro|casa|citta|nome|numero|email|e-mail|indirizzo|azienda)\b",
        r"\b(?:la mia nuova|il mio nuovo|i miei nuovi|le mie nuove)\b",
        r"\bcorrezione\b",
        r"\b(?:ora|adesso|ormai|oramai) (?:lavoro|vivo|abito)\b",
        r"\bmi sono (?:licenziat[oa]|dimess[oa]|laureat[oa])\b",
        r"\bho smesso di\b",
        r"\b(?:sono diventat[oa]|ho finito (?:l'universita|gli studi|la scuola)|mi sono laureat[oa])\b",
        r"\b(?:togli|leva|rimuovi|cancella|elimina|aggiungi|metti|salva|scrivi)\b[^.?!]{0,40}\btua memoria\b",
        r"\bnon (?:mi )?(?:proporre|suggerire|consigliare|chiamare)\b[^.?!]{0,40}\bpiu\b",
    ),
    "es": (
        _ROMANCE_START + r"(?:por favor,?\s+)?(?:recuerda|memoriza|apunta|anota|olvida|olvidate)\b(?!\s+(?:cuando|como|que paso|donde|quien|si\b))",
        r"\b(?:acuerdate|acordate|apuntate|anotate)\b",
        r"\bno (?:olvides|te olvides)\b",
        r"\bque no se te olvide\b",
        r"\bque (?:borres|olvides|recuerdes|guardes|apuntes|anotes|actualices|cambies|elimines|memorices)\b",
        r"\b(?:puedes|podrias|quiero|necesito|debes)\s+(?:borrar|olvidar|guardar|apuntar|anotar|actualizar|eliminar|memorizar)\b",
        r"\btoma nota\b",
        r"\b(?:guarda|anota|apunta|agrega|anade|pon|mete)\b[^.?!]{0,30}\b(?:en|a) tu memoria\b",
        r"\bguarda (?:esto|eso|que|:|mi|mis)\b",
        r"\bten (?:en cuenta|presente)\b",
        r"\b(?:borra|elimina|quita)\b[^.?!]{0,30}(?:lo que sabes|\bmi\b|\bmis\b|de mi\b|tu memoria)",
        r"\b(?:actualiza|cambia|modifica)\s+(?:mi|mis)\b",
        r"\b(?:a partir de ahora|de ahora en adelante|desde ahora|en adelante)\b",
        r"\bllamame\b",
        # implicit updates
        r"\ben realidad,? (?:me|ya|vivo|trabajo|soy|estoy|tengo|no)\b",
        r"\bya no (?:soy|vivo|trabajo|como|bebo|fumo|estoy|tengo|uso)\b",
        r"\bme (?:mude|he mudado|case|he casado|divorcie|he divorciado)\b",
        r"\bme (?:acabo de|voy a) (?:mudar|casar)\b|\bnos (?:mudamos|hemos mudado|casamos)\b",
        r"\btengo (?:un|una) (?:\w+ )?nuev[oa]\b|\btengo (?:un|una) \w+ (?:de \w+ )?nuev[oa]\b",
        r"\bcambie de (?:trabajo|casa|ciudad|empleo|nombre|numero|correo|empresa)\b",
        r"\b(?:mi nuevo|mi nueva|mis nuevos|mis nuevas)\b",
        r"\bcorreccion\b",
        r"\bahora (?:trabajo|vivo|soy|estoy)\b",
        r"\b(?:deje|he dejado) de\b",
        r"\bya no me \w+(?:as|es)\b|\bno me \w+(?:as|es) mas\b",
        r"\b(?:me hice|me converti en|termine la carrera|me gradue|me he graduado)\b",
    ),
    "fr": (
        r"\b(?:souviens-toi|souvenez-vous|rappelle-toi|rappelez-vous)\b(?!\s+(?:quand|comment|de quand)\b)",
        _ROMANCE_START + r"(?:s'il te plait,?\s+|stp,?\s+)?(?:retiens|retenez|memorise|memorisez|oublie|oubliez)\b",
        r"\bnote(?:z)?\s+(?:que|bien|:)",
        r"\b(?:peux|pourrais|pouvez|pourriez|dois|veux que tu|voudrais que tu)(?:-tu|-vous)?\s+(?:oublier|effacer|supprimer|enregistrer|noter|memoriser|mettre a jour)\b",
        r"\bque tu (?:oublies|effaces|supprimes|retiennes|notes|enregistres|memorises)\b",
        r"\b(?:te|vous) (?:souvenir|rappeler) (?:que|de ce que)\b",
        r"\b(?:ajoute|enregistre|garde|mets)\b[^.?!]{0,30}\b(?:dans|a) ta memoire\b",
        r"\b(?:prends|prenez) (?:bien )?note\b",
        r"\bn'oublie(?:z)? (?:pas|jamais)\s*(?:que|:|mon|ma|mes)\b",
        r"\bgarde(?:z)? (?:en tete|a l'esprit|en memoire)\b",
        r"\b(?:supprime|supprimez|efface|effacez|retire|retirez)\b[^.?!]{0,30}(?:ce que tu sais|\bmon\b|\bma\b|\bmes\b|ta memoire|sur moi)",
        r"\b(?:mets|mettez) a jour (?:mon|ma|mes)\b",
        r"\b(?:change|changez|modifie|modifiez)\s+(?:mon|ma|mes)\b",
        r"\b(?:desormais|dorenavant|a partir de maintenant|a l'avenir)\b",
        r"\b(?:appelle|appelez)-moi\b",
        # implicit updates
        r"\ben fait,? (?:j'|je\b)",
        r"\bje ne suis plus\b",
        r"\bje n'(?:habite|vis|travaille|mange|bois|fume|utilise) plus\b",
        r"\bj'ai demenage\b|\b(?:je|j'|nous|on)\b[^.?!]{0,20}\bdemenag",
        r"\bje ne \w+ plus\b",
        r"\b(?:j'ai|nous avons|on a) (?:un|une) nouv(?:eau|el|elle)\b",
        r"\bj'ai change (?:de|d')\s*(?:travail|boulot|poste|job|nom|numero|adresse|ville|emploi|entreprise)",
        r"\b(?:ma nouvelle|mon nouveau|mon nouvel|mes nouveaux|mes nouvelles)\b",
        r"\bcorrection\b",
        r"\bje me suis (?:marie|mariee|installe|installee)\b",
        r"\bmaintenant,? (?:je|j')|\bje suis maintenant\b|\bje suis (?:a la retraite|enceinte|marie|mariee)\b",
        r"\bj'ai arrete de\b",
        r"(?<!je )(?<!j')\bne me \w+ plus\b",  # "ne me propose plus", not "je ne me souviens plus"
        r"\bje suis devenue?\b|\bj'ai eu mon (?:diplome|bac|master|permis)\b|\bje travaille (?:comme|desormais)\b",
        r"\benregistre(?:z)?\s+(?:que|:|mon|ma|mes)\b",
    ),
    "de": (
        r"\bmerk(?:e)? (?:es )?dir\b",
        r"\bmerken sie sich\b",
        r"\bdir (?:bitte )?merken,? dass\b",
        r"\bnotier(?:e)?(?: dir)?\b",
        r"(?:^|[.!?,;:]\s*|bitte\s+)vergiss\b",
        r"\bbehalte?\b[^.?!]{0,20}\bim (?:hinterkopf|kopf|gedachtnis)\b",
        r"\bdenk(?:e)? (?:dran|daran)\b",
        r"\bspeicher(?:e|n sie)?\b\s*(?::|,?\s*dass|mein|meine)",
        r"\b(?:losch|losche|loschen sie|entfern|entferne|vergiss)\b[^.?!]{0,30}(?:was du|\bmein|uber mich|deinem gedachtnis|deinem speicher)",
        r"\b(?:aktualisier|aktualisiere|ander|andere|anderst)\b\s+(?:bitte\s+)?(?:mein|meine|meinen)\b",
        r"\b(?:ab (?:jetzt|sofort|heute)|von nun an|kunftig|zukunftig|ab nun)\b",
        r"\bnenn(?:e)? mich\b",
        r"\bwas du (?:\w+ ){0,3}uber mich\b",
        r"\b(?:loschen|entfernen|vergessen|speichern|merken)\b[^.?!]{0,10}\b(?:was du|uber mich)\b",
        # implicit updates
        r"\b(?:ich bin|wir sind)\b[^.?!]{0,30}\b(?:umgezogen|gezogen)\b",
        r"\b(?:arbeite|wohne|lebe|esse|trinke|rauche) ich\b[^.?!]{0,30}\bnicht mehr\b",
        r"\b(?:ich habe|ich hab|wir haben) (?:eine|einen|ein) neue[nrs]?\b",
        r"\bich bin jetzt\b|\bich habe jetzt (?:einen|eine|ein)\b|\b(?:habe|hab) (?:mit dem \w+ )?aufgehort\b",
        r"\b(?:mein|meine|meinen)\b[^.?!]{0,30}\b(?:aktualisieren|andern|aktualisiert|geandert)\b",
        r"\bich bin (?:jetzt )?(?:nicht mehr|kein(?:e)? \w+ mehr)\b",
        r"\bich (?:wohne|arbeite|esse|trinke|rauche|lebe)\b[^.?!]{0,30}\bnicht mehr\b",
        r"\bich hab(?:e)?\b[^.?!]{0,30}\bgewechselt\b",
        r"\b(?:meine neue|mein neuer|mein neues|meine neuen)\b",
        r"\bkorrektur\b",
        r"\b(?:schlag|empfiehl|nenn|zeig|schick)(?:e)? mir\b[^.?!]{0,40}\b(?:mehr|nie wieder)\b",
        r"\b(?:habe|hab) (?:mein|meine|meinen) \w+ (?:abgeschlossen|beendet)\b|\bich bin\b[^.?!]{0,20}\bgeworden\b",
        r"\b(?:arbeite|bin) (?:jetzt |inzwischen )?als\b",
        r"\b(?:haben uns|habe mich) (?:getrennt|scheiden lassen|verlobt)\b|\bbin (?:jetzt )?(?:schwanger|in rente|verlobt|geschieden|verheiratet)\b",
        r"\bich habe geheiratet\b|\bich bin (?:jetzt )?verheiratet\b",
        r"\b(?:jetzt|inzwischen|mittlerweile) (?:arbeite|wohne|lebe) ich\b|\bich (?:arbeite|wohne|lebe) (?:jetzt|inzwischen|mittlerweile)\b",
    ),
    "pt": (
        r"\b(?:lembre-se|lembra-te|se lembre|lembre que|lembre de que)\b",
        _ROMANCE_START + r"(?:por favor,?\s+)?(?:lembra|lembre|memorize|memoriza|anote|anota|esqueca|esquece)\b(?!\s+(?:quando|de quando|o que|como|onde|qual|quem|se\b))",
        r"\bnao (?:se )?(?:esqueca|esquece|esquecer)\b",
        r"\b(?:guard[ae]|salv[ae]|grav[ae])\b(?: (?:ai|isso|isto|ai que))?\s*(?:que|:|meu|minha|meus|minhas)",
        r"\b(?:guard[ae]|salv[ae]|grav[ae]|coloque|coloca|adicione|adiciona)\b[^.?!]{0,30}\bna (?:sua |tua )?memoria\b",
        r"(?:^|[.!?,;:]\s*)(?:por favor,?\s+)?(?:esqueca|esquece)\b",
        r"\b(?:tenha|tem|tenham) em mente\b",
        r"\b(?:apague|apaga|remova|remove|exclua|delete|deleta)\b[^.?!]{0,30}(?:o que voce sabe|\bmeu\b|\bminha\b|\bmeus\b|\bminhas\b|sobre mim|da memoria)",
        r"\b(?:atualize|atualiza|mude|muda|altere|altera|troque|troca)\s+(?:o |a |os |as )?(?:meu|minha|meus|minhas)\b",
        r"\b(?:a partir de agora|de agora em diante|daqui (?:pra|para) frente)\b",
        r"\bme cham(?:e|a)\b",
        # implicit updates
        r"\bna verdade,? (?:eu )?(?:me|moro|trabalho|sou|estou|tenho|mudei|nao)\b",
        r"\bnao (?:sou|moro|trabalho|como|bebo|fumo|uso|estou|tenho|vivo|gosto) mais\b",
        r"\b(?:me mudei|mudei (?:de|para|pra)|me mudar (?:para|pra)|nos mudamos)\b",
        r"\btenho (?:um|uma) (?:\w+ ){0,3}nov[oa]\b",
        r"\b(?:meu novo|minha nova|meus novos|minhas novas)\b",
        r"\bcorrecao\b",
        r"\b(?:me casei|casei|me divorciei)\b",
        r"\bagora (?:eu )?(?:trabalho|moro|sou|estou)\b",
        r"\b(?:parei|deixei) de\b",
        r"\b(?:anota|anote|grava|grave) (?:ai|isso|que|:)",
        r"\bnao me \w+ mais\b",
        r"\b(?:virei|me tornei|me formei)\b",
    ),
    "ja": (
        r"覚えて(?:おいて|ください|ほしい|くれ|ね|よ|て)|覚えといて|覚えとけ|覚えておけ",
        r"(?:記憶|記録|メモ)(?:して(?:おいて|ください|ね|ほしい)|しといて|しておいて|っといて|っておいて)",
        r"忘れて(?:ください|ね|ほしい|くれ|いいよ|$|[。.!])|忘れないで",
        r"(?:削除|消去)して|消して(?:ください|おいて|ね)",
        r"(?:私|僕|俺|わたし|ぼく|おれ|自分)の[^。?!]{0,20}(?:更新|変更)して",
        r"(?:メール(?:アドレス)?|アドレス|住所|電話番号|名前|呼び方|好み|設定|情報|プロフィール)[^。?!]{0,40}(?:更新して|変更して|変えて)",
        r"(?:これから|今後|以後|次から|今度から)[^。?!]{0,20}(?:呼んで|して(?:ください|ね)?|話して|答えて|使って|書いて)",
        r"(?:と|って)呼んで",
        r"(?:これから|今後|以後|次から|今度から)[^。?!]{0,30}(?:ないで|ないでください|ないでね)",
        # implicit updates
        r"実は[^。?!]{0,20}(?:引っ越し|引越し|転職|結婚|離婚|辞め|変わ|やめ)",
        r"(?:引っ越し|引越し)(?:ました|た|てきた)",
        r"転職(?:し|した|しました)",
        r"もう[^。?!]{0,20}(?:じゃない|ではない|ではありません|じゃありません|[てで]い?(?:ない|なくて|ません)|やめ)",
        r"(?:電話番号|メールアドレス|アドレス|住所|名前|苗字|仕事|職場|勤務先|会社)が変わ(?:りました|った|ります)",
        r"新しい(?:メールアドレス|メール|アドレス|住所|電話番号|名前|仕事|職場|会社)",
        r"訂正",
        r"今は[^。?!]{0,20}(?:で働いて|に住んで|で暮らして|に勤めて|をしています|しています)",
        r"(?:別れ|結婚し|離婚し|婚約し|妊娠し|退職し|卒業し|入籍し)(?:ました|た)|卒業して",
    ),
}

# Words that ask for memory in an imperative but also tell of remembering ("I can't remember
# the title", "do you remember what I said?"): a match counts unless the text just before it
# (`before`, searched at the end of up to 40 characters) or just after it (`after`, matched
# at its start) shows it is a question or a story.
_KEYWORD_RULES: dict[str, tuple[tuple[str, str, str], ...]] = {
    "en": (
        (
            r"\b(?:remember|memori[sz]e|keep in mind|bear in mind)\b",
            r"(?:\b(?:i|we|they|he|she)\s+(?:\w+\s+)?|\b(?:do|did|does)\s+(?:you|it|they)\s+(?:\w+\s+)?"
            r"|\byou\s+(?:still|even|really|actually|ever|probably)\s+"
            r"|\b(?:hard|trying|try|tried|unable|able|how|what|ways?|help me)\s+to\s+"
            r"|\b(?:can't|cannot|cant|couldn't|don't|dont|didn't|won't|not)\s+(?:\w+\s+)?)$",
            r"\s*(?:when|to\b|how|what|where|who|whom|why|if|whether|which|anything|something|things|stuff"
            r"|everything|our\b|us\b|the\b|a\b|\?)",
        ),
        (
            r"\bforget\b",
            r"(?:\b(?:i|we|they|he|she|people|humans|kids)\s+(?:\w+\s+)?|\b(?:do|did|does)\s+(?:you|it|they)\s+(?:\w+\s+)?"
            r"|\byou\s+(?:still|always|often|ever|never|probably)\s+|\b(?:easy|tend|not)\s+to\s+)$",
            r"\s*(?:to\b|it\b|about it\b|how|where|why|when|whether|if\b|the\b|a\b|an\b|your\b"
            r"|things\b|stuff\b|\?)",
        ),
        (
            r"\bnote\b(?=\s*(?::|(?:that\s+)?(?:i\b|i'm\b|i've\b|my\b|me\b)))",
            r"\b(?:a|the|this|your|his|her|sticky|foot|end)\s+$",
            r"(?!)",
        ),
    ),
}

LANGUAGES: tuple[str, ...] = tuple(_PATTERNS)

# A message is read from both ends at most this far: a memory request in the middle of a
# 100 KB paste is rare, and the gate must stay cheap on any input.
MAX_SCANNED_CHARS = 4_000


def normalize(text: str) -> str:
    """`text` as the patterns read it: NFKC, casefolded, accents dropped, apostrophes
    straightened and whitespace collapsed."""
    text = unicodedata.normalize("NFKC", text).casefold().translate(_APOSTROPHES)
    text = unicodedata.normalize("NFC", _COMBINING_ACCENTS.sub("", unicodedata.normalize("NFD", text)))
    return "\n".join(" ".join(line.split()) for line in text.splitlines())


def _strip_accents(pattern: str) -> str:
    """A pattern written with accents, in the form normalized messages have."""
    return unicodedata.normalize("NFC", _COMBINING_ACCENTS.sub("", unicodedata.normalize("NFD", pattern)))


def _compile(patterns: Iterable[str]) -> re.Pattern[str]:
    # MULTILINE: a line of a message starts a sentence as well.
    return re.compile("|".join(f"(?:{_strip_accents(p)})" for p in patterns), re.MULTILINE)


@dataclass(frozen=True)
class _KeywordRule:
    keyword: re.Pattern[str]
    before: re.Pattern[str]
    after: re.Pattern[str]

    def search(self, text: str) -> bool:
        for found in self.keyword.finditer(text):
            if self.before.search(text[max(0, found.start() - 40) : found.start()]):
                continue
            if self.after.match(text, found.end()):
                continue
            return True
        return False


class IntentGate:
    """Decides whether a message expresses a memory intent (built-in patterns plus the
    operator's `trigger_phrases`, matched case-insensitively as substrings)."""

    def __init__(self, extra_phrases: Sequence[str] = ()) -> None:
        self._languages = {lang: _compile(patterns) for lang, patterns in _PATTERNS.items()}
        self._keyword_rules = {
            lang: tuple(
                _KeywordRule(*(re.compile(_strip_accents(p), re.MULTILINE) for p in rule))
                for rule in rules
            )
            for lang, rules in _KEYWORD_RULES.items()
        }
        self._phrases = tuple(dict.fromkeys(p for p in map(normalize, extra_phrases) if p))

    def matches(self, text: str) -> bool:
        """Whether `text` asks to remember, note, update, change or forget something."""
        return self.reason(text) is not None

    def reason(self, text: str) -> str | None:
        """What made `text` pass: a language code, or `phrase`; None when it does not."""
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
        return None
