"""What handlers work with: the resources the app's lifespan owns, the request's user and the
scope its `X-Memory-Scope` names."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from kvmem.agent.memory_agent import MemoryAgent
from kvmem.agent.turn_memory import MemoryService
from kvmem.agent.usage import UsageStore
from kvmem.chat.conversations import ConversationStore
from kvmem.chat.task_calls import TaskCalls
from kvmem.config import Config
from kvmem.db.engine import Database
from kvmem.errors import BadRequest, MemoryDisabled
from kvmem.memory.proposals import ProposalStore
from kvmem.memory.store import MemoryStore
from kvmem.metrics import Metrics
from kvmem.server.auth import Authenticator, accepts_session
from kvmem.server.credentials import KeyStore
from kvmem.tokens import TokenCounter
from kvmem.upstream.base import Target
from kvmem.upstream.model_client import ModelClient
from kvmem.upstream.provider_keys import missing_key


@dataclass(frozen=True)
class Services:
    """The app's long-lived resources, built by `create_app`'s lifespan."""

    config: Config
    database: Database
    tokens: TokenCounter
    store: MemoryStore
    keys: KeyStore
    auth: Authenticator
    conversations: ConversationStore
    client: ModelClient
    chat_target: Target
    agent: MemoryAgent
    memory: MemoryService
    metrics: Metrics
    usage: UsageStore
    proposals: ProposalStore
    task_calls: TaskCalls

    def agent_key_missing(self) -> str | None:
        """Why the memory agent's calls will be refused for want of an API key (None: no key
        is known to be missing, or the agent is off). Inline, the agent is the main model."""
        if not self.config.agent_status()[0]:
            return None
        target = self.chat_target if self.config.inline_memory() else self.agent.target
        return missing_key(target) if target is not None else None

    def missing_keys(self) -> list[str]:
        """Every API key known to be missing, for the log at start-up: the main model's, then
        the memory agent's."""
        problems = []
        chat = missing_key(self.chat_target)
        if chat is not None:
            problems.append(f"the chat model will fail: {chat}")
        agent = self.agent_key_missing()
        if agent is not None and not self.config.inline_memory():
            problems.append(f"the memory agent will fail: {agent}")
        return problems


def services_of(request: Request) -> Services:
    """The services handed to this request by the lifespan."""
    return request.state.services


async def user_of(request: Request, body_user: str | None = None) -> str:
    """The id of the user this request acts for (see `Authenticator.identify`)."""
    auth = services_of(request).auth
    session_ok = accepts_session(request.url.path, request.method)
    # A service key names its user in a header: only user keys and session tokens are looked
    # up in the database, so only they are worth a trip to a thread.
    if auth.needs_lookup and not auth.holds_service_key(request.headers):
        return await run_in_threadpool(
            lambda: auth.identify(request.headers, body_user, session_ok=session_ok)
        )
    return auth.identify(request.headers, body_user, session_ok=session_ok)


def scope_header(request: Request) -> str | None:
    """The scope `X-Memory-Scope` names, not yet checked (`MemoryRules.scope` does): None when
    it is absent or empty (a front end's header template that rendered to nothing); 400
    `bad_request` when two such headers name different scopes (which one is meant is a guess,
    and a proxy that reads the other would see another scope than kvmem)."""
    named = {value.strip() for value in request.headers.getlist("x-memory-scope")} - {""}
    if len(named) > 1:
        raise BadRequest(
            "X-Memory-Scope is given more than once, naming different scopes: name one"
        )
    return named.pop() if named else None


def require_memory(services: Services) -> None:
    """Refuse with 403 `memory_disabled` when `memory.disabled` is true."""
    if services.config.memory.disabled:
        raise MemoryDisabled("memory is disabled on this server (memory.disabled is true)")
