"""Calling models: the contract both clients keep (`base`), the direct client for
OpenAI-compatible upstreams (`direct_client`), the litellm client for the rest
(`litellm_client`), the client the services hold (`model_client`), the checked fields of an
OpenAI answer (`completion_shapes`) and the secrets masked out of what kvmem relays
(`redaction`)."""
