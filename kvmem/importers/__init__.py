"""Memories brought from other systems (`kvmem import --from`): Open WebUI's `webui.db`,
LibreChat's `mongoexport` of `memoryentries` and mem0's JSON, each read as a stream and
written per user, all or nothing, under every rule of the store.

The readers (`openwebui`, `librechat`, `mem0`) turn a file into each user's memories in order
(`records`, `staging`, `json_stream` are what they share); `plan` merges one user's memories
into their entries, `run` writes them (or proposes them), `report` prints the outcome. This
face imports nothing.
"""
