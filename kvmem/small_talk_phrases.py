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
    r"that helped(?: a lot)?|well done|good job|exactly|indeed|interesting|fair enough|agreed|true|understood|noted",
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
# or memory (see kvmem/small_talk.py).
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
    r"|fumo|insegno|gioco|soffro|preferisco|odio|guido|frequento|pratico|cucino)\b",
    r"\b(?:yo|mi|mis|mio|mia|me|nosotros|nuestr\w+|soy|estoy|tengo|vivo|trabajo|estudio|tuve|fui|hago|bebo|fumo"
    r"|enseno|juego|sufro|padezco|prefiero|odio|manejo|conduzco|cocino|entreno)\b",
    r"\b(?:je|j'\w+|moi|me|m'\w+|mon|ma|mes|nous|notre|nos|jsuis|chui)\b|\bon (?:a|est|s'est|vient|habite|vit)\b",
    r"\b(?:ich|mich|mir|mein\w*|wir|uns|unser\w*|hab|habe|bin|wohne|arbeite|lebe|studiere|rauche|trinke)\b",
    r"\b(?:eu|me|mim|meu|minha|meus|minhas|comigo|nos|nosso|nossa|sou|estou|tenho|moro|trabalho|estudo|faco|bebo|fumo"
    r"|ensino|jogo|sofro|prefiro|odeio|dirijo|cozinho|treino)\b",
    r"私|わたし|あたし|僕|ぼく|俺|おれ|自分|うちの|我が",
    r"(?:^|\n|[,;:] ?)(?:uso|usiamo|usamos)\b",
    r"(?<!\w)(?:живу|работаю|учусь|ем|пью|курю|занимаюсь|люблю|предпочитаю|болею|беременна|замужем|женат)(?!\w)",
)
# Words of memory: to remember, forget, note, save, delete.
MEMORY_WORDS = (
    r"\b(?:remember|rememb\w*|remeber|forget|memor\w*|note|notes|save|store|record|delete|erase"
    r"|remove|wipe)\b",
    r"记|忘|删|存",
    r"запомн|запомина|забуд|забыв|забыть|удал|памят|сохран|запиш",
    r"\b(?:ricord|dimentic|salv|memori|segna|annot)\w*|\bcancell(?:a|i|o|are|ato|ata|ati|ami|alo|ala|ali|ale)\b",
    r"\b(?:recuerd|acuerd|olvid|guard|apunt|memori)\w*|\bborr(?:a|ar|e|en|es|o|ado|ada|ados|adas|alo|ala|alos|alas|ame"
    r"|ando)\b",  # not "borrow"
    r"\b(?:souvien|rappelle|retien|oubli|efface|supprim|enregistr|memoire|memoris|note)\w*",
    r"\b(?:merk|vergiss|vergessen|losch|speicher|notier|gedachtnis)\w*",
    r"\b(?:lembr|esquec|apag|anot|memoria)\w*",
    r"覚え|忘れ|記憶|メモ|保存|消して|削除",
)
# Words of a change: a fact about the user that is new, or no longer true.
CHANGE_WORDS = (
    r"\b(?:now|anymore|any more|no longer|btw|fyi|actually|moved|switched|changed|new|since)\b",
    # life events, which state a fact even without a pronoun ("retired last month, hobby ideas?")
    r"\b(?:retired|divorced|widowed|pregnant|engaged|graduated|incinta|in pensione|embarazada|jubilad[oa]|gravida"
    r"|aposentad[oa]|enceinte|a la retraite|schwanger|in rente|umgezogen|geheiratet|gekundigt)\b|беременн|на пенсии"
    r"|怀孕|退休|妊娠|退職",
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
ABOUT_THE_USER = FIRST_PERSON + MEMORY_WORDS + CHANGE_WORDS
