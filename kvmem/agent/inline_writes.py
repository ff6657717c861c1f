"""The writes of `memory.agent.placement: inline`: the memory markers the main model ended its
reply with (collected by kvmem/agent/markers.py), applied as the matching tool calls would be.

Each marker goes through `MemoryWriter.write`, with every check of a tool call; a marker
collected with an error (a `[MEMORY:` without `=`) and a refused write are reported in the
run's `updates` with their error, since no model reads a result here. At most
`MAX_TOOL_CALLS` markers of a reply are applied. It knows nothing of HTTP or of models: the
agent (kvmem/agent/memory_agent.py) runs this as the inline run's task.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from kvmem.agent.markers import Marker
from kvmem.agent.run import AgentRun, MemoryUpdate
from kvmem.agent.writer import MAX_TOOL_CALLS, MemoryWriter


async def write_markers(
    writer: MemoryWriter, run: AgentRun, user_id: str, markers: Sequence[Marker]
) -> None:
    """Apply the reply's markers in order, at most `MAX_TOOL_CALLS`; the others are recorded
    as not applied."""
    await writer.apply(
        run, user_id, markers[:MAX_TOOL_CALLS], functools.partial(_write_marker, writer)
    )
    for marker in markers[MAX_TOOL_CALLS:]:
        run.record(
            MemoryUpdate(
                marker.op,
                marker.key,
                marker.value,
                error=f"not applied: at most {MAX_TOOL_CALLS} markers per reply",
            )
        )


async def _write_marker(
    writer: MemoryWriter, run: AgentRun, user_id: str, marker: Marker
) -> tuple[str, bool]:
    """Apply one marker as the matching tool call would be; a refused one is reported in
    `updates` with its error."""
    if marker.error is not None:
        run.record(MemoryUpdate(marker.op, marker.key, marker.value, error=marker.error))
        return marker.error, False
    return await writer.write(run, user_id, marker.key, marker.value, report_refusal=True)
