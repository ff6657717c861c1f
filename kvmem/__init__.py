"""kvmem: a key/value memory sidecar for LLM chat, configured like LibreChat's memory."""

__version__ = "0.1.0"
