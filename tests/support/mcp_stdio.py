"""`kvmem mcp` over stdio, driven by the MCP SDK's own client (a real subprocess)."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from mcp import ClientSession, StdioServerParameters, stdio_client


@asynccontextmanager
async def stdio_session(config: Path, *args: str) -> AsyncIterator[ClientSession]:
    """An initialized client session with `kvmem mcp --config CONFIG ARGS...`; its stderr in
    `mcp-stderr.log` beside the config."""
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "kvmem", "mcp", "--config", str(config), *args],
        env={"LITELLM_LOCAL_MODEL_COST_MAP": "True"},
        cwd=config.parent,
    )
    with (config.parent / "mcp-stderr.log").open("w") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session
