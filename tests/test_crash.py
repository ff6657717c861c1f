"""Process failures: kill -9 in the middle of writes loses no acknowledged write; SIGTERM
drains in-flight streams and agent runs, then exits 0."""

from __future__ import annotations

import signal
import sqlite3
import threading
import time

import httpx
import pytest

from tests.support.apps import AGENT_MODEL, MAIN_MODEL
from tests.support.processes import ServeProcess
from tests.support.upstream import Reply

# Kills and restarts real servers.
pytestmark = pytest.mark.slow


@pytest.fixture
def processes():
    started: list[ServeProcess] = []
    yield started
    for process in started:
        process.stop()


def test_kill_9_mid_writes_loses_no_acknowledged_write(tmp_path, processes):
    db = tmp_path / "crash.db"
    # The chat model goes the direct path, never called: the default (`ollama/...`) would
    # import litellm beside start-up, 6 s of CPU in each of the two servers for nothing.
    sections = {
        "database": {"url": f"sqlite:///{db}"},
        "chat": {"model": "openai/unused", "api_base": "http://127.0.0.1:9/v1"},
        "memory": {"tokenLimit": None},
    }
    server = ServeProcess(tmp_path, sections)
    processes.append(server.start())
    acknowledged: dict[str, str] = {}
    stop = threading.Event()

    def writer(worker: int) -> None:
        # A write that times out is ambiguous and ends its writer (it could still land after a
        # later write to its key); 30 s, not 5: on a loaded machine three writers once timed
        # out and the test never reached 100 acknowledged writes.
        with httpx.Client(timeout=30) as client:
            for n in range(100_000):
                if stop.is_set():
                    return
                key, value = f"w{worker}_k{n % 50}", f"value {worker} {n}"
                try:
                    response = client.put(f"{server.url}/memory/{key}", json={"value": value})
                except httpx.TransportError:
                    return  # the server died mid-request: not acknowledged
                if response.status_code in (200, 201):
                    acknowledged[key] = value

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 20
    while len(acknowledged) < 100 and time.monotonic() < deadline:
        time.sleep(0.05)
    server.process.send_signal(signal.SIGKILL)
    server.process.wait(10)
    stop.set()
    for thread in threads:
        thread.join(10)
    assert len(acknowledged) >= 100

    with sqlite3.connect(db) as connection:
        assert connection.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    restarted = ServeProcess(tmp_path, sections, name="restarted")
    processes.append(restarted.start())
    stored = {m["key"]: m["value"] for m in httpx.get(f"{restarted.url}/memory").json()["memories"]}
    # The last value acknowledged for a key is the stored one (a later, unacknowledged write
    # to the same key may have landed too; it is newer than the acknowledged value).
    for key, value in acknowledged.items():
        assert key in stored
        ack_n = int(value.rsplit(" ", 1)[1])
        assert int(stored[key].rsplit(" ", 1)[1]) >= ack_n


def test_sigterm_drains_a_stream_and_the_agent_then_exits_0(tmp_path, processes, upstream):
    upstream.script(MAIN_MODEL, Reply(chunks=[f"part{i} " for i in range(10)], chunk_delay=0.15))
    upstream.script(
        AGENT_MODEL,
        Reply(
            content=None,
            delay=0.5,
            tool_calls=[
                {"name": "set_memory", "arguments": {"key": "diet", "value": "Vegetarian."}}
            ],
        ),
    )
    sections = {
        "database": {"url": f"sqlite:///{tmp_path / 'drain.db'}"},
        "server": {"drain_seconds": 10},
        "chat": {"model": f"openai/{MAIN_MODEL}", "api_base": upstream.url, "api_key": "k"},
        "memory": {
            "agent": {
                "provider": "openai",
                "model": AGENT_MODEL,
                "api_base": upstream.url,
                "api_key": "k",
                "grace_seconds": 3,
            }
        },
    }
    server = ServeProcess(tmp_path, sections)
    processes.append(server.start())
    # A write and its undo first: the first write waits for the token encoding, which loads
    # beside start-up, and so would the agent run, whose deadline (the reply's end + 3 s)
    # a loaded CI worker's slow load may pass; this test is about the drain, not start-up.
    # (It failed three times today under load with no write and no warning in the log;
    # the encoding's load is the likely cause, not a proven one.)
    assert httpx.put(f"{server.url}/memory/warmup", json={"value": "x"}, timeout=30).is_success
    assert httpx.delete(f"{server.url}/memory/warmup", timeout=30).is_success
    events: list[str] = []
    with httpx.stream(
        "POST",
        f"{server.url}/chat",
        json={"message": "Remember I'm vegetarian", "stream": True},
        timeout=30,
    ) as response:
        lines = response.iter_lines()
        for line in lines:
            events.append(line)
            if line.startswith("event: delta"):
                server.process.send_signal(signal.SIGTERM)
                break
        events.extend(lines)
    assert server.process.wait(20) == 0
    text = "\n".join(events)
    assert text.count("event: delta") == 10
    assert "event: done" in text
    # The agent's write landed during the drain and is kept.
    with sqlite3.connect(tmp_path / "drain.db") as connection:
        rows = connection.execute("SELECT key, value, source FROM memory_entries").fetchall()
    # Seen empty twice under heavy load (a full run beside a training job): the log says why.
    assert rows == [("diet", "Vegetarian.", "agent")], server.log.read_text()[-4000:]
