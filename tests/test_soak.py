"""A bounded soak: mixed chat and memory traffic on a live server (real sockets), with no error
answer, and no growth in open file descriptors, event-loop tasks or RSS beyond noise once
warmed up.

Short by default (about 16 s); long mode: KVMEM_SOAK_SECONDS=300.
"""

from __future__ import annotations

import contextlib
import gc
import os
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import psutil
import pytest

from kvmem.upstream.base import UPSTREAM_KEEPALIVE_SECONDS
from kvmem.upstream.litellm_client import load_litellm
from tests.support.apps import (
    AGENT_MODEL,
    MAIN_MODEL,
    LiveServer,
    live_services,
    loop_tasks,
    set_memory,
    sse_events,
    stop_recording_warnings,
    wait_until,
)
from tests.support.upstream import Reply

# Seconds of mixed traffic.
pytestmark = pytest.mark.slow

SOAK_ENV = "KVMEM_SOAK_SECONDS"
SOAK_SECONDS = float(os.environ.get(SOAK_ENV) or 16)
WARM_UP_SECONDS = max(4.0, SOAK_SECONDS / 5)
CLIENTS = 3
# Noise bounds, measured while idle before and after the measured phase.
FD_SLACK = 8
# SQLite: the database file and its WAL per pooled connection, in the one pool of reads and
# writes, which holds at most pool_size + max_overflow connections (5 + 10 by default).
DB_FDS_BOUND = 2 * (5 + 10)
TASK_SLACK = 2
RSS_SLACK_BYTES = 48 * 1024 * 1024


@dataclass
class Traffic:
    """What the clients sent and what went wrong."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    sent: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)

    def count(self, op: str) -> None:
        with self.lock:
            self.sent[op] += 1

    def error(self, text: str) -> None:
        with self.lock:
            self.errors.append(text[:300])


def client_loop(number: int, url: str, stop: threading.Event, traffic: Traffic) -> None:
    """One client: its own keys and conversations, a weighted mix of every kind of request."""
    rng = random.Random(number)
    keys: set[str] = set()
    conversations: list[str] = []
    completion = {
        "model": f"openai/{MAIN_MODEL}",
        "messages": [{"role": "user", "content": "hello there"}],
    }
    ops = [
        "put",
        "get",
        "list",
        "delete",
        "chat",
        "stream",
        "continue",
        "conversations",
        "conversation",
        "completion",
        "completion_stream",
        "forget",
    ]
    weights = [12, 6, 6, 4, 8, 6, 5, 3, 3, 5, 4, 1]
    with httpx.Client(base_url=url, timeout=30) as http:
        while not stop.is_set():
            op = rng.choices(ops, weights)[0]
            key = f"c{number}k{rng.randint(0, 9)}"
            try:
                if op == "put":
                    response = http.put(f"/memory/{key}", json={"value": f"value {rng.random()}"})
                    keys.add(key)
                elif op == "get" and keys:
                    response = http.get(f"/memory/{min(keys)}")
                elif op == "delete" and keys:
                    gone = sorted(keys)[rng.randrange(len(keys))]
                    keys.discard(gone)
                    response = http.delete(f"/memory/{gone}")
                elif op == "chat":
                    response = http.post("/chat", json={"message": "Remember I like tea."})
                    if response.status_code == 200:
                        conversations.append(response.json()["conversation_id"])
                elif op == "forget" or len(conversations) > 6:  # a steady-sized database
                    op = "forget"
                    if not conversations:
                        continue
                    response = http.delete(f"/conversations/{conversations.pop(0)}")
                elif op == "stream":
                    response = http.post("/chat", json={"message": "hi", "stream": True})
                    if response.status_code == 200 and sse_events(response.text)[-1][0] != "done":
                        traffic.error(f"stream without done: {response.text[-200:]}")
                elif op == "continue" and conversations:
                    response = http.post(
                        "/chat",
                        json={
                            "message": "and then?",
                            "max_turns": 2,
                            "conversation_id": conversations[-1],
                        },
                    )
                elif op == "conversations":
                    response = http.get("/conversations")
                elif op == "conversation" and conversations:
                    response = http.get(f"/conversations/{conversations[0]}")
                elif op == "completion":
                    response = http.post("/v1/chat/completions", json=completion)
                elif op == "completion_stream":
                    response = http.post(
                        "/v1/chat/completions", json={**completion, "stream": True}
                    )
                    if response.status_code == 200 and not response.text.endswith(
                        "data: [DONE]\n\n"
                    ):
                        traffic.error(f"completion stream without [DONE]: {response.text[-200:]}")
                else:
                    response = http.get("/memory")
                    op = "list"
            except httpx.HTTPError as exc:
                traffic.error(f"{op}: {type(exc).__name__}: {exc}")
                continue
            traffic.count(op)
            if response.status_code >= 400:
                traffic.error(f"{op} answered {response.status_code}: {response.text}")


def run_traffic(
    server: LiveServer, upstream: Any, seconds: float, traffic: Traffic, first: int
) -> None:
    """Run the clients for `seconds`. The scripted upstream's log of requests is emptied as
    they go: it is the test's memory, not kvmem's, and would grow with every request."""
    stop = threading.Event()
    threads = [
        threading.Thread(target=client_loop, args=(first + n, server.url, stop, traffic))
        for n in range(CLIENTS)
    ]
    for thread in threads:
        thread.start()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(min(0.5, max(0.0, end - time.monotonic())))
        del upstream.requests[:]
    stop.set()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)


@dataclass(frozen=True)
class Usage:
    """The resources of this process (the server runs in it) and of the server's loop."""

    fds: int  # open files but the database's
    db_fds: int  # the database's files held open by pooled connections (two per connection)
    kinds: Counter[str]  # what the open files are (a failure shows what grew)
    tasks: list[str]
    rss: int


def settle_and_measure(server: LiveServer) -> Usage:
    """Wait for the agent runs to end, then measure."""
    agent = live_services(server).agent
    wait_until(lambda: agent.in_flight == 0, 10, "the agent runs ending")
    time.sleep(0.5)  # let closed connections finish closing
    gc.collect()
    links = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed between the listing and the look
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
    database = str(live_services(server).database.engine.url.database)
    db_fds = sum(1 for link in links if link in (database, f"{database}-wal"))
    return Usage(
        fds=len(links) - db_fds,
        db_fds=db_fds,
        kinds=Counter(link.split(":")[0] if ":" in link else link for link in links),
        tasks=loop_tasks(server),
        rss=psutil.Process().memory_info().rss,
    )


def test_mixed_traffic_leaves_no_errors_and_no_growth(
    upstream: Any, chat_sections: Any, make_server: Callable[..., LiveServer]
) -> None:
    assert SOAK_SECONDS > WARM_UP_SECONDS, f"{SOAK_ENV} leaves no time after the warm-up"
    server = make_server(**chat_sections(agent={"grace_seconds": 1}))
    # Every agent run writes a memory, so agent writes race the clients' own writes.
    upstream.default(AGENT_MODEL, Reply(content=None, tool_calls=[set_memory("drink", "tea")]))
    upstream.default(MAIN_MODEL, Reply(content="Sure, noted.", chunks=["Sure, ", "noted."]))
    # A model that needs litellm has it imported in a thread beside start-up (~80 MiB, one
    # time): the growth measured below is the traffic's, so the import ends first.
    preloading = live_services(server).client.preloading
    if preloading is not None:
        preloading.join(120)
    if "litellm" in sys.modules:  # an earlier test's app of this worker may still import it:
        load_litellm()  # one large import at a time, so this waits for that one to end
    warm = Traffic()
    run_traffic(server, upstream, WARM_UP_SECONDS, warm, first=0)
    assert warm.errors == []
    before = settle_and_measure(server)

    traffic = Traffic()
    run_traffic(server, upstream, SOAK_SECONDS - WARM_UP_SECONDS, traffic, first=CLIENTS)
    after = settle_and_measure(server)
    # Idle upstream connections stay pooled for UPSTREAM_KEEPALIVE_SECONDS, two files each
    # (kvmem's end and the scripted upstream's, both in this process): a busier moment than
    # the warm-up's opens more of them. Those close by themselves; a leaked one never does.
    deadline = time.monotonic() + UPSTREAM_KEEPALIVE_SECONDS + 5
    while after.fds - before.fds > FD_SLACK and time.monotonic() < deadline:
        time.sleep(0.5)
        after = settle_and_measure(server)
    agent_wrote = httpx.get(f"{server.url}/memory/drink", timeout=10).json()
    stop_recording_warnings(server)  # shutdown's own leak has its test in test_faults.py

    assert traffic.errors == []
    assert sum(traffic.sent.values()) >= 5 * (SOAK_SECONDS - WARM_UP_SECONDS)  # it was busy
    assert {"put", "chat", "stream", "completion", "completion_stream"} <= set(traffic.sent)
    assert after.fds - before.fds <= FD_SLACK, (before.fds, after.fds, before.kinds, after.kinds)
    # The pools keep what peak concurrency opened, up to their size: how many depends on the
    # machine's timing, so the database's files are bounded by what the pools allow, which a
    # connection leaked per request would pass many times over in this run.
    assert after.db_fds <= DB_FDS_BOUND, (before.db_fds, after.db_fds)
    assert len(after.tasks) - len(before.tasks) <= TASK_SLACK, (before.tasks, after.tasks)
    assert after.rss - before.rss <= RSS_SLACK_BYTES, (
        f"RSS grew {(after.rss - before.rss) / 2**20:.1f} MB over {sum(traffic.sent.values())} requests"
    )
    assert (agent_wrote["value"], agent_wrote["source"]) == ("tea", "agent")
