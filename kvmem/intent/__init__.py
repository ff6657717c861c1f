"""The intent gate: may a message skip the memory agent (`gate`). Its patterns (`patterns`),
the small talk it may skip (`small_talk`, with its `phrases` and `words` tables) and the
learned second opinion (`model`, reading the shipped `model.json`, with its `cues`)."""
