"""Screenshots of the memory page for the docs (docs/page.md): `python -m tests.ui_screenshots [FOLDER]`.

Starts a real `kvmem serve` (local mode) on a scratch database, fills it with a few
memories (one saved by the memory agent through /chat, on the scripted upstream), dates
them back a little so the relative dates read naturally, and writes
`memory-page-desktop.png` (light) and `memory-page-mobile-dark.png` (360 px, dark) to
FOLDER (default: docs/). Then, with `memory.review: on`, a chat whose agent proposes a new
memory and the removal of an old one, and `memory-page-suggestions.png` of the page with
its "Suggested memories".
"""

from __future__ import annotations

import sqlite3
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from playwright.sync_api import sync_playwright

from tests.support.apps import AGENT_MODEL, MAIN_MODEL, set_memory
from tests.support.browser import launch
from tests.support.processes import ServeProcess
from tests.support.upstream import Reply, ScriptedUpstream

MEMORIES = [
    # key, value, days ago
    ("user_preferences", "Prefers short answers with a code example. Uses metric units.", 12),
    ("personal_info", "Name: Camille. Works night shifts as a nurse in Lyon.", 9),
    ("learned_facts", "Has two cats, Miso and Tofu. Allergic to penicillin.", 3),
]
AGENT_MEMORY = (
    "conversation_context",
    "Planning a cycling trip through the Alps in June; wants routes under 80 km a day.",
)


def fill(server: ServeProcess, upstream: ScriptedUpstream) -> None:
    """The memories, written as a person and the agent would write them."""
    for key, value, _ in MEMORIES:
        httpx.put(f"{server.url}/memory/{key}", json={"value": value}).raise_for_status()
    key, value = AGENT_MEMORY
    upstream.script(MAIN_MODEL, Reply(content="Noted, I'll keep that in mind."))
    # One reply: a write that lands needs no second call (a reply left over would be the
    # next run's, in `suggest`).
    # Until the end of the trip's June: the page shows "until <date>".
    june = datetime.now(UTC).year + (datetime.now(UTC).month > 6)
    call = set_memory(key, value, expires_at=f"{june}-06-30")
    upstream.script(AGENT_MODEL, Reply(content=None, tool_calls=[call]))
    httpx.post(
        f"{server.url}/chat",
        json={
            "message": "Remember: I'm planning a cycling trip "
            "in the Alps in June, under 80 km a day."
        },
        timeout=30,
    ).raise_for_status()
    deadline = time.monotonic() + 30
    while httpx.get(f"{server.url}/memory/{key}").status_code != 200:
        if time.monotonic() > deadline:
            raise RuntimeError("the agent's memory did not land")
        time.sleep(0.1)


def backdate(database: Path) -> None:
    """Spread the entries over the last days, as a memory used for a while looks."""
    now = datetime.now(UTC)
    with sqlite3.connect(database) as connection:
        for key, _, days in MEMORIES:
            moment = (now - timedelta(days=days, hours=2)).strftime("%Y-%m-%d %H:%M:%S.%f")
            connection.execute(
                "UPDATE memory_entries SET created_at = ?, updated_at = ? WHERE key = ?",
                (moment, moment, key),
            )


def shoot(url: str, folder: Path) -> list[Path]:
    """The two screenshots of the page at `url`."""
    shots = [
        ("memory-page-desktop.png", {"width": 1100, "height": 900}, "light"),
        ("memory-page-mobile-dark.png", {"width": 360, "height": 780}, "dark"),
    ]
    written = []
    with sync_playwright() as playwright:
        browser = launch(playwright)
        for name, viewport, scheme in shots:
            context = browser.new_context(
                viewport=viewport,
                color_scheme=scheme,
                device_scale_factor=2 if viewport["width"] < 500 else 1,
            )
            page = context.new_page()
            page.goto(url)
            page.get_by_role("list", name="Memories", exact=True).get_by_role(
                "listitem"
            ).first.wait_for()
            path = folder / name
            page.screenshot(path=str(path), full_page=True)
            written.append(path)
            context.close()
        browser.close()
    return written


SUGGESTIONS = [
    set_memory(
        "conversation_context",
        "Planning a cycling trip through the Alps in June; "
        "booked the Col du Galibier stage for the 14th.",
    ),
    {"name": "delete_memory", "arguments": {"key": "learned_facts"}},
]


def suggest(server: ServeProcess, upstream: ScriptedUpstream) -> None:
    """A chat under review: the agent's writes become the page's suggestions."""
    upstream.script(MAIN_MODEL, Reply(content="Great, the Galibier stage is a classic."))
    upstream.script(AGENT_MODEL, Reply(content=None, tool_calls=SUGGESTIONS))
    httpx.post(
        f"{server.url}/chat",
        json={
            "message": "I booked the Galibier stage for the "
            "14th. Oh, and the cats went to my sister's for good."
        },
        timeout=30,
    ).raise_for_status()
    deadline = time.monotonic() + 30
    while len(httpx.get(f"{server.url}/memory/proposals").json()["proposals"]) < len(SUGGESTIONS):
        if time.monotonic() > deadline:
            raise RuntimeError("the agent's proposals did not arrive")
        time.sleep(0.1)


def shoot_suggestions(url: str, folder: Path) -> Path:
    """The page with its suggested memories, on a desktop screen."""
    path = folder / "memory-page-suggestions.png"
    with sync_playwright() as playwright:
        browser = launch(playwright)
        # Tall enough for every entry: those off screen are not painted (content-visibility).
        context = browser.new_context(
            viewport={"width": 1100, "height": 1800}, color_scheme="light"
        )
        page = context.new_page()
        page.goto(url)
        page.get_by_role("list", name="Suggested memories").get_by_role("listitem").first.wait_for()
        page.screenshot(path=str(path), full_page=True)
        context.close()
        browser.close()
    return path


def main(folder: Path) -> None:
    """Serve, fill, date back, restart (so no cache holds the old dates) and shoot."""
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        upstream = ScriptedUpstream().start()
        database = Path(scratch) / "kvmem.db"
        sections = {
            "database": {"url": f"sqlite:///{database}"},
            "chat": {"model": f"openai/{MAIN_MODEL}", "api_base": upstream.url, "api_key": "x"},
            "memory": {
                "tokenLimit": 200,
                "agent": {
                    "provider": "openai",
                    "model": AGENT_MODEL,
                    "api_base": upstream.url,
                    "api_key": "x",
                },
            },
        }
        server = ServeProcess(Path(scratch), sections).start()
        try:
            fill(server, upstream)
            server.stop()
            backdate(database)
            server.start()
            for path in shoot(f"{server.url}/ui", folder):
                print(path)
            server.stop()
            reviewing = {**sections, "memory": {**sections["memory"], "review": "on"}}
            server = ServeProcess(Path(scratch), reviewing, name="review").start()
            suggest(server, upstream)
            print(shoot_suggestions(f"{server.url}/ui", folder))
        finally:
            server.stop()
            upstream.stop()


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs"))
