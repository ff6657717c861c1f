"""`python -m tests.bench.ui [--entries N] [--runs N] [--quick]`: the memory page's load-to-render.

Starts a real `kvmem serve` (local mode, SQLite), gives its user N entries (default 200,
values of about 30 tokens), then opens /ui in Chromium, each run in a fresh browser
context (no cache), and reads the page's own `kvmem:rendered` mark: the time from
navigation start until the list of memories is in the document. Prints the runs' median,
p90, min and max next to the goal (under 300 ms). Measures; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from playwright.sync_api import sync_playwright

from tests.support.browser import launch
from tests.support.processes import ServeProcess

GOAL_MS = 300.0
VALUE = "Prefers concise answers with one worked example, metric units and sources linked at the end ({})."


def load_to_render(browser: Any, url: str, runs: int, entries: int) -> list[float]:
    """Milliseconds from navigation start to the rendered list, one per run."""
    times = []
    for _ in range(runs):
        context = browser.new_context()
        page = context.new_page()
        page.goto(url)
        items = page.get_by_role("list", name="Memories", exact=True).get_by_role("listitem")
        items.nth(entries - 1).wait_for()
        shown = items.count()
        if shown != entries:
            raise RuntimeError(f"the page shows {shown} entries, not {entries}")
        times.append(page.evaluate("performance.getEntriesByName('kvmem:rendered')[0].startTime"))
        context.close()
    return times


def seed(server: ServeProcess, entries: int) -> None:
    """`entries` memories for the local user."""
    with httpx.Client(base_url=server.url, timeout=30) as client:
        for n in range(entries):
            client.put(f"/memory/fact_{n:03d}", json={"value": VALUE.format(n)}).raise_for_status()


def percentile(values: list[float], share: float) -> float:
    """The nearest-rank percentile of `values`."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered)) - 1))]


def main(argv: list[str]) -> int:
    """Run the benchmark and print its table."""
    parser = argparse.ArgumentParser(prog="python -m tests.bench.ui")
    parser.add_argument("--entries", type=int, default=200)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="2 runs of 20 entries")
    args = parser.parse_args(argv)
    entries, runs = (20, 2) if args.quick else (args.entries, args.runs)

    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        server = ServeProcess(folder, {"database": {"url": f"sqlite:///{folder / 'kvmem.db'}"}})
        server.start(timeout=120)
        try:
            started = time.monotonic()
            seed(server, entries)
            print(f"seeded {entries} entries in {time.monotonic() - started:.1f} s")
            with sync_playwright() as playwright:
                browser = launch(playwright)
                load_to_render(browser, f"{server.url}/ui", 1, entries)  # warm the server
                times = load_to_render(browser, f"{server.url}/ui", runs, entries)
                browser.close()
        finally:
            server.stop()

    median = statistics.median(times)
    print(f"\n| memory page, {entries} entries, {runs} runs | ms |")
    print("|---|---:|")
    for name, value in [
        ("median", median),
        ("p90", percentile(times, 0.9)),
        ("min", min(times)),
        ("max", max(times)),
    ]:
        print(f"| load-to-render {name} | {value:.0f} |")
    verdict = "PASS" if median < GOAL_MS else "MISS"
    print(f"\ngoal: median under {GOAL_MS:.0f} ms: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
