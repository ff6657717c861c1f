"""Streamed responses that clean up after a client that went away."""

from __future__ import annotations

import anyio
from starlette.responses import ContentStream, StreamingResponse
from starlette.types import Receive, Scope, Send

# A stream holds a user's conversation: not stored by any cache (no-store implies no-cache).
SSE_HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}


class ClosingStreamingResponse(StreamingResponse):
    """A streamed response that always closes its event generator, even if the client left.

    When the client goes away Starlette cancels the response and leaves a generator paused
    at a `yield` to the garbage collector, so its `finally` (which starts the agent's grace
    period and closes the upstream stream) would run late or never.
    """

    def __init__(self, content: ContentStream) -> None:
        super().__init__(content, media_type="text/event-stream", headers=SSE_HEADERS)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()  # type: ignore[attr-defined]
