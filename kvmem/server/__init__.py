"""The ways in: the ASGI app (`app`) and its routes (`routes/`), who a request acts for
(`auth`, `credentials`, `sessions`), what handlers share (`services`), request bodies
(`bodies`), the browser guard (`site_guard`), `kvmem serve`'s HTTP protocol
(`http_protocol`), Ollama's shapes (`ollama_shapes`, `ollama_replies`) and MCP
(`mcp_tools`, `mcp_server`, `mcp_http`)."""
