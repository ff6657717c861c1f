"""The memory agent: one run's state (`run`), the bounds on runs in flight (`run_slots`), its
tools and JSON mode (`tools`, `json_mode`), its writes (`writer`, `inline_writes`), its
usage and budget (`usage`, `ledger`), the prompts and markers (`prompts`, `markers`), a run's
conversation with the model (`conversation`), the agent itself (`memory_agent`) and a chat
turn's memory (`turn_memory`)."""
