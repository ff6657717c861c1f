"""The memory page and memories that expire (CONTRACT section 24) in a real browser, on a real
`kvmem serve`: an entry shows "until <date>", and the form sets and clears the expiry.

Chromium (the system package) driven by Playwright; elements found by role and accessible
name only. A screenshot of the page with an expiring entry is written to the test's folder
(`KVMEM_UI_SHOTS` names another folder to keep it).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from tests.support.browser import PageLog, launch
from tests.support.processes import ServeProcess

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ui-expiry")]
expect.set_options(timeout=15_000)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    folder = tmp_path_factory.mktemp("expiry-ui")
    served = ServeProcess(folder, {"database": {"url": f"sqlite:///{folder / 'kvmem.db'}"}})
    served.start(timeout=120)
    yield served
    served.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        chromium = launch(playwright)
        yield chromium
        chromium.close()


def stored(server: ServeProcess, key: str) -> dict[str, Any]:
    response = httpx.get(f"{server.url}/memory/{key}", timeout=30)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def item(page: Page, key: str) -> Any:
    return (
        page.get_by_role("list", name="Memories", exact=True)
        .get_by_role("listitem")
        .filter(has=page.get_by_role("heading", name=key, exact=True))
    )


def test_the_page_shows_until_and_sets_and_clears_the_expiry(
    server: ServeProcess, browser: Browser, tmp_path: Path
) -> None:
    day = (datetime.now(UTC) + timedelta(days=5)).date().isoformat()
    later = (datetime.now(UTC) + timedelta(days=12)).date().isoformat()
    put = httpx.put(
        f"{server.url}/memory/trip",
        json={"value": "In Lisbon for a conference.", "expires_at": day},
        timeout=30,
    )
    assert put.status_code in (200, 201), put.text
    httpx.put(f"{server.url}/memory/name", json={"value": "Ada"}, timeout=30)

    context = browser.new_context(viewport={"width": 900, "height": 900})
    page = context.new_page()
    log = PageLog(expected_statuses={400})  # the refusal the test provokes
    log.attach(page)
    page.goto(f"{server.url}/ui")
    expect(page.get_by_role("list", name="Memories", exact=True)).to_have_attribute(
        "aria-busy", "false"
    )
    expect(item(page, "trip")).to_contain_text(f"until {day}")
    expect(item(page, "name")).not_to_contain_text("until")
    shots = Path(os.environ.get("KVMEM_UI_SHOTS") or tmp_path)
    page.screenshot(path=str(shots / "expiry-page.png"), full_page=True)

    # Edit fills the day; a new day is saved as the end of that day, UTC.
    item(page, "trip").get_by_role("button", name="Edit").click()
    field = page.get_by_label("Remember until", exact=True)
    expect(field).to_have_value(day)
    field.fill(later)
    page.get_by_role("form", name="Add memory").get_by_role("button", name="Save").click()
    expect(item(page, "trip")).to_contain_text(f"until {later}")
    assert stored(server, "trip")["expires_at"] == f"{later}T23:59:59.000000Z"

    # Clearing the day makes it an entry that never expires.
    item(page, "trip").get_by_role("button", name="Edit").click()
    field.fill("")
    page.get_by_role("form", name="Add memory").get_by_role("button", name="Save").click()
    expect(item(page, "trip")).not_to_contain_text("until")
    assert stored(server, "trip")["expires_at"] is None

    # A new entry with a day from the form.
    page.get_by_label("Key", exact=True).fill("visit")
    page.get_by_label("Value", exact=True).fill("My sister is staying with me.")
    field.fill(day)
    page.get_by_role("form", name="Add memory").get_by_role("button", name="Save").click()
    expect(item(page, "visit")).to_contain_text(f"until {day}")
    expect(field).to_have_value("")

    # A day already past is refused by the server, shown as an alert; nothing is lost.
    item(page, "visit").get_by_role("button", name="Edit").click()
    field.fill("2001-01-01")
    page.get_by_role("form", name="Add memory").get_by_role("button", name="Save").click()
    expect(page.get_by_role("alert")).to_contain_text("is not in the future")
    expect(field).to_have_value("2001-01-01")
    assert stored(server, "visit")["expires_at"] == f"{day}T23:59:59.000000Z"
    context.close()
    assert log.hosts() <= {server.url}
    assert log.unexpected_errors() == []
