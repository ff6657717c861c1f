"""Several `kvmem serve` processes on one database: limits and conversations hold across them.

Runs on SQLite (two processes on one WAL file) and, with KVMEM_TEST_POSTGRES_URL, on
PostgreSQL (the several-replicas deployment).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from kvmem.config import Config
from kvmem.db.engine import Database
from kvmem.memory.proposals import ProposalStore
from kvmem.memory.rules import MemoryRules
from kvmem.memory.store import MemoryStore
from tests.support.apps import AGENT_MODEL, MAIN_MODEL
from tests.support.ports import PortHold
from tests.support.upstream import Reply

# Two real servers on one database.
pytestmark = pytest.mark.slow

SERVICE = {"Authorization": "Bearer replica-service-key", "X-User-Id": "alice"}
TOKEN_LIMIT = 60


@pytest.fixture
def replicas(database_url: str, upstream, tmp_path: Path):
    config = {
        "database": {"url": database_url},
        "auth": {"mode": "keys", "service_keys": ["replica-service-key"]},
        "chat": {"model": f"openai/{MAIN_MODEL}", "api_base": upstream.url, "api_key": "k"},
        "memory": {
            "tokenLimit": TOKEN_LIMIT,
            "agent": {
                "provider": "openai",
                "model": AGENT_MODEL,
                "api_base": upstream.url,
                "api_key": "k",
                "grace_seconds": 5,
            },
        },
    }
    path = tmp_path / "replica.yaml"
    path.write_text(json.dumps(config), encoding="utf-8")  # JSON is YAML
    # Held until the replicas have exited, so no other process takes them meanwhile.
    holds = [PortHold(), PortHold()]
    ports = [hold.port for hold in holds]
    logs = [tmp_path / f"replica-{port}.log" for port in ports]
    handles = [log.open("w") for log in logs]
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "kvmem", "serve", "--config", str(path), "--port", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=handle,
        )
        for port, handle in zip(ports, handles, strict=True)
    ]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    try:
        # One client for every poll (`httpx.get` builds one, with its TLS context, per call).
        with httpx.Client(timeout=1) as http:
            for url, process, log in zip(urls, processes, logs, strict=True):
                deadline = time.monotonic() + 60
                while True:
                    assert process.poll() is None, log.read_text()
                    try:
                        if http.get(f"{url}/healthz").status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    assert time.monotonic() < deadline, "replica did not start"
                    time.sleep(0.1)
        yield urls
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
            process.wait()
        for handle in handles:
            handle.close()
        for hold in holds:
            hold.close()


def sse(text: str) -> list[tuple[str, dict]]:
    events = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.split("\n"))
        events.append((fields["event"], json.loads(fields["data"])))
    return events


def test_replicas_share_limits_keys_and_conversations(replicas, upstream, tokens, database_url):
    """One pair of replicas (starting them is the slow part) for every check."""
    upstream.default(AGENT_MODEL, Reply(content="nothing to do"))
    check_a_conversation_continues_on_the_other_replica(replicas, upstream)
    check_a_proposal_accepted_on_both_replicas_lands_once(replicas, database_url, tokens)
    check_limit_and_keys_hold_across_replicas(replicas, upstream, tokens)


def check_a_proposal_accepted_on_both_replicas_lands_once(replicas, database_url, tokens):
    """Both replicas accept one proposal at the same moment: one applies it, the other
    finds it gone (404), round after round."""
    carol = {**SERVICE, "X-User-Id": "carol"}
    database = Database.from_config(
        Config.model_validate({"database": {"url": database_url}}).database
    )
    try:
        proposals = ProposalStore(MemoryStore(database, MemoryRules(), tokens))
        ids = [
            proposals.propose("carol", f"k{n}", f"value {n}", conversation_id="c").id
            for n in range(20)
        ]
    finally:
        database.dispose()

    def accept(url: str, proposal_id: int, barrier: threading.Barrier) -> int:
        barrier.wait()
        return httpx.post(
            f"{url}/memory/proposals/{proposal_id}/accept", headers=carol, timeout=30
        ).status_code

    with ThreadPoolExecutor(max_workers=2) as pool:
        for proposal_id in ids:
            barrier = threading.Barrier(2)
            statuses = list(pool.map(accept, replicas, [proposal_id] * 2, [barrier] * 2))
            assert sorted(statuses) == [200, 404], proposal_id
    changes = httpx.get(f"{replicas[0]}/memory/history?limit=100", headers=carol).json()["changes"]
    assert sorted((c["key"], c["source"], c["conversation_id"]) for c in changes) == sorted(
        (f"k{n}", "agent", "c") for n in range(20)
    )
    assert httpx.get(f"{replicas[1]}/memory/proposals", headers=carol).json() == {"proposals": []}


def check_limit_and_keys_hold_across_replicas(replicas, upstream, tokens):
    agent_writes = 6
    upstream.script(
        AGENT_MODEL,
        *[
            Reply(
                content=None,
                tool_calls=[
                    {
                        "name": "set_memory",
                        "arguments": {"key": f"agent_{i}", "value": "five token value here"},
                    }
                ],
            )
            for i in range(agent_writes)
        ],
    )
    value = "one two three four five"  # 5 tokens; 30 of them are far past the limit

    def put(index: int) -> tuple[str, int]:
        url = replicas[index % 2]
        response = httpx.put(
            f"{url}/memory/key_{index}", json={"value": value}, headers=SERVICE, timeout=30
        )
        return f"key_{index}", response.status_code

    def chat(index: int) -> list[str]:
        url = replicas[index % 2]
        response = httpx.post(
            f"{url}/chat",
            json={"message": f"remember item {index}", "stream": True},
            headers=SERVICE,
            timeout=30,
        )
        assert response.status_code == 200
        done = [data for event, data in sse(response.text) if event == "done"]
        return [u["key"] for u in done[0]["memory"]["updates"]]

    with ThreadPoolExecutor(max_workers=16) as pool:
        puts = [pool.submit(put, i) for i in range(30)]
        chats = [pool.submit(chat, i) for i in range(agent_writes)]
        put_results = [f.result() for f in puts]
        agent_keys = [key for f in chats for key in f.result()]

    assert {status for _, status in put_results} <= {201, 409}
    acknowledged = {key for key, status in put_results if status == 201} | set(agent_keys)
    listings = [httpx.get(f"{url}/memory", headers=SERVICE).json() for url in replicas]
    assert listings[0] == listings[1]
    stored = {m["key"]: m for m in listings[0]["memories"]}
    assert set(stored) == acknowledged
    assert listings[0]["total_tokens"] == sum(m["token_count"] for m in stored.values())
    assert listings[0]["total_tokens"] <= TOKEN_LIMIT
    assert all(m["token_count"] == tokens.count(m["value"]) for m in stored.values())
    # The limit was reached, so some writes were refused; at least one landed.
    assert 0 < len(acknowledged) < 30 + agent_writes


def check_a_conversation_continues_on_the_other_replica(replicas, upstream):
    upstream.script(MAIN_MODEL, Reply(content="Hello Ann"), Reply(content="Still here"))
    before = len(upstream.received(MAIN_MODEL))
    agent_calls = len(upstream.received(AGENT_MODEL))
    first = httpx.post(
        f"{replicas[0]}/chat", json={"message": "I am Ann"}, headers=SERVICE, timeout=30
    )
    assert first.status_code == 200
    conversation_id = first.json()["conversation_id"]
    second = httpx.post(
        f"{replicas[1]}/chat",
        json={"message": "Who am I?", "conversation_id": conversation_id},
        headers=SERVICE,
        timeout=30,
    )
    assert second.status_code == 200
    assert second.json()["conversation_id"] == conversation_id
    sent = upstream.received(MAIN_MODEL)[before + 1].messages
    assert [(m["role"], m["content"]) for m in sent[1:]] == [
        ("user", "I am Ann"),
        ("assistant", "Hello Ann"),
        ("user", "Who am I?"),
    ]
    listed = httpx.get(f"{replicas[0]}/conversations/{conversation_id}", headers=SERVICE).json()
    assert listed["message_count"] == 4
    # These plain replies did not wait for their agent runs: let both runs make their model
    # call now, or a late one would take a reply scripted for the next check's runs.
    upstream.wait_for(AGENT_MODEL, agent_calls + 2, timeout=30)
