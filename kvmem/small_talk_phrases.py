"""The phrase tables of kvmem/small_talk.py, per language: what a sentence of small talk may
be (social phrases, questions, tasks), the first-person words that only frame a request, and
the words that speak of the user, of memory or of a change.

Each table is a tuple of regular-expression alternatives written for text normalized by
kvmem.intent.normalize (casefolded; accents may be kept here, they are stripped when
kvmem/small_talk.py compiles the tables, as they are from messages). Languages: English,
Chinese, Russian, Italian, Spanish, French, German, Portuguese and Japanese; every table is
tried on every message. Data only: kvmem/small_talk.py decides what they mean together.
"""

from __future__ import annotations

# Greetings, thanks, acknowledgements, laughter, goodbyes: a sentence made only of these is
# social. They are peeled off the front of a sentence, so order longer phrases first.
SOCIAL = (
    # en
    r"(?:hi|hello|hey) there|hi|hello|hey+|hiya|yo|thanks|thank you(?: so much| very much| a lot)?|thx|ty|tysm|cheers",
    r"ok(?:ay)?|k+|cool|nice(?: one)?|great|awesome|perfect|got it|gotcha|sure|yes|yeah|yep|no|nope",
    r"alright|all right|right|lol|lmao|rofl|(?:a?h+a+)+h*|he(?:he)+|wow|oh|ah|hm+|bye|goodbye|see (?:you|ya)",
    r"good (?:morning|night|evening|afternoon)|np|no problem|you're welcome|sounds good|(?:that )?makes sense",
    r"i see|that's (?:great|funny|helpful|cool|nice|interesting|it|right)|that (?:was|is) (?:helpful|great|funny|useful)",
    r"that helped(?: a lot)?|well done|good job|exactly|indeed|interesting|fair enough|agreed|true|understood|noted",
    r"you're right|i agree|love it|i love it|lovely|amazing|brilliant|excellent|neat|sweet|fine",
    r"(?:(?:that's|that was|very|so|super) )?(?:helpful|useful)|(?:that|it) (?:helped|worked)(?: a lot)?",
    # zh
    r"你好|您好|嗨|哈喽|谢谢(?:你|您|啦)?|多谢|感谢|好的|好吧|好|嗯+|哦+|明白了?|知道了|收到|了解|没问题",
    r"早上好|早安|晚上好|下午好|晚安|再见|拜拜|哈+|呵呵|太棒了|不错|可以|行|对|是的|懂了|(?:很|非常)?有(?:帮助|用)|帮大忙了",
    # ru
    r"привет|здравствуй(?:те)?|спасибо(?: большое| огромное)?|благодарю|ок|окей|хорошо|ладно|понял|поняла",
    r"понятно|ясно|супер|класс|круто|отлично|ага|да|нет|пока|доброе утро|добрый (?:день|вечер)",
    r"доброй ночи|спокойной ночи|(?:а?х+а+)+х*|хех|лол|ну|(?:очень )?помогло|(?:очень )?полезно",
    # it
    r"ciao|salve|buongiorno|buonasera|buonanotte|grazie(?: mille| tante)?|va bene|perfetto|capito|certo",
    r"sì|si|ottimo|bene|bello|bella(?: questa)?|(?:a?h+a+)+h*|arrivederci|a dopo|figo|fantastico",
    r"utilissimo|(?:molto )?utile|mi è stato (?:molto )?utile",
    # es
    r"hola|buenos dias|buenas (?:tardes|noches)|buenas|(?:muchas )?gracias|vale|perfecto|entendido|genial",
    r"claro|(?:j+a+)+j*|(?:j+e+)+j*|adios|hasta luego|chao|muy util|de nada|bueno|listo|dale",
    r"me (?:sirvio|ayudo)(?: mucho)?|(?:muy )?util",
    # fr
    r"salut|bonjour|bonsoir|bonne nuit|merci(?: beaucoup)?|d'accord|parfait|super|genial|top|compris",
    r"oui|non|mdr|ptdr|a plus|au revoir|bonne journee|ca marche|nickel|tres bien|bien sur",
    r"c'est (?:parfait|super|top|genial|gentil|clair|note)|(?:tres )?utile|ca m'a (?:bien )?aide",
    # de
    r"hallo|moin|servus|guten (?:morgen|tag|abend)|gute nacht|danke(?: dir| schon| sehr)?|vielen dank",
    r"alles klar|passt|prima|klasse|genau|ja|nein|verstanden|stark|tschuss|bis dann|bis spater",
    r"(?:das )?hat (?:sehr )?geholfen|(?:sehr )?hilfreich",
    # pt
    r"oi|ola|bom dia|boa (?:tarde|noite)|(?:muito )?obrigad[oa]|valeu|beleza|blz|entendi|perfeito",
    r"legal|show|otimo|sim|nao|k{3,}|rs+|tchau|ate mais|ta bom|combinado|massa",
    r"ajudou(?: muito)?|(?:muito )?util",
    # ja
    r"こんにちは|こんばんは|おはよう(?:ございます)?|おやすみ(?:なさい)?|(?:どうも)?ありがとう(?:ございます|ございました)?",
    r"どうも|了解(?:です|しました)?|わかりました|分かりました|なるほど|はい|いいえ|うん|w+|笑|草|すごい",
    r"さようなら|またね|よろしく(?:お願いします)?|お疲れ様(?:です)?|助かりました|助かる",
)

# Words that ask; a sentence ending with "?" asks too.
QUESTIONS = (
    r"^(?:what|whats|why|how|hows|when|where|who|whom|whose|which|is|are|was|were|do|does|did"
    r"|can|could|should|would|will|shall|has|have|any (?:tips|ideas|suggestions))\b",
    r"^(?:che|cosa|come|perche|quando|dove|chi|quale|quali|quanto|quanta|quanti|quante|qual)\b",
    r"^(?:que|como|por que|cuando|donde|quien|cual|cuanto|cuanta|cuantos|cuantas)\b",
    r"^(?:quoi|comment|pourquoi|quand|ou|qui|quel|quelle|quels|quelles|combien|est-ce que|c'est quoi)\b",
    r"^(?:was|wie|warum|wann|wo|wer|welche\w*|wieviel\w*|gibt es|ist|sind|kann|kannst|hat|hast|weisst)\b",
    r"^(?:o que|onde|quem|quais|porque)\b",
    r"^(?:что|как|почему|зачем|когда|где|кто|какои|какая|какие|какое|сколько|можно|есть ли)\b",
    r"什么|怎么|为什么|如何|多少|几|哪|谁|是否|是不是|有没有|能不能|可不可以|吗|呢",
    r"何|なに|なん|どう|どこ|いつ|誰|だれ|どれ|どの|なぜ|いくら|いくつ|ですか$|ますか$",
)

# Imperatives that set a task, at the start of a sentence (after "please", "can you"...).
POLITE = (
    r"(?:(?:please|pls|plz|kindly|can you|could you|would you|will you|per favore|por favor|bitte"
    r"|s'il te plait|stp|svp|пожалуйста|请你?|麻烦你?|你能|能不能|可以)[\s,]*)*"
)
TASKS = (
    r"write|translate|summari[sz]e|sum up|explain|fix|convert|list|give|show|make|create|generate"
    r"|rewrite|correct|proofread|draft|compose|calculate|compute|tell|describe|compare|suggest"
    r"|recommend|find|help|define|outline|refactor|debug|optimi[sz]e|check|sort|name|brainstorm"
    r"|plan|review|improve|shorten|simplify|format|solve|draw|design|teach|search|look up"
    r"|paraphrase|continue|expand|implement|build|code|let's|use|add|include|try",
    r"scrivi\w*|traduci|spiega\w*|riassumi|correggi|dammi|dimmi|fammi|crea|genera|elenca|calcola"
    r"|suggerisci\w*|consiglia\w*|indica\w*|aiuta\w*|mostra\w*|racconta\w*|descrivi|confronta|trova|riscrivi"
    r"|migliora|proponi",
    r"escribe\w*|traduce|explica\w*|resume\w*|corrige|dame|dime|haz\w*|genera|calcula|sugiere\w*"
    r"|recomienda\w*|ayuda\w*|muestra\w*|cuenta\w*|describe|compara|busca|reescribe|mejora|propon\w*"
    r"|lista|enumera",
    r"ecri[st]\w*|tradui[st]\w*|explique\w*|conseille\w*|indique\w*|resume\w*|corrige\w*|donne\w*|dis-moi|fais\w*|cree\w*"
    r"|genere\w*|calcule\w*|propose\w*|recommande\w*|aide\w*|montre\w*|raconte\w*|decri[st]\w*"
    r"|compare\w*|trouve\w*|reecri[st]\w*|ameliore\w*|liste\w*",
    r"schreib\w*|übersetz\w*|erklär\w*|erzähl\w*|fass\w*|korrigier\w*|gib|sag|mach\w*|erstell\w*|berechne\w*"
    r"|zeig\w*|hilf|empfiehl|beschreib\w*|vergleich\w*|finde?|formulier\w*|verbesser\w*|schlag\w*"
    r"|liste?|generier\w*|rechne",
    r"escrev\w*|traduz\w*|traduza|explica\w*|explique|resum\w*|corrig\w*|corrija|diz|diga|faz"
    r"|faça|cria|crie|gera|gere|calcula|sugere|sugira|recomenda|ajuda|mostra|conta|descreve|compara"
    r"|procura|reescreve|melhora|lista|indica|me (?:explica|diz|da|dá|ajuda|mostra|conta|recomenda|manda|passa|indica)",
    r"напиши|переведи|объясни|расскажи|перескажи|сделаи|составь|посчитаи|исправь|помоги|подскажи|даи"
    r"|покажи|придумаи|сократи|опиши|сравни|наиди|предложи|посоветуи|перечисли|сгенерируи|создаи"
    r"|реши|кратко",
)
# A want that is a request for something ("I need ideas for...", "vorrei un consiglio"), not a
# fact; the same words are FRAMES below.
REQUESTS = (
    r"i need (?:a|an|some|ideas|help)|i(?:'d| would) like (?:a|an|some)|i want (?:a|an|some)",
    r"vorrei (?:un|una|uno|dei|delle|degli|sapere|capire)|mi serv\w+",
    r"necesito (?:un|una|unos|unas|ideas|ayuda|saber)|quiero (?:saber|entender|un|una)|quisiera",
    r"je (?:cherche|voudrais) (?:un|une|des|le|la|les|savoir)|j'aimerais (?:savoir|comprendre|un|une)"
    r"|j'ai besoin d'(?:un|une|aide|idees)",
    r"ich (?:brauche|hätte gern|möchte|suche) (?:ein|eine|einen|einem|etwas|hilfe|ideen|wissen)",
    r"quero (?:saber|entender|um|uma)|preciso de (?:um|uma|ajuda|ideias)|eu queria (?:saber|um|uma)",
    r"мне нужн\w+|я хочу (?:узнать|понять)|хочу (?:узнать|понять)",
    r"我想(?:知道|问|了解|请教)|我需要",
)

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
    r"(?:\b(?:my|mon|mein\w*|meu|mi|il mio)|мой|мои) (?:[\w]+[- ])?(?:code|codigo|codice|код|script|query|function|program\w*)\b",
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
)


# Words that point at the user, at memory, or at a change: a message with one is never
# small talk.
ABOUT_THE_USER = (
    # first person
    r"\b(?:i|i'm|im|i've|ive|i'd|i'll|me|my|mine|myself|we|we're|we've|our|ours|us)\b",
    r"我|俺|咱",
    r"(?<!\w)(?:я|меня|мне|мнои|мо(?:и|я|е|его|ему|ем|еи|ю|их|ими)|мы|нас|нам|наш\w*|сам)(?!\w)",
    r"\b(?:io|mi|me|mio|mia|miei|mie|noi|nostr\w|sono|ho|sto|vivo|abito|lavoro|studio|ero|avevo)\b",
    r"\b(?:yo|mi|mis|mio|mia|me|nosotros|nuestr\w+|soy|estoy|tengo|vivo|trabajo|estudio|tuve|fui)\b",
    r"\b(?:je|j'\w+|moi|me|m'\w+|mon|ma|mes|nous|notre|nos|jsuis|chui)\b",
    r"\b(?:ich|mich|mir|mein\w*|wir|uns|unser\w*|hab)\b",
    r"\b(?:eu|me|mim|meu|minha|meus|minhas|comigo|nos|nosso|nossa|sou|estou|tenho|moro|trabalho|estudo)\b",
    r"私|わたし|あたし|僕|ぼく|俺|おれ|自分|うちの|我が",
    # memory
    r"\b(?:remember|rememb\w*|remeber|forget|memor\w*|note|notes|save|store|record|delete|erase"
    r"|remove|wipe)\b",
    r"记|忘|删|存",
    r"запомн|забуд|забыть|удал|памят|сохран|запиш",
    r"\b(?:ricord|dimentic|cancell|salv|memori|segna|annot)\w*",
    r"\b(?:recuerd|acuerd|olvid|borr|guard|apunt|memori)\w*",
    r"\b(?:souvien|rappelle|retien|oubli|efface|supprim|enregistr|memoire|memoris|note)\w*",
    r"\b(?:merk|vergiss|vergessen|losch|speicher|notier|gedachtnis)\w*",
    r"\b(?:lembr|esquec|apag|anot|memoria)\w*",
    r"覚え|忘れ|記憶|メモ|保存|消して|削除",
    # change
    r"\b(?:now|anymore|any more|no longer|btw|fyi|actually|moved|switched|changed|new|since)\b",
    r"(?:^|\n)\w+(?: \w+)? here\b",  # "vegan here, what can I cook?"
    r"现在|已经|不再|刚|最近|搬|换了|新的|了[，,]",
    r"теперь|больше не|уже не|нов\w+|сеичас|переех|бросил",
    r"\b(?:ora|adesso|ormai|non \w+ piu|non piu|nuov\w+)\b",
    r"\b(?:ahora|ya no|nuev\w+)\b",
    r"\b(?:maintenant|desormais|nouveau|nouvelle|nouvel|ne \w+ plus|n'\w+ plus)\b",
    r"\b(?:jetzt|nicht mehr|kein\w* \w+ mehr|neu\w*|inzwischen|mittlerweile|seit)\b",
    r"\b(?:agora|nao \w+ mais|novo|nova)\b",
    r"今は|もう|最近|新しい|ました|ています|てます|てる|でした|んです|んだ|ですが|だけど|けど|ので",
)
