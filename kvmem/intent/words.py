"""The words kvmem/intent/small_talk.py looks for once a message's sentences are recognised: those
that speak of the user (first-person pronouns and verbs), of memory, or of a change, and the
ones set aside first because they only look like them (FRAMES: "help me", "I think", "my
code"; NOT_ABOUT_THE_USER: "memory leak", "New York", "explica de nuevo").

Written like kvmem/intent/phrases.py: regular-expression alternatives for normalized
text, accents stripped at compile time, the nine languages tried on every message. Data only.
"""

from __future__ import annotations

# First-person words that only frame a request; they are set aside before looking for the
# user in a message.
FRAMES = (
    r"\b(?:help|tell|give|show|teach|send|get|find|make|write|explain to|let) me\b|\blet me know\b",
    r"\b(?:can|could|should|may|might|do|would|shall) i\b|\bhow (?:do|can|should|would|could) i\b",
    r"\b(?:where|what|when|which|who) (?:do|can|should|would|could) i\b|\blike i'm five\b",
    r"\bi(?:'m| am) (?:bored|curious|wondering)\b|\bi (?:was )?wonder(?:ing)?\b",
    r"\bi(?: need|'d like| would like| want)(?: to (?:know|understand)| some| a| an| help| ideas)\b",
    r"\b(?:fix|check|review|improve|proofread|correct|rewrite|edit|translate|debug|format) my\b",
    r"\bfor me\b(?=[\s.!?]*(?:\n|$))",
    # "my code": work handed over, not a fact about the user
    r"(?:\b(?:my|mon|mein\w*|meu|mi|il mio)|мой|мои) (?:[\w]+[- ])?(?:code|codigo|codice|код|script|query|function|program\w*|app|css|html|regex|formula|layout|flexbox|sql"
    r"|component|loop|tests?|build|repo|branch|commit|essay|text|texto|testo|texte|paragraph|draft)\b",
    r"帮我|给我|告诉我|教我|请问|我想(?:知道|问|了解|请教)|我需要|我(?:该|应该)?怎么|我能|我可以",
    r"\b(?:объясни|подскажи|скажи|покажи|помоги|даи|напиши|расскажи|посоветуи)(?:те)? мне\b|\bкак мне\b"
    r"|\bмне нужн\w*\b|\bя хочу (?:узнать|понять)\b",
    r"\b(?:spiegami|dimmi|dammi|aiutami|mostrami|fammi|scrivimi|consigliami|suggeriscimi|raccontami)\b"
    r"|\bmi (?:spieghi|dici|dai|aiuti|mostri|scrivi|consigli|fai)\b|\bposso\b|\bcome faccio\b"
    r"|\bvorrei (?:un|una|uno|sapere|capire|dei|delle|degli)\b|\bmi serv\w+\b",
    r"\b(?:explicame|dime|dame|ayudame|muestrame|hazme|escribeme|recomiendame|cuentame)\b"
    r"|\bme (?:explicas|dices|das|ayudas|muestras|haces|escribes|recomiendas|puedes)\b|\bpuedo\b"
    r"|\bcomo hago\b|\bnecesito (?:un|una|unos|unas|ideas|ayuda|saber)\b|\bquiero (?:saber|entender|un|una)\b"
    r"|\bquisiera\b",
    r"\b(?:explique|dis|donne|aide|montre|fais|ecris|raconte|conseille|propose|indique)-moi\b"
    r"|\b(?:peux|pourrais)-tu m'|\btu peux m'|\best-ce que je peux\b|\bpuis-je\b|\bcomment je\b"
    r"|\bje (?:cherche|voudrais|veux savoir|me demande|aimerais savoir)\b"
    r"|\bj'aimerais (?:savoir|comprendre|un|une)\b|\bj'ai besoin d'(?:un|une|aide|idees)\b",
    r"\b(?:erklär|erkläre|erzähl|erzähle|sag|gib|zeig|hilf|schreib|schreibe|empfiehl|nenn|nenne) mir\b|\bhilfst du mir\b"
    r"|\bwie \w+ ich\b"
    r"|\b(?:kannst|könntest) du mir\b|\bwie (?:kann|soll|mache) ich\b|\b(?:kann|soll) ich\b"
    r"|\bich (?:brauche|hätte gern|möchte|will wissen|frage mich|suche)\b",
    r"\bme (?:explica|explique|diz|diga|da|dá|de|dê|ajuda|ajude|mostra|mostre|conta|conte|recomenda"
    r"|manda|passa|fala|indica)\b|\b(?:que|o que) (?:eu )?(?:faço|posso)\b|\b(?:explica|diz)-me\b|\bposso\b|\bcomo (?:eu )?(?:faço|posso)\b"
    r"|\bpor onde (?:eu )?começo\b|\bquero (?:saber|entender|aprender|um|uma)\b"
    r"|\bpreciso de (?:um|uma|ajuda|ideias)\b|\beu queria (?:saber|um|uma)\b",
    # an opinion, a confusion, a correction of the previous answer, a hypothetical retry
    r"\bi (?:think|guess|suppose|meant|mean|feel like)\b(?!')|\bwhat i (?:meant|asked|wanted|said)\b"
    r"|\b(?:do|would) you think i (?:should|could|can|need|ought)\b|\bi (?:still )?(?:don't|do not|dont|didn't|did not"
    r"|can't|cannot) (?:understand|get(?: it)?|follow|see)\b|\bi(?:'m| am) (?:confused|lost|not sure)\b|\bmy bad\b"
    r"|\bi prefer the (?:first|second|third|last|other|original|\d+(?:st|nd|rd|th))\b|\b(?:what|and) if i (?:want|wanted)"
    r" to\b|\bexplain (?:it )?me\b|\bas if i (?:were|was)\b|\bremind me (?:again )?(?=what|how|who|when|where|which|why)"
    r"|\bi(?:'m| am)? ?get(?:ting)? (?:this|an|the|a|same) (?:error|exception|warning)\b",
    r"\bsecondo me\b|\b(?:non )?(?:ho )?capit[oa]\b|\bnon capisco\b|\b(?:non )?intendevo\b|\bmi (?:da|esce) (?:sempre )?"
    r"(?:lo stesso |questo |un )?errore\b|\bcome se (?:avessi|fossi)\b|\bmi annoio\b|\bricordami (?=cosa|come|chi|qual|quando"
    r"|dove|che cos)|\bmi (?:correggi|traduci|prepari|riassumi|trovi|elenchi|suggerisci|racconti|crei|generi|calcoli"
    r"|controlli|rifai|riscrivi|mandi|passi|organizzi)\b",
    r"\b(?:creo|pienso) que\b|\bme parece que\b|\bpara mi\b|\bno (?:entiendo|entendi|comprendo)\b|\bquise decir\b"
    r"|\bme referia\b|\bme (?:da|sale|tira) (?:error|un error|este error|#)|\bcomo si (?:tuviera|fuera)\b"
    r"|\bme aburro\b|\bsi (?:quiero|quisiera)\b|\brecuerdame (?=que|como|cual|quien|cuando|donde)"
    r"|\bme (?:redactas|traduces|corriges|resumes|preparas|generas|calculas|buscas|cuentas|sugieres|armas|mandas|pasas)\b",
    r"\bje (?:pense|trouve|crois) que\b|\ba mon avis\b|\bpour moi\b|\b(?:je ne |je n'ai pas |j'ai pas |je )?(?:comprends|compris)"
    r" pas\b|\bj'ai pas compris\b|\bje voulais dire\b|\bj'ai (?:ce|cette|un|une) (?:bug|erreur|probleme|souci|message)"
    r"|\bcomme si j'(?:avais|etais)\b|\b(?:et )?si je (?:veux|voulais)\b|\bje m'ennuie\b"
    r"|\b(?:explique|dis|donne|aide|montre|fais|ecris|raconte|conseille|propose|indique|rappelle)[- ]moi\b"
    r"|\bje prefere (?:la|le) (?:premiere|deuxieme|troisieme|derniere|seconde|premier|second|dernier)\b",
    r"\bich finde\b|\bfinde ich\b|\bmeiner meinung nach\b|\bich (?:denke|glaube)\b|\bich versteh(?:e)? (?:das )?nicht\b"
    r"|\bversteh ich nicht\b|\b(?:ich )?meinte(?: ich)?\b|\bmir ist langweilig\b|\berinner(?:e)? mich\b(?=(?: (?:nochmal|noch mal|bitte))?,? "
    r"(?:was|wie|wer|wann|wo|welche|warum))|\bich (?:bekomme|kriege|krieg) (?:einen|diesen|den|immer)? ?fehler\b|\bals ob ich\b"
    r"|\bwenn ich (?:will|mochte)\b",
    r"\bacho que\b|\beu acho\b|\bpra mim\b|\bpara mim\b|\bnao (?:entendi|entendo)\b|\beu quis dizer\b"
    r"|\bme lembra\b(?= (?:o que|como|qual|quem|quando|onde))|\b(?:ta|esta) dando erro\b|\bme da erro\b"
    r"|\bcomo se eu (?:fosse|tivesse)\b|\b(?:to|estou) entediad\w\b|\b(?:corrige|revisa|melhora) (?:o |a )?(?:meu|minha)\b"
    r"|\be se eu quiser\b|\bme (?:traz|sugere|faz|escreve|corrige|traduz)\b",
    r"\bмне кажется\b|\bпо-моему\b|\bя думаю\b|\b(?:я )?не (?:понял|поняла|понимаю)\b|\bты не понял\w*\b"
    r"|\bя имел\w* в виду\b|\bу меня (?:ошибка|выдает|вылетает|не работает|не компилируется|падает)\b|\bмне скучно\b"
    r"|\bкак будто мне\b|\bнапомни(?:те)? (?=что|как|кто|когда|где|как)",
    r"我觉得|我认为|我感觉|我不(?:太)?(?:明白|懂)|我没(?:太)?(?:明白|懂)|我是说|我的意思是|笑死我了|我(?:这|的)?(?:代码|程序)?报错",
)

# Words that look like the user's, like memory's or like a change, and are not: technical
# memory, "new" in a name, "again" ("de novo", "di nuovo"), "actually" about a thing, "now"
# that asks for the same answer in another form, the Italian article "i" and conjunction "ma".
# They are set aside with FRAMES.
NOT_ABOUT_THE_USER = (
    r"\bmemory (?:leaks?|usage|management|allocation|footprint|errors?|limits?|safety|safe|cards?|sticks?|bandwidth"
    r"|address\w*|model|consumption|profil\w*|dump|pressure|layout)\b|\b(?:in|ram|heap|stack|gpu|shared|virtual|flash"
    r"|cache) memory\b|\bout of memory\b|\bmemory-\w+",
    r"\bmemoria (?:ram|cache|virtual\w*|flash|dinamica)\b|\b(?:fuga|fugas|perdida|perdita|perdite|vazamento|uso|gestion"
    r"|gestione|gestao|consumo|falta) (?:de |di |della |da )?memoria\b|\bfuite (?:de )?memoire\b|\bmemoire (?:vive|cache"
    r"|virtuelle|ram)\b|\b(?:speicher(?:leck|lecks|verbrauch|platz|verwaltung|karte|zugriff|bedarf)|arbeitsspeicher"
    r"|festplattenspeicher)\b|утечк\w* памяти|оперативн\w* памят\w*|(?:объем|расход|выделени\w*|управлени\w*|нехватк\w*)"
    r" памяти|内存|存储|存在|笔记本|日记|记者|登记|メモリ",
    r"\bnew (?:york|zealand|delhi|jersey|orleans|mexico|england|hampshire|year|line|tab|file|branch|column|row|version"
    r"|feature|object|instance|array|window|page)\b|\bwhat'?s new\b|\bsince when\b",
    # "again" after a verb that asks for the answer again ("explica de nuevo"; not "embarazada
    # de nuevo")
    r"\b(?:explic|expliqu|explain|intent|haz|dil|escrib|faz|fazer|diz|spieg|prov|riprov|fall|dill|scriv|tent|fais|refai"
    r"|dis|ecri)\w*(?: \w+)? (?:de|di) (?:novo|nuevo|nuovo|nouveau)\b|\bneu (?:formulier|schreib|mach)\w*\b"
    r"|\b(?:formulier|schreib)\w* (?:\w+ )?neu\b",
    r"\b(?:that's|thats|that is|it's|its|it is|this is|is|was|are|were) actually\b",
    # "now" that asks for the answer again in another form ("now in French"; not "now in Berlin")
    r"\bnow (?=do\b|make\b|translate|write|try\b|give\b|show\b|explain|rewrite|say\b|put\b|turn\b|the same\b)"
    r"|\b(?:now|ahora|agora|adesso|ora|maintenant|jetzt|теперь) (?=(?:in|en|em|auf|на) (?:english|french|german"
    r"|spanish|italian|ingles|frances|aleman|italiano|portugues|espanol|inglese|francese|tedesco|spagnolo|anglais"
    r"|allemand|espagnol|italien|englisch|franzosisch|spanisch|английском|немецком|французском)\b|lo mismo|lo stesso"
    r"|la meme chose|dasselbe|o mesmo|то же|так же|переведи|сделай|traduc|tradu|ubersetz|haz\b|fai\b|fais\b|mach\b"
    r"|faz\b)|现在用(?=英文|英语|中文|日语)",
    r"\b(?:di|a|da|in|con|su|per|tra|fra|tutti|sono|e|che|chi|quali|quanti|scritto|anche|tutte) i\b(?!')"
    r"|\bma (?=quindi|come|perche|non\b|se\b|e\b|io\b|tu\b|anche|poi\b|il\b|lo\b|che\b|cosa|dove|quando|allora|davvero"
    r"|dai\b|va\b)",
    r"(?:算|说|写|理解|翻译)?错了|太\w了|你刚才|刚才你|刚才的|(?:でした|だった)っけ|もう(?:少し|すこし|ちょっと|一度|いちど|一回|ひとつ|一つ)",
)


# Words that point at the user, at memory, or at a change: a message with one is never
# small talk. First the user: pronouns, and verbs in the first person that state a fact
# without one ("sono celiaca", "Bin Elektroniker", "uso sempre LibreOffice").
FIRST_PERSON = (
    r"\b(?:i|i'm|im|i've|ive|i'd|i'll|me|my|mine|myself|we|we're|we've|our|ours|us)\b",
    r"我|俺|咱",
    r"(?<!\w)(?:я|меня|мне|мнои|мо(?:и|я|е|его|ему|ем|еи|ю|их|ими)|мы|нас|нам|наш\w*|сам)(?!\w)",
    r"\b(?:io|mi|me|mio|mia|miei|mie|noi|nostr\w|sono|ho|sto|vivo|abito|lavoro|studio|ero|avevo|faccio|mangio|bevo"
    r"|fumo|insegno|gioco|soffro|preferisco|odio|guido|frequento|pratico|cucino|abbiamo|siamo|viviamo|lavoriamo)\b",
    r"\b(?:yo|mi|mis|mio|mia|me|nosotros|nuestr\w+|soy|estoy|tengo|vivo|trabajo|estudio|tuve|fui|hago|bebo|fumo"
    r"|enseno|juego|sufro|padezco|prefiero|odio|manejo|conduzco|cocino|entreno|tenemos|vivimos|trabajamos|somos)\b",
    r"\b(?:je|j'\w+|moi|me|m'\w+|mon|ma|mes|nous|notre|nos|jsuis|chui)\b|\bon (?:a|est|s'est|vient|habite|vit)\b",
    r"\b(?:ich|mich|mir|mein\w*|wir|uns|unser\w*|hab|habe|bin|wohne|arbeite|lebe|studiere|rauche|trinke)\b",
    r"\b(?:eu|me|mim|meu|minha|meus|minhas|comigo|nos|nosso|nossa|sou|estou|tenho|moro|trabalho|estudo|faco|bebo|fumo"
    r"|ensino|jogo|sofro|prefiro|odeio|dirijo|cozinho|treino|temos|moramos|trabalhamos|somos)\b",
    r"私|わたし|あたし|僕|ぼく|俺|おれ|自分|うちの|我が",
    r"(?:^|\n|[,;:] ?)(?:uso|usiamo|usamos)\b",
    r"(?<!\w)(?:живу|работаю|учусь|ем|пью|курю|занимаюсь|люблю|предпочитаю|болею|беременна|замужем|женат)(?!\w)",
)
# Words of memory: to remember, forget, note, save, delete.
MEMORY_WORDS = (
    r"\b(?:remember|rememb\w*|remeber|rember|remmb\w*|rmbr|forget|memor\w*|note|notes|save|store"
    r"|record|delete|erase|remove|wipe|remind me (?:to|that))\b",
    # simplified and traditional; 再…提: "别再跟我提我前男友的事" (don't bring it up again)
    r"记|記|忘|删|刪|存|再.{0,3}提",
    r"\bji ?zhu\b|\b(?:oboe|wasure)\w*",  # romanized 记住, 覚え, 忘れ ("jizhu wo bu chi la de")
    r"запомн|запомина|забуд|забыв|забыть|удал|памят|сохран|запиш",
    r"\b(?:ricord|dimentic|salv|memori|segna|annot)\w*|\bcancell(?:a|i|o|are|ato|ata|ati|ami|alo|ala|ali|ale)\b",
    r"\b(?:recuerd|acuerd|olvid|guard|apunt|memori)\w*|\bborr(?:a|ar|e|en|es|o|ado|ada|ados|adas|alo|ala|alos|alas|ame"
    r"|ando)\b",  # not "borrow"
    r"\b(?:souvien|rappelle|retien|oubli|efface|supprim|enregistr|memoire|memoris|note)\w*",
    r"\b(?:merk|vergiss|vergessen|losch|speicher|notier|gedachtnis)\w*",
    r"\b(?:lembr|esquec|apag|anot|memoria)\w*",
    r"覚え|忘れ|記憶|メモ|保存|消して|削除|もう出さ",  # もう出さないで: don't bring it up again
)
# Life events, which state a fact even without a pronoun ("retired last month, hobby ideas?");
# like memory words, the intent gate's classifier never skips them.
LIFE_EVENTS = (
    r"\b(?:retired|divorced|widowed|pregnant|engaged|graduated|incinta|in pensione|embarazada|jubilad[oa]|gravida"
    r"|aposentad[oa]|enceinte|a la retraite|schwanger|in rente|umgezogen|geheiratet|gekundigt)\b|беременн|на пенсии"
    r"|怀孕|退休|妊娠|退職",
    # an adoption, of a child or a pet ("on a adopté un lapin nain, il peut manger des carottes ?")
    r"\b(?:adopted|adopt(?:e|ee|es|ees|ons|ado|ada|ados|adas|amos|iert|ierte)|adott(?:ato|ata|ati|ate)"
    r"|adot(?:ei|ado|ada|amos))\b|усынов|удочер|领养|收养|養子|里親",
    # one's name, given without a pronoun ("Name's Bob, by the way."), or who one is ("vegan
    # here, what can I cook tonight?")
    r"(?:^|[\n.!?;,] ?)name's\b",
    r"(?:^|\n)\w+(?: \w+)? here\b",
    # a fact about one's family ("my son is 4", "mio figlio ha 4 anni")
    r"\bmy (?:son|daughter|kids?|child|children|wife|husband|partner|boyfriend|girlfriend|mom|mum|mother|dad|father"
    r"|brother|sister|dog|cat)(?:'s| is| has| was| just)\b|\b(?:mio|mia) (?:figli[oa]|marito|moglie) (?:ha|e)\b"
    r"|\bmi (?:hij[oa]|esposo|esposa|marido|mujer) (?:tiene|es|esta)\b|\b(?:mon|ma) (?:fils|fille|mari|femme) (?:a|est)\b"
    r"|\bmein(?:e)? (?:sohn|tochter|mann|frau) (?:ist|hat)\b|\b(?:meu|minha) (?:filh[oa]|marido|esposa|mulher) (?:tem|e|esta)\b"
    r"|\b(?:мой|моя) (?:сын|дочь|муж|жена)\b|我(?:儿子|女儿|老公|老婆|妻子|丈夫)",
)
# Words of a standing instruction or an update, not a one-off task: like memory words, the
# intent gate's classifier never skips them ("今後、見積もりは全部税込表示でお願いします",
# "aggiorna: il negozio ora chiude alle 19:30").
STANDING = (
    r"\b(?:from now on|going forward|from here on)\b|以后|今后|从今以后|впредь|отныне|с этого момента|в дальнейшем"
    r"|\b(?:d'ora in (?:poi|avanti)|da ora in poi|de ahora en adelante|a partir de (?:ahora|agora|maintenant)"
    r"|dorenavant|a l'avenir|ab (?:jetzt|sofort)|kunftig|zukunftig|de agora em diante|daqui (?:pra|para) frente)\b"
    r"|今後|以後|次から|今度から",
    r"(?:^|\n)(?:update|aggiorna|aggiornamento|actualiza|actualizacion|mise a jour|aktualisierung|atualiza"
    r"|atualizacao|обновление|обнови|更新|アップデート)(?: \w+)? ?:",  # "actualiza eso: entreno a las 7"
)
# Words of a change: a fact about the user that is new, or no longer true.
CHANGE_WORDS = (
    r"\b(?:now|anymore|any more|no longer|btw|fyi|actually|moved|switched|changed|new|since)\b",
    *LIFE_EVENTS,
    *STANDING,
    r"现在|已经|不再|刚|最近|搬|换了|新的|了[，,]",
    r"теперь|больше не|уже не|нов\w+|сеичас|переех|бросил",
    r"\b(?:ora|adesso|ormai|non \w+ piu|non piu|nuov\w+)\b",
    r"\b(?:ahora|ya no|nuev\w+)\b",
    r"\b(?:maintenant|desormais|nouveau|nouvelle|nouvel|ne \w+ plus|n'\w+ plus)\b",
    r"\b(?:jetzt|nicht mehr|kein\w* \w+ mehr|neu\w*|inzwischen|mittlerweile|seit)\b",
    r"\b(?:agora|nao \w+ mais|novo|nova)\b",
    r"今は|もう|最近|新しい|ました|ています|てます|てる|でした|んです|んだ|ですが|だけど|けど|ので",
)
ABOUT_THE_USER = FIRST_PERSON + MEMORY_WORDS + CHANGE_WORDS
