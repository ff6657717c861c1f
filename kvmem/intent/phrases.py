"""The sentence tables of kvmem/intent/small_talk.py, per language: what a sentence of small talk
may be. Social phrases (greetings, thanks, laughter, compliments, rejections like "wait" that
are peeled off the front), questions, tasks, follow-ups on the previous answer ("shorter",
"in French", "that's not what I meant"), opinions on the options it gave, remarks on the day,
and the lines of pasted code that are set aside.

Each table is a tuple of regular-expression alternatives written for text normalized by
kvmem.intent.gate.normalize (casefolded; accents may be kept here, they are stripped when
kvmem/intent/small_talk.py compiles the tables, as they are from messages). Languages: English,
Chinese, Russian, Italian, Spanish, French, German, Portuguese and Japanese; every table is
tried on every message. Data only: kvmem/intent/small_talk.py decides what they mean together, and
kvmem/intent/words.py holds the words that speak of the user.
"""

from __future__ import annotations

# Greetings, thanks, acknowledgements, laughter, goodbyes: a sentence made only of these is
# social. They are peeled off the front of a sentence, so order longer phrases first.
SOCIAL = (
    # phrases that begin with a shorter social word ("no", "genau", "ok"), which would
    # otherwise be peeled alone
    r"no problem|no worries|no puedo(?: mas)?|genau so|ok merci|ok grazie|no pasa nada|non c'e problema|sem problema",
    r"了解(?:です|しました)",  # before the Chinese "了解"
    # en
    r"(?:hi|hello|hey) there|hi|hello|hey+|hiya|yo|(?:thanks|thank you|thx|ty)(?: so much| very much| a lot| a ton| again| man| mate)?",
    r"tysm|cheers|my bad|no worries|all good|(?:that's |that is )?exactly what i (?:needed|wanted|was looking for)",
    r"(?:you're|you are|ur) (?:the best|a lifesaver|a genius|awesome|amazing|great|hilarious|funny|so funny)|you rock",
    r"(?:that's|thats|that is|this is|it's|so|too) (?:so |actually |really |very |pretty |kinda )?(?:funny|hilarious|cute|wild|weird|crazy|good|great|cool|nice|perfect|brilliant|clever|smart)",
    r"lmao|lo+l|xd|omg|oh wow|good one|i can't even|hilarious|everyone|y'all|guys|folks",
    # interjections that reject or pause the previous answer ("wait, that's wrong"); what
    # follows them must be recognised on its own
    r"wait|hold on|hmm+|never ?mind|nvm|not quite|(?:that's|thats|that is) (?:wrong|not it|incorrect)|wrong"
    r"|aspetta|sbagliato|non (?:e|era) (?:questo|quello|cosi)|espera|no (?:era|es) eso|eso no es|(?:esta|estas) mal"
    r"|attends|(?:c'est |ce n'est )?pas ca|c'est faux|warte|moment|(?:das ist )?falsch|stimmt nicht|nee"
    r"|errado|(?:ta|esta) errado|nao (?:e|era|foi) (?:isso|bem isso)|подожди|стоп|(?:это )?не то|неправильно|не так"
    r"|不对|不是这个|等等|错了|いや|違う|ちがう|ちょっと違う(?:かな)?|そうじゃなく(?:て)?|待って|うーん",
    r"ok(?:ay)?|k+|cool|nice(?: one)?|great|awesome|perfect|got it|gotcha|sure|yes|yeah|yep|no|nope",
    r"alright|all right|right|rofl|(?:a?h+a+)+h*|he(?:he)+|wow|oh|ah|hm+|bye|goodbye|see (?:you|ya)",
    r"good (?:morning|night|evening|afternoon)|np|no problem|you're welcome|sounds good|(?:that )?makes sense",
    r"i see|that's (?:great|funny|helpful|cool|nice|interesting|it|right)|that (?:was|is) (?:helpful|great|funny|useful)",
    r"that's (?:me done|it|all) for (?:now|today|tonight|the day)|that's me done|that helped(?: a lot)?|well done|good job|exactly|indeed|interesting|fair enough|agreed|true|understood|noted",
    r"you're right|i agree|love it|i love it|lovely|amazing|brilliant|excellent|neat|sweet|fine",
    r"(?:(?:that's|that was|very|so|super) )?(?:helpful|useful)|(?:that|it) (?:helped|worked)(?: a lot)?",
    # zh
    r"你好|您好|嗨|哈喽|谢谢(?:你|您|啦)?|谢了|多谢|笑死(?:我了)?|(?:你)?(?:好|太|真)?逗(?:了)?|(?:太|很|真)?(?:好笑|搞笑|厉害|牛|棒)了?|绝了|感谢|好的|好吧|好|嗯+|哦+|明白了?|知道了|收到|了解|没问题",
    r"早上好|早安|晚上好|下午好|晚安|再见|拜拜|哈+|呵呵|太棒了|不错|可以|行|对|是的|懂了|(?:很|非常|太)?有(?:帮助|用)了?|帮大忙了",
    # ru
    r"привет|здравствуй(?:те)?|спасибо(?: большое| огромное)?|благодарю|ок|окей|хорошо|ладно|понял|поняла",
    r"понятно|ясно|супер|класс|круто|отлично|ага|да|нет|пока|доброе утро|добрый (?:день|вечер)",
    r"доброй ночи|спокойной ночи|(?:а?х+а+)+х*|хех|лол|ну ты даёшь|ты даёшь|ну|спс|пасиб\w*|огонь|ору|смешно"
    r"|ты (?:лучший|лучшая|супер|гений|молодец)|молодец|топ|жесть|всем|ребята|(?:очень )?помогло|(?:очень )?полезно",
    # it
    r"ciao|salve|buongiorno|buonasera|buonanotte|grazie(?: mille| tante)?|va bene|perfetto|capito|certo",
    r"sì|si|ottimo|bene|bello|bella(?: questa)?|(?:a?h+a+)+h*|arrivederci|a dopo|figo|fantastico",
    r"utilissimo|(?:molto )?utile|mi è stato (?:molto )?utile|\w+issim[oaie](?: quest[oa])?|sei (?:un tesoro|il migliore|la migliore|un grande|un mito|un genio|grande|fantastico)"
    r"|grande|mitico|geniale|che ridere|troppo forte|a tutti|tutti",
    # es
    r"hola|buenos dias|buenas (?:tardes|noches)|buenas|(?:muchas )?gracias|vale|perfecto|entendido|genial",
    r"claro|(?:j+a+)+j*|(?:j+e+)+j*|adios|hasta luego|chao|muy util|de nada|bueno|listo|dale",
    r"me (?:sirvio|ayudo)(?: mucho)?|(?:muy )?util|\w+isim[oa]s?|crack|maquina|porfa|mil gracias|que risa|no puedo(?: mas)?"
    r"|eres (?:lo maximo|el mejor|la mejor|un crack|una crack|un genio|una genia)|lo maximo|me (?:salvaste|has salvado) (?:la vida|el dia)|a todos",
    # fr
    r"salut|bonjour|bonsoir|bonne nuit|merci(?: beaucoup)?|d'accord|parfait|super|genial|top|compris",
    r"oui|non|mdr|ptdr|a plus|au revoir|bonne (?:journee|soiree|semaine|fin de journee)|ca marche|nickel|tres bien|bien sur",
    r"(?:t'es|tu es) (?:trop |vraiment )?(?:fort|forte|drole|genial|geniale|le meilleur|la meilleure|un genie)|trop (?:drole|fort|bien|cool|marrant)"
    r"|excellent|pas mal|a tous|tout le monde",
    r"c'est (?:parfait|perfect|super|top|genial|gentil|clair|note|drole|marrant|excellent|exactement ca)|(?:tres )?utile|ca m'a (?:bien )?aide",
    # de
    r"hallo|moin|servus|guten (?:morgen|tag|abend)|gute nacht|danke(?: dir| schon| sehr)?|vielen dank",
    r"alles klar|passt|prima|klasse|genau|ja|nein|verstanden|stark|tschuss|bis dann|bis spater",
    r"(?:das )?hat (?:sehr )?geholfen|(?:sehr )?hilfreich|geil|krass|lustig|witzig|genau so|mega|spitze|hammer|zusammen|alle"
    r"|du bist (?:der beste|die beste|super|genial|klasse)|schonen (?:tag|abend|feierabend)",
    # pt
    r"oi|ola|bom dia|boa (?:tarde|noite)|(?:muito )?obrigad[oa]|valeu|beleza|blz|entendi|perfeito",
    r"legal|show|otimo|sim|nao|k{3,}|rs+|tchau|ate mais|ta bom|combinado|massa",
    r"ajudou(?: muito)?|(?:muito )?util|vlw|obg|brigad[oa]|top|show de bola|demais|arrasou|(?:voce|vc) e (?:o|a) melhor|(?:me )?salvou|pessoal|galera|gente",
    # ja
    r"こんにちは|こんばんは|おはよう(?:ございます)?|おやすみ(?:なさい)?|(?:どうも)?ありがとう(?:ございます|ございました)?",
    r"どうも|了解(?:です|しました)?|わかりました|分かりました|なるほど|はい|いいえ|うん|w+|笑|草|すごい",
    # thanks that say it helped or worked ("Sie haben mir sehr geholfen", "できました")
    r"(?:sie haben|du hast|ihr habt) mir (?:sehr |echt |wirklich )?(?:weiter)?geholfen|(?:das )?hilft mir (?:sehr|echt|weiter)"
    r"|herzlichen dank|danke vielmals|jo+|je vous remercie|merci (?:bien|infiniment|mille fois)|vous m'avez (?:bien |beaucoup )?aide"
    r"|(?:очень |сильно )?выручил[аи]?|так и (?:отправлю|сделаю)|mi hai (?:salvato|aiutato)|me has ayudado|voce me ajudou"
    r"|(?:うまく)?(?:でき|いき)ました|助かります|参考になりました|参考になります|さすがです|解決しました",
    r"さようなら|またね|よろしく(?:お願いします)?|お疲れ様(?:です)?|助かりました|助かった|助かる|それな|草生える|まじか|うける|ウケる"
    r"|さすが|いいね|確かに|たしかに|おもしろい|面白い|ワロタ|(?:今日|きょう)(?:も|は)?(?:暑|寒|いい天気|雨)\w*?(?:です)?ね[ー〜]*",
)

# Words that ask; a sentence ending with "?" asks too.
QUESTIONS = (
    r"^(?:what|whats|why|how|hows|when|where|who|whom|whose|which|is|are|was|were|do|does|did"
    r"|can|could|should|would|will|shall|has|have|any (?:tips|ideas|suggestions))\b",
    r"^(?:che|cosa|come|perche|quando|dove|chi|quale|quali|quanto|quanta|quanti|quante|qual|puoi|potresti|sai|c'e|ci sono|e vero)\b",
    r"^(?:que|como|por que|cuando|donde|quien|cual|cuanto|cuanta|cuantos|cuantas|puedes|podrias|sabes|hay|es verdad)\b",
    r"^(?:quoi|comment|pourquoi|quand|ou|qui|quel|quelle|quels|quelles|combien|est-ce que|c'est quoi"
    r"|(?:peux|pourrais|pouvez|pourriez|sais)-(?:tu|vous)|tu (?:peux|pourrais|sais)|y a-t-il|il y a)\b",
    r"^(?:was|wie|warum|wieso|weshalb|wozu|woher|wohin|wann|wo|wer|welche\w*|wieviel\w*|gibt es|ist|sind|kann|kannst|konntest|hat|hast|weisst)\b",
    r"^(?:o que|onde|quem|quais|porque|quant[oa]s?|cade|sera que|pode|podes|(?:voce|vc) (?:pode|sabe|consegue)|tem como)\b",
    r"^(?:что|как|почему|зачем|когда|где|кто|какои|какая|какие|какое|сколько|можно|есть ли|разве|чем|откуда|куда|можешь|сможешь)\b",
    r"什么|怎么|为什么|如何|多少|多久|多长|多远|多大|多高|怎样|啥|几|哪|谁|是否|是不是|有没有|能不能|可不可以|吗|呢|来着",
    r"何|なに|なん|どう|どこ|いつ|誰|だれ|どれ|どの|なぜ|いくら|いくつ|ですか$|ますか$|っけ$|かな$|でしょうか$",
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
    r"|paraphrase|continue|expand|implement|build|code|let's|use|add|include|try|rephrase|reword|redo|elaborate"
    r"|clarify|tweak|polish|adjust|edit|put (?:it|this|that)|turn (?:it|this|that)|break down|walk me through|go through"
    r"|remind me (?:again )?(?:what|how|who|when|where|which|why|of what)",
    r"scrivi\w*|traduci|spiega\w*|riassumi|correggi|dammi|dimmi|fammi|crea|genera|elenca|calcola"
    r"|suggerisci\w*|consiglia\w*|indica\w*|aiuta\w*|mostra\w*|racconta\w*|descrivi|confronta|trova|riscrivi"
    r"|migliora|proponi|riassum\w*|riformula\w*|rendi\w*|rifai|metti|aggiungi|togli|accorcia|allunga|traducimi"
    r"|ricordami (?:cosa|come|chi|qual\w*|quando|dove|che cos)"
    r"|mi (?:fai|dai|dici|scrivi|spieghi|correggi|traduci|consigli|prepari|riassumi|mostri|trovi|elenchi|suggerisci"
    r"|racconti|aiuti|crei|generi|calcoli|controlli|rifai|riscrivi|mandi|passi|organizzi)",
    r"escribe\w*|traduce|explica\w*|resume\w*|corrige|dame|dime|haz\w*|genera|calcula|sugiere\w*"
    r"|recomienda\w*|ayuda\w*|muestra\w*|cuenta\w*|describe|compara|busca|reescribe|mejora|propon\w*"
    r"|lista|enumera|reformula|redacta|ponlo|pon|añade|agrega|quita|acorta|vuelve a"
    r"|recuerdame (?:que|como|cual|quien|cuando|donde) (?:es|son|significa|era|eran|fue|se|hace)"
    r"|me (?:redactas|escribes|explicas|dices|das|haces|ayudas|recomiendas|pasas|traduces|corriges|resumes"
    r"|preparas|generas|calculas|buscas|cuentas|muestras|sugieres|armas|mandas)",
    r"ecri[st]\w*|tradui[st]\w*|explique\w*|conseille\w*|indique\w*|resume\w*|corrige\w*|donne\w*|dis-moi|fais\w*|cree\w*"
    r"|genere\w*|calcule\w*|propose\w*|recommande\w*|aide\w*|montre\w*|raconte\w*|decri[st]\w*"
    r"|compare\w*|trouve\w*|reecri[st]\w*|ameliore\w*|liste\w*|reformule\w*|ajoute\w*|mets|enleve|raccourcis"
    r"|detaille\w*|refais|recommence|rappelle-moi (?=ce qu|comment|qui|quand|ou|quel|pourquoi)",
    r"schreib\w*|übersetz\w*|erklär\w*|erzähl\w*|fass\w*|korrigier\w*|gib|sag|mach\w*|erstell\w*|berechne\w*"
    r"|zeig\w*|hilf|empfiehl|beschreib\w*|vergleich\w*|finde?|formulier\w*|verbesser\w*|schlag\w*"
    r"|liste?|generier\w*|rechne|kurz\w*|mach's|machs|fug\w*|nimm|streich\w*"
    r"|erinner(?:e)? mich(?: (?:nochmal|noch mal|bitte))?,? (?=was|wie|wer|wann|wo|welche|warum)",
    r"escrev\w*|traduz\w*|traduza|explica\w*|explique|resum\w*|corrig\w*|corrija|diz|diga|faz"
    r"|faça|cria|crie|gera|gere|calcula|sugere|sugira|recomenda|ajuda|mostra|conta|descreve|compara"
    r"|procura|reescreve|melhora|lista|indica|reformul\w*|deixa|deixe|coloca|coloque|adiciona|tira|encurta|refaz"
    r"|me lembra (?:o que|como|qual|quem|quando|onde)|me (?:traz|sugere|faz|escreve|corrige|traduz|explica|diz|da|dá|ajuda|mostra|conta|recomenda|manda|passa|indica)",
    r"напиши|переведи|объясни|расскажи|перескажи|сделаи|составь|посчитаи|исправь|помоги|подскажи|даи"
    r"|покажи|придумаи|сократи|опиши|сравни|наиди|предложи|посоветуи|перечисли|сгенерируи|создаи"
    r"|реши|кратко|переформулируй|перепиши|сделай|добавь|убери|давай|продолжи"
    r"|напомни(?:те)? (?:что|как|кто|когда|где|какой|какая|какие)",
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

# Follow-ups: what a user says about the previous answer. At the start of a sentence (after
# any social words): a change asked for ("shorter", "more formal", "again", "in French"), a
# pointer at a part of it ("the second paragraph especially"), a disagreement ("that's not
# what I meant", "you got it wrong"), a report that it still fails. A bare "no" is not one:
# it is peeled off as social, and what follows must be recognised on its own ("no, vivo a
# Roma" passes).
FOLLOW_UPS = (
    # en
    r"(?:(?:and|now|but|ok|so|maybe|just) )*(?:make it |keep it |a (?:bit|little|lot) |even |much |way |slightly )*"
    r"(?:shorter|longer|simpler|clearer|funnier|briefer|tighter|punchier|more\b|less\b|fewer\b)",
    r"(?:(?:and|now|but|ok|so) )*(?:again|once more|one more|another (?:one|version|option|try|example|way)"
    r"|(?:the )?same (?:but|again|thing)|try again|do it again|keep going|go on|more please)\b",
    r"(?:(?:and|now|but) )*(?:in|into|as) (?:english|french|german|spanish|italian|portuguese|russian|chinese"
    r"|japanese|bullet points|bullets|a table|a list|a poem|a haiku|one (?:line|sentence|paragraph)|\d+ \w+)\b",
    r"(?:like|e\.g\.|max|at most|no more than|under|less than|around) (?:half|twice|a|an|the|one|two|three"
    r"|four|five|ten|\d+)\b",
    r"the (?:first|second|third|fourth|last|other|previous|next|1st|2nd|3rd|\d+(?:st|nd|rd|th)) (?:one|option"
    r"|version|paragraph|sentence|part|line|point|draft|example|answer|step|bit)\b|(?:option|version|step) (?:\d|[abc]\b)",
    r"(?:that's|thats|that is|it's|its|this is) (?:not|wrong|incorrect|off)|not (?:quite|really|that|what|exactly)\b"
    r"|you(?:'re| are) wrong|you (?:misunderstood|got it wrong|made a mistake)"
    r"|(?:it )?(?:still )?(?:doesn't|does not|didn't|won't|isn't) (?:work|compile|run|working)|still (?:broken|failing"
    r"|not|the same|doesn't)|same error|i meant|i mean\b|i (?:still )?(?:don't|do not|didn't) (?:understand|get|follow)"
    r"|i(?:'m| am) (?:confused|lost)|i think|i guess|i prefer the (?:first|second|third|last|other|original)",
    # it
    r"(?:e )?(?:piu|meno) (?:cort|brev|lung|formal|semplic|chiar|dettagliat|simpatic|informal)\w*|di nuovo|ancora (?:una volta|uno|una)"
    r"|un'altra (?:versione|volta)|in (?:inglese|francese|tedesco|spagnolo|portoghese|italiano|una tabella|elenco)\b|e in \w+\b"
    r"|intendevo|non intendevo|hai sbagliato|non hai capito|non funziona"
    r"|non compila|(?:sempre )?lo stesso errore|non ho capito|non capisco",
    # es
    r"(?:y )?(?:mas|menos) (?:cort|larg|formal|simple|sencill|clar|detallad|breve|informal)\w*|otra vez|de nuevo"
    r"|otra (?:version|opcion)|en (?:ingles|frances|aleman|espanol|italiano|portugues|una tabla|lista|puntos)\b|y en \w+\b"
    r"|no me referia|te equivocas|sigue sin|sigue igual"
    r"|no (?:funciona|compila|anda|entiendo|entendi)|(?:el )?mismo error",
    # fr
    r"(?:et )?(?:plus|moins) (?:court|long|formel|simple|clair|detaille|concis|drole)\w*|encore|une autre (?:version|fois)"
    r"|en (?:anglais|allemand|espagnol|italien|portugais|francais|tableau|liste)\b|et en \w+\b|(?:c'est|ce n'est) pas ce que"
    r"|tu t'es trompe|je voulais dire|tu as mal compris|t'as mal compris"
    r"|(?:ca )?(?:ne )?(?:marche|fonctionne|compile) (?:toujours )?pas|toujours (?:la meme erreur|pas)|(?:la )?meme erreur"
    r"|(?:je ne |j'ai pas |je n'ai pas )?compris|(?:je ne |je )?comprends pas",
    # de
    r"(?:noch )?(?:kurzer|langer|einfacher|formeller|lockerer|freundlicher|ausfuhrlicher|knapper)|noch ?mal|noch einmal"
    r"|auf (?:englisch|deutsch|franzosisch|spanisch|italienisch)|als (?:tabelle|liste|stichpunkte)|und auf \w+\b"
    r"|das meinte ich nicht|ich meinte|(?:du hast|hast du) mich falsch verstanden"
    r"|(?:geht|funktioniert|klappt|kompiliert)(?: immer)?(?: noch)? nicht|(?:der )?gleiche fehler|klingt (?:zu|sehr|etwas)"
    r"|ich versteh(?:e)? (?:das )?nicht|versteh ich nicht",
    # pt
    r"(?:e )?(?:mais|menos) (?:curt|long|formal|simples|clar|detalhad|informal)\w*|de novo|outra vez|outra (?:versao|opcao)"
    r"|em (?:ingles|frances|espanhol|portugues|uma tabela|lista|topicos)\b|e em \w+\b"
    r"|eu quis dizer|(?:voce|vc) entendeu errado|(?:ainda )?nao (?:funciona|funcionou|compila|rodou)"
    r"|(?:o )?mesmo erro|continua (?:dando erro|igual)|nao entendi|nao entendo",
    # ru
    r"(?:а )?(?:покороче|короче|подробнее|проще|формальнее|длиннее|понятнее)|еще раз|другой вариант|(?:а )?теперь (?:то же|так же)"
    r"|(?:а )?на (?:английском|русском|немецком|французском|испанском)|то же самое"
    r"|ты (?:ошибся|ошиблась|не понял|не поняла|неправильно понял)|я имел\w* в виду"
    r"|(?:все еще |опять )?не (?:работает|компилируется|запускается)|та же ошибка|опять ошибка|не понял\w*|не понимаю",
    # zh
    r"再(?:短|长|简单|详细|正式|简洁|来|写|改|试|精简)|(?:简短|详细|正式|简单|口语化|礼貌)一?(?:点|些)|换(?:个|一个)"
    r"|用(?:英文|中文|日语|英语)|太(?:长|短|复杂|简单|正式|啰嗦)了|精简|缩短|你(?:刚才)?(?:算|说|理解|写)?错了"
    r"|我的意思是|还是不行|不行|还是报错|报错了|运行不了|我?(?:不|没)(?:太)?(?:明白|懂)|看不懂",
    # ja
    r"もっと|もう少し|もうちょっと|もう一度|もう一回|(?:短|長|簡単|丁寧|やさし|優し)く(?:して)?|カジュアルに|英語で|日本語で"
    r"|別の(?:案|バージョン|言い方)|そういう意味じゃ|動かない"
    r"|エラーが出|まだ(?:ダメ|だめ)|うまくいかない|わからない|分からない|わかりません",
)

# An opinion on the options an answer gave: a comparison and an option it points at ("I think
# the second option is better", "meglio la prima versione"). The first-person words that frame
# it ("I think", "secondo me") are FRAMES.
OPINION_COMPARISONS = (
    r"\b(?:better|worse|best|nicer|mejor|peor|melhor|pior|meglio|peggio|migliore|besser|schlechter|mieux"
    r"|meilleure?|pire|prefer\w*|prefier\w*|prefir\w*|bevorzug\w*)\b|лучше|хуже|更好|好一些|(?:ほう|方)がいい",
)
OPINION_OPTIONS = (
    r"\b(?:option|version|variant|draft|choice|first|second|third|last|former|latter|one|[ab12]|opcion|primera|segunda"
    r"|primero|segundo|prima|seconda|primo|secondo|versione|opzione|opcao|primeira|versao|variante|erste|zweite"
    r"|dritte|letzte|premiere|deuxieme|seconde|premier)\b|вариант|перв|втор|第一|第二|版本|方案|番目|案|バージョン",
)

# A remark on the day or the weather, without a word of the user ("Oggi piove tantissimo",
# "Heute war ein anstrengender Tag", "今日も暑いですね").
REMARKS = (
    r"^(?:today|oggi|hoy|aujourd'hui|heute|hoje|сегодня)\b.*\b(?:day|weather|rain\w*|hot|cold|snow\w*|giornata|piove"
    r"|caldo|freddo|nevica|dia|tiempo|llueve|calor|frio|journee|pluie|pleut|chaud|froid|tag|wetter|regnet|heiss|kalt"
    r"|chuva|chove|день|погода|дождь|жарко|холодно)\b",
    r"^(?:今天|今日)[^。]*(?:天气|下雨|好热|好冷|暑|寒|雨|心情)",
)

# Pasted code and error output, one sentence at a time; set aside unless they name the user
# or memory (see kvmem/intent/small_talk.py).
CODE = (
    r"^(?:def|class|function|fn|func|public|private|static|const|let|var|import|#include)\b.*[(=:{;]",
    r"^(?:for|while|if|elif|else|try|except|with|switch|catch)\b.*[:{]$",
    r"^return(?: [\w.()\[\]]+)?;?$|^(?:print|console\.\w+|system\.\w+)\b ?\(",
    r"^(?:[\w.<>\[\]]+ ){0,2}[\w.\[\]]+ ?(?:=|\+=|-=|:=|==) ?\S",
    r"^[\w.]+\(.*\);?$",
    r"^[})\]]+[;,]?$",
    r"^select\b.*\bfrom\b|^insert into\b|^update \w+ set\b|^create table\b",
    r"^traceback\b|^file\b.*\bline \d+|^\w*(?:error|exception|warning)(?:\[\w+\])?:|^at \S+ \(|^-->|^\d+ \||^\|$|^\| [-^~]|^[\^~-]+$",
    r"^[.#]?[\w-]+ ?\{|^(?:display|color|margin|padding|width|height|position|border|background|font|flex|grid"
    r"|overflow|opacity|transform|justify|align|text|z-index)(?:-[a-z]+)*:",
    r"^\W*=\s*[a-z.]+\(",
)
