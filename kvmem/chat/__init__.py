"""A chat turn: the main model call's lifecycle on every route (`main_call`) and the stored
`/chat` conversations (`conversations`)."""
