"""A real browser for the memory page: Playwright driving the system's Chromium.

Playwright's own browser download cannot work here (no internet), so it drives Debian's
`chromium` package; `.ci/run` installs it with apt when it is missing. `PageLog` records
what a page requested and what it printed to the console, so tests can prove that nothing
left 127.0.0.1 and that the page raised no errors.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

CHROMIUM = "/usr/bin/chromium"
# Headless, as root in a container (no sandbox), and quiet: no update, sync or other
# background traffic of the browser's own that a request log would have to tell apart.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--headless",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
FAILED_LOAD = re.compile(r"Failed to load resource: the server responded with a status of (\d{3})")


def launch(playwright: Any) -> Any:
    """Chromium, headless, from the system package."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


@dataclass
class PageLog:
    """Every request a page made, and its console errors and uncaught exceptions."""

    requests: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    # Statuses a test provokes on purpose: Chromium logs each failed fetch to the console.
    expected_statuses: set[int] = field(default_factory=set)

    def attach(self, page: Any) -> None:
        """Start recording `page`."""
        page.on("request", lambda request: self.requests.append(request.url))
        page.on("console", self._console)
        page.on("pageerror", lambda error: self.page_errors.append(str(error)))

    def _console(self, message: Any) -> None:
        if message.type == "error":
            self.console_errors.append(message.text)

    def hosts(self) -> set[str]:
        """The origins of every network request made, `scheme://host:port`.

        `blob:` and `data:` URLs (an export's download) never leave the browser.
        """
        parts = [urlsplit(url) for url in self.requests]
        return {f"{p.scheme}://{p.netloc}" for p in parts if p.scheme not in ("blob", "data")}

    def unexpected_errors(self) -> list[str]:
        """Console errors and exceptions, less the failed fetches the test asked for."""
        errors = list(self.page_errors)
        for text in self.console_errors:
            failed = FAILED_LOAD.match(text)
            if not (failed and int(failed.group(1)) in self.expected_statuses):
                errors.append(text)
        return errors
