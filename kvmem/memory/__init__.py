"""A user's key/value memory: the write rules (`rules`), the change log (`history`), the read
path (`snapshots`), the writes (`store`, on `write_statements` and SQLite's `group_commit`),
the agent's writes held for review (`proposals`), the memory document (`exports`, checked by
`imports`), history's retention sweep (`retention`) and the JSON of a write's outcome and of
`GET /memory` (`write_outcomes`, `overview`)."""
