"""Screenshots of the `kvmem` command in a terminal for the docs (docs/operations.md):
`python -m tests.cli_screenshots [FOLDER]`.

Runs `kvmem memory list` and `kvmem check --reach` in a real terminal (a detached tmux
session, 96 x 16), takes each screen with `tmux capture-pane -e` (text and colours, as the
terminal holds them), prints the text, and renders each screen to a PNG in FOLDER (default:
docs/): rich turns the captured ANSI into HTML, the system's Chromium draws it.

The memory is a scratch database with a few entries; the chat model is the tests' scripted
upstream (an OpenAI-compatible server on 127.0.0.1), and the memory agent is an Ollama model
at a port where nothing listens: the first-contact case, one model up and one down.
"""

from __future__ import annotations

import io
import os
import shlex
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from playwright.sync_api import sync_playwright
from rich.console import Console
from rich.terminal_theme import DIMMED_MONOKAI
from rich.text import Text

from tests.support.browser import launch
from tests.support.upstream import ScriptedUpstream

COLUMNS, ROWS = 96, 16
MEMORIES = [
    ("user_preferences", "Prefers short answers with a code example. Uses metric units."),
    ("personal_info", "Name: Camille. Works night shifts as a nurse in Lyon."),
    (
        "learned_facts",
        "Has two cats, Miso and Tofu. Allergic to penicillin. Cycles to work, 12 km each way, "
        "and is training for a trip through the Alps in June.",
    ),
]
KVMEM = [sys.executable, "-m", "kvmem"]


def screen(folder: Path, command: list[str], session: str) -> str:
    """Run `command` in a fresh tmux terminal in `folder`; the screen with its colours."""
    environment = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "COLUMNS")}
    shown = shlex.join(["kvmem", *command[len(KVMEM) :]])
    # No shell prompt on the screen: a shell that prints the command line, runs it, and
    # waits to be captured.
    script = (
        f"echo {shlex.quote('$ ' + shown)}; {shlex.join(command)}; "
        f"tmux wait-for -S {session}; sleep 60"
    )
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", session, "-x", str(COLUMNS), "-y", str(ROWS)]
        + ["sh", "-c", script],
        check=True,
        cwd=folder,
        env={**environment, "TERM": "xterm-256color"},
    )
    try:
        subprocess.run(["tmux", "wait-for", session], check=True, timeout=120)
        return subprocess.run(
            ["tmux", "capture-pane", "-p", "-e", "-t", session],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], check=False)


def to_png(captured: str, path: Path, browser: object) -> None:
    """The captured screen (ANSI) drawn as a terminal would, into `path`."""
    console = Console(record=True, width=COLUMNS + 1, force_terminal=True, file=io.StringIO())
    console.print(Text.from_ansi(captured.rstrip("\n")), soft_wrap=True)
    html = console.export_html(theme=DIMMED_MONOKAI, inline_styles=True, code_format=HTML)
    page = browser.new_page(viewport={"width": 900, "height": 300})  # type: ignore[attr-defined]
    page.set_content(html)
    page.locator("pre").screenshot(path=str(path))
    page.close()


HTML = """<!DOCTYPE html><html><head><meta charset="utf-8"><style>
body {{ margin: 0; background: {background}; }}
pre {{ display: inline-block; margin: 0; padding: 14px 18px; color: {foreground};
       background: {background}; font: 14px/1.35 "DejaVu Sans Mono", monospace; }}
</style></head><body><pre>{code}</pre></body></html>"""


def main(folder: Path) -> None:
    upstream = ScriptedUpstream().start()
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: Ollama "not started"
    try:
        with tempfile.TemporaryDirectory() as scratch:
            work = Path(scratch)
            (work / "memory.yaml").write_text(
                "database: {url: 'sqlite:///kv.db'}\n"
                f"chat: {{model: openai/llama3.1, api_base: '{upstream.url}'}}\n"
                "memory:\n  tokenLimit: 2000\n  agent:\n    provider: ollama\n"
                f"    model: llama3.2\n    api_base: 'http://127.0.0.1:{closed.getsockname()[1]}'\n",
                encoding="utf-8",
            )
            for key, value in MEMORIES:
                subprocess.run(
                    [*KVMEM, "memory", "set", key, value], cwd=work, check=True, capture_output=True
                )
            screens = {
                "cli-memory-list.png": screen(work, [*KVMEM, "memory", "list"], "kvmem-list"),
                "cli-check-reach.png": screen(work, [*KVMEM, "check", "--reach"], "kvmem-reach"),
            }
        with sync_playwright() as playwright:
            browser = launch(playwright)
            for name, captured in screens.items():
                print(f"--- {name}\n{Text.from_ansi(captured).plain.rstrip()}\n")
                to_png(captured, folder / name, browser)
            browser.close()
    finally:
        closed.close()
        upstream.stop()


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("docs"))
