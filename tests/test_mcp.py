"""kvmem's MCP server, driven by the official `mcp` client: `kvmem mcp` over stdio, and `/mcp`
of a real `kvmem serve` over streamable HTTP, with kvmem's auth, rules and user scoping."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from kvmem.agent.prompts import BLOCK_PREAMBLE
from kvmem.agent.tools import EXPIRES_DESCRIPTION
from kvmem.db.engine import Database
from kvmem.memory.proposals import ProposalStore
from kvmem.memory.store import MemoryStore
from kvmem.server.credentials import KeyStore
from tests.support.matchers import ISO_TIME, entry
from tests.support.mcp_stdio import stdio_session
from tests.support.processes import WATCH_LITELLM_IMPORTS, ServeProcess

# Real `kvmem mcp` and `kvmem serve` processes.
pytestmark = pytest.mark.slow

VALID_KEYS = ["city", "diary", "drink"]
MEMORY = {"validKeys": VALID_KEYS, "tokenLimit": 20, "charLimit": 40}
SERVICE_KEY = "svc-mcp-3f9a1c"
TOOL_NAMES = [
    "memory_list",
    "memory_get",
    "memory_set",
    "memory_delete",
    "memory_history",
    "memory_proposals",
    "memory_proposal_accept",
    "memory_proposal_reject",
]
KEY_SCHEMA = {
    "type": "string",
    "description": "The memory key: lowercase letters, digits and _, starting with a letter. "
    "Must be one of: city, diary, drink.",
}
JSONRPC_HEADERS = {
    "Accept": "application/json, text/event-stream",
    "Content-Type": "application/json",
}
PING = {"jsonrpc": "2.0", "id": 1, "method": "ping"}


def run(session_work: Callable[[], Awaitable[None]]) -> None:
    anyio.run(session_work)


def text(result: Any) -> str:
    (content,) = result.content
    return content.text


def overview(memories: list[dict[str, Any]], total: int) -> dict[str, Any]:
    return {
        "memories": memories,
        "total_tokens": total,
        "token_limit": 20,
        "char_limit": 40,
        "usage_percentage": round(100 * total / 20, 1),
        "valid_keys": VALID_KEYS,
        "enabled": True,
    }


async def check_the_tools(session: ClientSession, *, user_store: MemoryStore, user: str) -> None:
    """The whole tool surface, as any MCP client sees it, for a user who has no memory yet."""
    tools = (await session.list_tools()).tools
    assert [tool.name for tool in tools] == TOOL_NAMES
    memory_set = tools[2]
    assert memory_set.input_schema == {
        "type": "object",
        "properties": {
            "key": KEY_SCHEMA,
            "value": {"type": "string", "description": "The complete value to store."},
            "expires_at": {"type": "string", "description": EXPIRES_DESCRIPTION},
            "expires_in": {
                "type": "string",
                "description": 'Instead of expires_at: how long it holds, "90m", "12h", "3d", "2w".',
            },
        },
        "required": ["key", "value"],
        "additionalProperties": False,
    }
    assert memory_set.description.startswith("Remember something about the user: store `value`")
    assert [(t.annotations.read_only_hint, t.annotations.destructive_hint) for t in tools] == [
        (True, None),
        (True, None),
        (False, True),
        (False, True),
        (True, None),
        (True, None),
        (False, True),
        (False, True),
    ]
    assert tools[0].input_schema == {
        "type": "object",
        "properties": {},
        "additionalProperties": False,
    }
    assert all(tool.description for tool in tools)

    written = await session.call_tool("memory_set", {"key": "drink", "value": " Tea "})
    stored = user_store.get(user, "drink").as_json()
    assert (written.is_error, text(written)) == (False, 'Memory set for key "drink" (1 tokens)')
    assert stored == entry("drink", "Tea", 1, "mcp")
    assert written.structured_content == {"memory": stored, "total_tokens": 1, "token_limit": 20}

    got = await session.call_tool("memory_get", {"key": "drink"})
    assert (got.is_error, got.structured_content, json.loads(text(got))) == (False, stored, stored)
    listed = await session.call_tool("memory_list", {})
    assert listed.structured_content == overview([stored], 1)
    assert json.loads(text(listed)) == overview([stored], 1)

    # Refused writes: an error result with the text the memory agent gets, and nothing written.
    refusals = [
        (
            {"key": "mood", "value": "happy"},
            'Invalid key "mood". Must be one of: city, diary, drink',
        ),
        (
            {"key": "city", "value": "hello " * 30},
            'Value for key "city" is too long (179 characters; the limit is 40). Shorten it.',
        ),
        (
            {"key": "city", "value": "   "},
            'Empty value for key "city". Cannot save an empty memory.',
        ),
        (
            {"key": "city", "value": "a b c d e f g h i j k l m n o p q r s t"},  # 20 tokens
            "Memory storage would exceed limit. Cannot save this memory.",
        ),
    ]
    for arguments, message in refusals:
        refused = await session.call_tool("memory_set", arguments)
        assert (refused.is_error, text(refused), refused.structured_content) == (
            True,
            message,
            None,
        )

    # Bad calls: never a crash, always a clear answer.
    for arguments, message in [
        ({}, "Error: invalid arguments for memory_get: key: Field required."),
        (
            {"key": "drink", "user": "someone"},
            "Error: invalid arguments for memory_get: user: Extra inputs are not permitted.",
        ),
        (
            {"key": 5},
            "Error: invalid arguments for memory_get: key: Input should be a valid string.",
        ),
        ({"key": "city"}, 'No memory with key "city".'),
        ({"key": "Not A Key"}, 'Invalid key "Not A Key". Must be one of: city, diary, drink'),
    ]:
        bad = await session.call_tool("memory_get", arguments)
        assert (bad.is_error, text(bad)) == (True, message)
    with pytest.raises(MCPError, match="Unknown tool: memory_wipe"):
        await session.call_tool("memory_wipe", {})

    day = stored["updated_at"][:10]
    (resource,) = (await session.list_resources()).resources
    assert (resource.uri, resource.mime_type) == ("memory://block", "text/plain")
    (block,) = (await session.read_resource("memory://block")).contents
    assert block.text == f"{BLOCK_PREAMBLE}\n<user_memory>\n[{day}] drink: Tea\n</user_memory>"
    with pytest.raises(MCPError, match="Unknown resource: memory://other"):
        await session.read_resource("memory://other")

    deleted = await session.call_tool("memory_delete", {"key": "drink"})
    assert (deleted.is_error, text(deleted)) == (False, 'Memory deleted for key "drink"')
    assert deleted.structured_content == {"deleted": stored}
    gone = await session.call_tool("memory_delete", {"key": "drink"})
    assert (gone.is_error, text(gone)) == (True, 'No memory with key "drink". Nothing to delete.')

    history = await session.call_tool("memory_history", {"key": "drink"})
    changes = history.structured_content["changes"]
    assert changes[0]["id"] > changes[1]["id"]
    change = {"key": "drink", "conversation_id": None, "at": ISO_TIME, "source": "mcp"}
    assert [{k: v for k, v in c.items() if k != "id"} for c in changes] == [
        {**change, "op": "delete", "old_value": "Tea", "new_value": None},
        {**change, "op": "set", "old_value": None, "new_value": "Tea"},
    ]
    assert history.structured_content["next"] is None
    (empty,) = (await session.read_resource("memory://block")).contents
    assert empty.text == ""


# --- stdio: `kvmem mcp` --------------------------------------------------------------------


@pytest.fixture
def config_file(tmp_path: Path, database_url: str, database: Database) -> Path:
    path = tmp_path / "memory.yaml"
    path.write_text(
        json.dumps({"database": {"url": database_url}, "memory": MEMORY}), encoding="utf-8"
    )
    return path


def test_kvmem_mcp_over_stdio(config_file: Path, make_store: Callable[..., MemoryStore]):
    store = make_store(**MEMORY)

    async def work() -> None:
        async with stdio_session(config_file, "--user", "alice") as session:
            assert session.initialize_result.server_info.name == "kvmem"
            await check_the_tools(session, user_store=store, user="alice")

    run(work)
    assert [store.snapshot(user).entries for user in ("local", "bob")] == [(), ()]


def test_the_proposal_tools_over_stdio(config_file: Path, make_store: Callable[..., MemoryStore]):
    store = make_store(**MEMORY)
    proposals = ProposalStore(store)
    store.set("alice", "city", "a b c d e f g h i j k l m n o p q")  # 17 of 20 tokens
    proposals.propose("alice", "drink", "Tea", conversation_id="conv-1")  # id 1
    proposals.propose("alice", "diary", "one two three four five", conversation_id="conv-2")
    proposals.propose("bob", "drink", "Coffee")  # id 3: bob's

    async def work() -> None:
        async with stdio_session(config_file, "--user", "alice") as session:
            tools = {tool.name: tool for tool in (await session.list_tools()).tools}
            assert tools["memory_proposal_accept"].input_schema == {
                "type": "object",
                "properties": {
                    "id": {
                        "type": "integer",
                        "minimum": 1,
                        "description": "The proposal's id, from memory_proposals.",
                    }
                },
                "required": ["id"],
                "additionalProperties": False,
            }
            listed = await session.call_tool("memory_proposals", {})
            pending = [
                {
                    "id": 2,
                    "key": "diary",
                    "op": "set",
                    "value": "one two three four five",
                    "conversation_id": "conv-2",
                    "created_at": ISO_TIME,
                    "expires_at": None,
                },
                {
                    "id": 1,
                    "key": "drink",
                    "op": "set",
                    "value": "Tea",
                    "conversation_id": "conv-1",
                    "created_at": ISO_TIME,
                    "expires_at": None,
                },
            ]
            assert (listed.is_error, listed.structured_content) == (False, {"proposals": pending})
            kept = await session.call_tool("memory_proposal_accept", {"id": 1})
            assert (kept.is_error, text(kept), kept.structured_content) == (
                False,
                "Proposal 1 kept",
                {
                    "memory": entry("drink", "Tea", 1, "agent"),
                    "total_tokens": 18,
                    "token_limit": 20,
                },
            )
            full = await session.call_tool("memory_proposal_accept", {"id": 2})
            assert (full.is_error, text(full)) == (
                True,
                (
                    "Error: storing 5 tokens would take memory to 23 tokens, over the limit of 20; "
                    "the proposal stays pending."
                ),
            )
            for tool, arguments in [
                ("memory_proposal_accept", {"id": 3}),
                ("memory_proposal_reject", {"id": 1}),
            ]:
                missing = await session.call_tool(tool, arguments)
                assert (missing.is_error, text(missing)) == (
                    True,
                    f"No pending proposal with id {arguments['id']}.",
                )
            dismissed = await session.call_tool("memory_proposal_reject", {"id": 2})
            assert (dismissed.is_error, text(dismissed)) == (False, "Proposal 2 dismissed")
            bad = await session.call_tool("memory_proposal_reject", {"id": "2"})
            assert (bad.is_error, text(bad)) == (
                True,
                "Error: invalid arguments for "
                "memory_proposal_reject: id: Input should be a valid integer.",
            )

    run(work)
    assert proposals.pending("alice") == ()
    assert [p.key for p in proposals.pending("bob")] == ["drink"]
    assert store.get("alice", "drink").source == "agent"


def test_kvmem_mcp_acts_for_local_by_default(
    config_file: Path, make_store: Callable[..., MemoryStore]
):
    store = make_store(**MEMORY)
    store.set("alice", "city", "Rome")

    async def work() -> None:
        async with stdio_session(config_file) as session:
            listed = await session.call_tool("memory_list", {})
            assert listed.structured_content == overview([], 0)  # alice's entry is not local's
            written = await session.call_tool("memory_set", {"key": "city", "value": "Oslo"})
            assert written.is_error is False

    run(work)
    assert [(e.key, e.value) for e in store.snapshot("local").entries] == [("city", "Oslo")]
    assert store.get("alice", "city").value == "Rome"


def test_kvmem_mcp_never_imports_litellm(config_file: Path):
    """Its tools never call a model: the default `ollama/...` chat model, which makes
    `kvmem serve` import litellm beside start-up, costs `kvmem mcp` nothing."""
    script = WATCH_LITELLM_IMPORTS + (
        "from kvmem.cli import main\n"
        "main(['mcp', '--config', %r], standalone_mode=False)\n"  # stdin is empty: it ends
        "for thread in threading.enumerate():\n"
        "    if thread.name == 'kvmem-litellm':\n"
        "        thread.join(120)\n"
        "print(Watch.seen)\n"
    ) % str(config_file)
    done = subprocess.run(
        [sys.executable, "-c", script],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
    )
    assert (done.returncode, done.stdout.splitlines()[-1:]) == (0, ["[]"]), done.stderr


def test_kvmem_mcp_refuses_a_bad_user(config_file: Path):
    from tests.support.cli import invoke

    result = invoke(
        ["mcp", "--config", str(config_file), "--user", "no spaces"], cwd=config_file.parent
    )
    assert (result.code, result.stdout) == (2, "")
    assert result.stderr == (
        "kvmem: invalid user id 'no spaces': use 1-128 characters of A-Z, a-z, 0-9, . _ @ -\n"
    )


# --- streamable HTTP: /mcp of `kvmem serve` --------------------------------------------------


# A chat model on the direct path, never called: no litellm import beside start-up.
DIRECT_CHAT = {"model": "openai/unused", "api_base": "http://127.0.0.1:9/v1"}


@pytest.fixture
def served(
    tmp_path: Path, database_url: str, database: Database
) -> Iterator[tuple[ServeProcess, dict[str, str]]]:
    """A real `kvmem serve` in keys mode, and user keys for alice and bob. Its chat model
    goes the direct path: MCP calls no model, and with the default (`ollama/...`) the first
    /mcp request would wait for litellm's import beside start-up to end before the SDK's
    own (one large import at a time): 5.4 s after ready here, over 30 s on a loaded CI worker."""
    keys = KeyStore(database)
    secrets = {user: keys.create(user)[1] for user in ("alice", "bob")}
    server = ServeProcess(
        tmp_path,
        {
            "database": {"url": database_url},
            "auth": {"mode": "keys", "service_keys": [SERVICE_KEY]},
            "memory": MEMORY,
            "chat": DIRECT_CHAT,
        },
    ).start()
    yield server, secrets
    server.stop()


def bearer(secret: str, **headers: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}", **headers}


@asynccontextmanager
async def http_session(url: str, headers: dict[str, str]) -> AsyncIterator[ClientSession]:
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as http,
        streamable_http_client(f"{url}/mcp", http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def test_mcp_over_streamable_http_acts_only_for_the_keys_user(
    served: tuple[ServeProcess, dict[str, str]], make_store: Callable[..., MemoryStore]
):
    server, secrets = served
    store = make_store(**MEMORY)
    store.set("alice", "diary", "alice's secret diary")
    alice_before = store.snapshot("alice")

    async def work() -> None:
        # bob's key: his own (empty) memory, whatever alice holds or he names.
        async with http_session(server.url, bearer(secrets["bob"])) as bob:
            await check_the_tools(bob, user_store=store, user="bob")
            for tool, arguments, message in [
                ("memory_get", {"key": "diary"}, 'No memory with key "diary".'),
                (
                    "memory_delete",
                    {"key": "diary"},
                    'No memory with key "diary". Nothing to delete.',
                ),
            ]:
                refused = await bob.call_tool(tool, arguments)
                assert (refused.is_error, text(refused)) == (True, message)
            history = await bob.call_tool("memory_history", {})
            assert [c["key"] for c in history.structured_content["changes"]] == ["drink", "drink"]
            mine = await bob.call_tool("memory_set", {"key": "diary", "value": "bob's diary"})
            assert mine.structured_content["total_tokens"] == 3  # alice's tokens not counted

        # A service key acts for the user X-User-Id names.
        async with http_session(server.url, bearer(SERVICE_KEY, **{"X-User-Id": "bob"})) as service:
            got = await service.call_tool("memory_get", {"key": "diary"})
            assert got.structured_content["value"] == "bob's diary"

    run(work)
    assert store.snapshot("alice") == alice_before
    assert store.get("bob", "diary").value == "bob's diary"


def test_mcp_http_refusals(served: tuple[ServeProcess, dict[str, str]]):
    server, secrets = served
    url = f"{server.url}/mcp"
    alice = bearer(secrets["alice"], **JSONRPC_HEADERS)

    def post(headers: dict[str, str]) -> tuple[int, Any]:
        # The first loads the MCP SDK: the same bound as the SDK clients' sessions here.
        response = httpx.post(url, json=PING, headers=headers, timeout=30)
        return response.status_code, response.json()

    assert post(alice) == (200, {"jsonrpc": "2.0", "id": 1, "result": {}})
    assert post({**alice, "Origin": server.url}) == (200, {"jsonrpc": "2.0", "id": 1, "result": {}})
    for origin in (
        "http://evil.example",
        "null",
        f"http://localhost:{server.port}",
        "http://127.0.0.1:1",
        f"http://127.0.0.1:{server.port}.evil.example",
    ):
        assert post({**alice, "Origin": origin}) == (
            403,
            {
                "error": {
                    "code": "origin_not_allowed",
                    "message": f"requests from other sites are refused (Origin: {origin}); "
                    "list the site in server.allowed_origins if it should write here",
                }
            },
        )
    assert post(JSONRPC_HEADERS) == (
        401,
        {
            "error": {
                "code": "unauthorized",
                "message": "missing credentials: send Authorization: Bearer <key>",
            }
        },
    )
    assert post({**JSONRPC_HEADERS, **bearer("kvm_wrong")}) == (
        401,
        {
            "error": {
                "code": "unauthorized",
                "message": "the API key is not valid (unknown or revoked)",
            }
        },
    )
    assert post({**bearer(secrets["bob"], **{"X-User-Id": "alice"}), **JSONRPC_HEADERS}) == (
        403,
        {
            "error": {
                "code": "forbidden",
                "message": "a user key acts only for its own user; drop X-User-Id or use a service key",
            }
        },
    )
    assert post({**bearer(SERVICE_KEY), **JSONRPC_HEADERS}) == (
        400,
        {
            "error": {
                "code": "bad_request",
                "message": "a service key must name the user: send the X-User-Id header",
            }
        },
    )

    get = httpx.get(url, headers={**alice, "Accept": "text/event-stream"}, timeout=10)
    assert (get.status_code, get.json()) == (
        405,
        {
            "error": {
                "code": "method_not_allowed",
                "message": "GET is not allowed on /mcp: send JSON-RPC by POST",
            }
        },
    )
    plain = httpx.post(
        url, content=json.dumps(PING), timeout=10, headers={**alice, "Content-Type": "text/plain"}
    )
    assert (plain.status_code, plain.json()) == (
        400,
        {
            "error": {
                "code": "bad_request",
                "message": "POST /mcp takes a JSON-RPC message: send Content-Type: application/json",
            }
        },
    )


# --- in process: what the transports share ---------------------------------------------------


def test_the_sdk_loads_with_the_first_mcp_request(database: Database, database_url: str):
    """A server that is never asked to speak MCP never imports the SDK (~25 MiB); the first
    /mcp request starts the transport and is answered like any other. The chat model goes
    the direct path, as in `served`: with the default (`ollama/...`) litellm's import beside
    start-up took 6 s of CPU and the test up to 108 s on a loaded worker, for nothing it checks."""
    script = (
        "import json, sys\n"
        "from starlette.testclient import TestClient\n"
        "from kvmem.server.app import create_app\n"
        "from kvmem.config import Config\n"
        "def sdk():\n"
        "    return sorted(m for m in sys.modules if m.split('.')[0] in {'mcp', 'mcp_types'})\n"
        "config = Config.model_validate({'database': {'url': %r}, 'chat': %r})\n"
        "with TestClient(create_app(config), base_url='http://127.0.0.1') as client:\n"
        "    assert client.get('/memory').status_code == 200\n"
        "    assert client.get('/mcp').status_code == 405\n"
        "    print(sdk() == [])\n"
        "    for _ in range(2):\n"
        "        answer = client.post('/mcp', json=%r, headers=%r)\n"
        "        print(answer.status_code, json.dumps(answer.json()))\n"
        "    print('mcp.server' in sdk())\n"
    ) % (database_url, DIRECT_CHAT, PING, JSONRPC_HEADERS)
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False, timeout=120
    )
    pong = '200 {"jsonrpc": "2.0", "id": 1, "result": {}}'
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.splitlines() == ["True", pong, pong, "True"]


def test_with_memory_disabled_every_tool_says_so(make_client):
    client = make_client(memory={"disabled": True})
    call = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "memory_list", "arguments": {}},
    }
    response = client.post("/mcp", json=call, headers=JSONRPC_HEADERS)
    assert (response.status_code, response.json()) == (
        200,
        {
            "jsonrpc": "2.0",
            "id": 1,
            "result": {
                "content": [
                    {
                        "type": "text",
                        "text": "Error: memory is disabled on this server (memory.disabled is true).",
                    }
                ],
                "isError": True,
            },
        },
    )


def test_an_oversized_body_is_refused_before_the_transport(make_client):
    client = make_client(server={"max_body_bytes": 64})
    body = json.dumps({**PING, "pad": "x" * 64})
    response = client.post("/mcp", content=body, headers=JSONRPC_HEADERS)
    assert (response.status_code, response.json()) == (
        413,
        {
            "error": {
                "code": "body_too_large",
                "message": f"the request body is {len(body)} bytes; the limit is 64",
            }
        },
    )
