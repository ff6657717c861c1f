"""The sidecar hooks, for apps that call their own model and only want kvmem's memory:
`POST /memory/context` (the block to inject) and `POST /memory/agent` (the memory agent on
the app's messages).

Both go through `MemoryService`, the same code /chat and /v1 use, so the block an app gets
here is byte for byte the block kvmem would inject itself, and an agent run here is tracked,
bounded and drained exactly like a chat turn's. Both take the turn's scope from
`X-Memory-Scope` or the body's `scope` (400 when the two differ).
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    field_validator,
)
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from kvmem.agent.prompts import with_memory
from kvmem.agent.turn_memory import check_conversation_id
from kvmem.chat.main_call import chat_line
from kvmem.errors import BadRequest, TooManyRuns
from kvmem.server.bodies import RequestBody, read_model
from kvmem.server.routes import conversation_id, turn_scope
from kvmem.server.services import services_of, user_of

# The agent reads only the last `messageWindowSize` messages; a client that sends more than
# this is sending a whole archive by mistake.
MAX_MESSAGES = 1000
MAX_DEADLINE_SECONDS = 60


class ContextRequest(RequestBody):
    """`POST /memory/context`."""

    system: StrictStr = ""
    scope: StrictStr | None = None


class AgentMessage(BaseModel):
    """One OpenAI chat message (other fields, like `name` or `tool_calls`, are ignored)."""

    model_config = ConfigDict(extra="allow", strict=True, frozen=True)
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Any = None

    @field_validator("content")
    @classmethod
    def _openai_content(cls, content: Any) -> Any:
        """A string, null, or a list of parts, each an object with a string `type`; a `text`
        part also needs a string `text`. Other parts (images, audio, files) are kept aside."""
        if content is None or isinstance(content, str):
            return content
        if not isinstance(content, list):
            raise ValueError("content must be a string, null or a list of content parts")
        for index, part in enumerate(content):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise ValueError(f"content part {index} must be an object with a string 'type'")
            if part["type"] == "text" and not isinstance(part.get("text"), str):
                raise ValueError(f"content part {index} is a text part without a string 'text'")
        return content


class AgentRequest(RequestBody):
    """`POST /memory/agent`."""

    messages: list[AgentMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    conversation_id: StrictStr | None = None
    wait: StrictBool = True
    deadline_seconds: float = Field(10, gt=0, le=MAX_DEADLINE_SECONDS)
    scope: StrictStr | None = None


async def memory_context(request: Request) -> Response:
    """The block kvmem would inject for this user now, and the given system text with it."""
    services = services_of(request)
    user = await user_of(request)
    body = await read_model(
        request, ContextRequest, services.config.server.max_body_bytes, optional=True
    )
    context = await services.memory.context(user, turn_scope(request, body.scope))
    return JSONResponse(
        {
            "block": context.block,
            "injected": context.injected,
            "token_count": context.token_count,
            "enabled": context.enabled,
            "system": with_memory(body.system, context.block),
        }
    )


async def memory_agent(request: Request) -> Response:
    """Run the memory agent on the given messages, waiting for it or not."""
    arrived = time.monotonic()  # the deadline counts from here, body reading included
    services = services_of(request)
    user = await user_of(request)
    body = await read_model(request, AgentRequest, services.config.server.max_body_bytes)
    conversation_id = _conversation_id(request, body.conversation_id)
    scope = turn_scope(request, body.scope)
    lines = [chat_line(message.role, message.content) for message in body.messages]
    run = await services.memory.start_agent(
        user, conversation_id, lines, deadline=arrived + body.deadline_seconds, scope=scope
    )
    if run.state == "busy":
        agent = services.config.memory.agent
        assert agent is not None  # a run that could be busy had an agent to run
        raise TooManyRuns(
            f"too many memory agent runs in flight (at most {agent.max_runs_per_user} per user "
            f"and {agent.max_concurrent_runs} in all): retry when one has ended",
            retry_after=max(1, math.ceil(agent.grace_seconds)),
        )
    if run.task is None:
        return JSONResponse(_outcome(run.state, run.updates))
    if not body.wait:
        # The run goes on to its deadline as a tracked task (shutdown drains it).
        return JSONResponse({"agent": "running"}, status_code=202)
    # asyncio.wait, not await: a client that goes away must not cancel the run.
    await asyncio.wait({run.task})
    return JSONResponse(_outcome(run.state, run.updates))


def _outcome(state: str, updates: list[Any]) -> dict[str, Any]:
    return {"agent": state, "updates": [update.as_json() for update in updates]}


def _conversation_id(request: Request, in_body: str | None) -> str | None:
    """The conversation the run's changes are recorded under: the header (`conversation_id`)
    or the body field."""
    in_header = conversation_id(request)
    in_body = check_conversation_id(in_body)
    if in_header is not None and in_body is not None and in_header != in_body:
        raise BadRequest(
            "X-Conversation-Id and the body's conversation_id name different conversations"
        )
    return in_body if in_body is not None else in_header


routes = [
    Route("/memory/context", memory_context, methods=["POST"]),
    Route("/memory/agent", memory_agent, methods=["POST"]),
]
