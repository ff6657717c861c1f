"""The memory page and scopes (CONTRACT section 23) in a real browser, on a real `kvmem serve`:
the switcher between the person's own memory and each of their scopes, every action of the page
on the layer shown, and a server without `memory.scopes`, where there is no switcher.

Chromium (the system package) driven by Playwright; elements found by role and accessible name
only. What the page did is checked through the REST API, layer by layer: the scope edited
changed, the person's own memory, their other scopes and another user's scope of the same name
did not. Screenshots (light, dark, 360 px) are written to the test's folder (`KVMEM_UI_SHOTS`
names another folder to keep them).
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import httpx
import pytest
from playwright.sync_api import Browser, Page, Route, expect, sync_playwright

from kvmem.config_loader import parse_config
from kvmem.db.engine import Database
from kvmem.memory.proposals import ProposalStore
from kvmem.memory.rules import MemoryRules
from kvmem.memory.store import MemoryStore
from kvmem.tokens import TokenCounter
from tests.support.browser import PageLog, launch
from tests.support.processes import ServeProcess

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ui-scopes")]
expect.set_options(timeout=15_000)

SERVICE_KEY = "svc-ui-scopes-5e81c0"
OWN_KEYS = ["user_preferences", "learned_facts"]
SCOPED_KEYS = ["project_notes", "project_decisions"]
OWN_LIMIT = 100
SCOPE_LIMIT = 60
KITCHEN = "project:kitchen"
THESIS = "thesis/ch-2"
COOK = "assistant:cook"
WAIT = 30.0


# --- servers, users and pages -----------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """`auth.mode: keys` and `memory.scopes`, each layer with its keys and its token limit."""
    folder = tmp_path_factory.mktemp("scopes-ui")
    sections = {
        "database": {"url": f"sqlite:///{folder / 'kvmem.db'}"},
        "auth": {"mode": "keys", "service_keys": [SERVICE_KEY]},
        "memory": {
            "validKeys": OWN_KEYS,
            "tokenLimit": OWN_LIMIT,
            "scopes": {"validKeys": SCOPED_KEYS, "tokenLimit": SCOPE_LIMIT},
        },
    }
    served = ServeProcess(folder, sections).start(timeout=120)
    yield served
    served.stop()


@pytest.fixture(scope="module")
def plain_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """A server without `memory.scopes` (`auth.mode: local`)."""
    folder = tmp_path_factory.mktemp("no-scopes-ui")
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


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    return Path(os.environ.get("KVMEM_UI_SHOTS") or tmp_path)


class User:
    """A fresh user of `server`, and REST calls made as them with the service key."""

    def __init__(self, server: ServeProcess) -> None:
        self.server = server
        self.name = f"user-{uuid.uuid4().hex[:10]}"
        self.headers = {"Authorization": f"Bearer {SERVICE_KEY}", "X-User-Id": self.name}

    def call(
        self, method: str, path: str, scope: str | None = None, **kwargs: Any
    ) -> httpx.Response:
        """`path` on the layer `scope` (None: the person's own)."""
        if scope is not None:
            path += ("&" if "?" in path else "?") + "scope=" + quote(scope, safe="")
        return httpx.request(
            method, self.server.url + path, headers=self.headers, timeout=WAIT, **kwargs
        )

    def put(self, key: str, value: str, scope: str | None = None) -> None:
        written = self.call("PUT", f"/memory/{key}", scope, json={"value": value})
        assert written.status_code in (200, 201), written.text

    def layer(self, scope: str | None = None) -> dict[str, Any]:
        """`GET /memory` of the layer `scope`, whole."""
        listed = self.call("GET", "/memory", scope)
        assert listed.status_code == 200, listed.text
        body: dict[str, Any] = listed.json()
        return body

    def values(self, scope: str | None = None) -> dict[str, str]:
        return {entry["key"]: entry["value"] for entry in self.layer(scope)["memories"]}

    def session(self) -> str:
        made = self.call("POST", "/sessions")
        assert made.status_code == 201, made.text
        token: str = made.json()["token"]
        return token


def propose(server: ServeProcess, user: str, key: str, value: str | None, scope: str) -> None:
    """A proposal of the memory agent's for `user` in the layer `scope` ("": their own), made
    in the server's database as a run under `memory.review: on` makes it."""
    config = parse_config(json.loads(server.config.read_text()), server.config, {}).config
    database = Database.from_config(config.database)
    try:
        store = MemoryStore(database, MemoryRules.from_config(config.memory), TokenCounter())
        ProposalStore(store).propose(user, key, value, conversation_id="conv-ui", scope=scope)
    finally:
        database.dispose()


@pytest.fixture
def open_page(browser: Browser) -> Iterator[Callable[..., tuple[Page, PageLog]]]:
    """Open a URL in a fresh browser context; on teardown, check what the page did."""
    opened: list[tuple[Any, PageLog, str]] = []

    def open_(
        url: str, *, expected_statuses: tuple[int, ...] = (), **context_options: Any
    ) -> tuple[Page, PageLog]:
        context = browser.new_context(**context_options)
        page = context.new_page()
        log = PageLog(expected_statuses=set(expected_statuses))
        log.attach(page)
        page.goto(url)
        opened.append((context, log, url))
        expect(memories(page)).to_have_attribute("aria-busy", "false")
        return page, log

    yield open_
    for context, log, url in opened:
        context.close()
        origin = re.match(r"https?://[^/]+", url)
        assert origin is not None
        assert log.hosts() <= {origin.group(0)}
        assert log.unexpected_errors() == []


def open_as(
    open_page: Callable[..., tuple[Page, PageLog]], user: User, **options: Any
) -> tuple[Page, PageLog]:
    """The page opened the way a front end links to it: a session token in the fragment."""
    return open_page(f"{user.server.url}/ui#token={user.session()}", **options)


def switcher(page: Page) -> Any:
    return page.get_by_role("combobox", name="Scope", exact=True)


def memories(page: Page) -> Any:
    return page.get_by_role("list", name="Memories", exact=True)


def item(page: Page, key: str) -> Any:
    """The list item of `key` (its heading is the key)."""
    return (
        memories(page)
        .get_by_role("listitem")
        .filter(has=page.get_by_role("heading", name=key, exact=True))
    )


def keys_of(page: Page) -> list[str]:
    return memories(page).get_by_role("heading").all_inner_texts()


def form(page: Page) -> Any:
    return page.get_by_role("form", name="Add memory")


def save(page: Page, key: str | None, value: str, until: str | None = None) -> None:
    """Fill the form as a person would and press Save."""
    if key is not None:
        page.get_by_label("Key", exact=True).select_option(key)
    page.get_by_label("Value", exact=True).fill(value)
    if until is not None:
        page.get_by_label("Remember until", exact=True).fill(until)
    form(page).get_by_role("button", name="Save").click()


def suggestion(page: Page, key: str) -> Any:
    return (
        page.get_by_role("list", name="Suggested memories")
        .get_by_role("listitem")
        .filter(has=page.get_by_role("heading", name=key, exact=True))
    )


def open_scope(page: Page, name: str) -> Any:
    """Type `name` into "New scope" and press Open; returns the form."""
    page.get_by_role("button", name="New scope").click()
    opener = page.get_by_role("form", name="Open a scope")
    opener.get_by_label("Scope name").fill(name)
    opener.get_by_role("button", name="Open").click()
    return opener


# --- the tests ---------------------------------------------------------------------------


def test_the_page_switches_scope_and_edits_there_leaving_the_rest_unchanged(
    server: ServeProcess, open_page: Any
) -> None:
    user = User(server)
    user.put("user_preferences", "Short answers.")
    user.put("project_notes", "Oak worktops.", KITCHEN)
    user.put("project_notes", "Chapter two: priors.", THESIS)
    other = User(server)  # a scope of the same name is theirs alone
    other.put("project_notes", "Someone else's kitchen.", KITCHEN)
    own, thesis, others = user.layer(), user.layer(THESIS), other.layer(KITCHEN)
    day = (datetime.now(UTC) + timedelta(days=5)).date().isoformat()

    page, _ = open_as(open_page, user)
    expect(switcher(page)).to_have_value("")
    expect(switcher(page).get_by_role("option")).to_have_text(["My memory", KITCHEN, THESIS])
    assert keys_of(page) == ["user_preferences"]
    expect(page.get_by_label("Key", exact=True).get_by_role("option")).to_have_text(
        ["Choose a key…", *OWN_KEYS]
    )

    switcher(page).select_option(label=KITCHEN)
    expect(item(page, "project_notes")).to_contain_text("Oak worktops.")
    assert keys_of(page) == ["project_notes"]
    expect(page.get_by_text(f"of {SCOPE_LIMIT} tokens")).to_be_visible()
    expect(page.get_by_label("Key", exact=True).get_by_role("option")).to_have_text(
        ["Choose a key…", *SCOPED_KEYS]
    )

    # Edit (with an expiry) and add, in the scope.
    item(page, "project_notes").get_by_role("button", name="Edit").click()
    save(page, None, "Oak worktops, white tiles.", until=day)
    expect(item(page, "project_notes")).to_contain_text("Oak worktops, white tiles.")
    expect(item(page, "project_notes")).to_contain_text(f"until {day}")
    save(page, "project_decisions", "Budget: 8000 euros.")
    expect(item(page, "project_decisions")).to_contain_text("Budget: 8000 euros.")
    kitchen = user.layer(KITCHEN)
    assert (kitchen["scope"], kitchen["token_limit"], kitchen["valid_keys"]) == (
        KITCHEN,
        SCOPE_LIMIT,
        SCOPED_KEYS,
    )
    assert {e["key"]: (e["value"], e["expires_at"]) for e in kitchen["memories"]} == {
        "project_notes": ("Oak worktops, white tiles.", f"{day}T23:59:59.000000Z"),
        "project_decisions": ("Budget: 8000 euros.", None),
    }
    assert (user.layer(), user.layer(THESIS), other.layer(KITCHEN)) == (own, thesis, others)

    # History and Restore, in the scope.
    item(page, "project_notes").get_by_role("button", name="History").click()
    dialog = page.get_by_role("dialog", name="History of “project_notes”")
    changes = dialog.get_by_role("list", name="Changes").get_by_role("listitem")
    expect(changes).to_have_count(2)
    changes.nth(1).get_by_role("button", name="Restore").click()
    expect(item(page, "project_notes")).to_contain_text("Oak worktops.")
    dialog.get_by_role("button", name="Close").click()
    assert user.values(KITCHEN)["project_notes"] == "Oak worktops."

    # Delete and Undo, then Delete, in the scope.
    item(page, "project_decisions").get_by_role("button", name="Delete").click()
    expect(item(page, "project_decisions")).to_have_count(0)
    assert user.values(KITCHEN) == {"project_notes": "Oak worktops."}
    page.get_by_role("button", name="Undo").click()
    expect(item(page, "project_decisions")).to_contain_text("Budget: 8000 euros.")
    assert user.values(KITCHEN)["project_decisions"] == "Budget: 8000 euros."
    item(page, "project_decisions").get_by_role("button", name="Delete").click()
    expect(item(page, "project_decisions")).to_have_count(0)
    assert user.values(KITCHEN) == {"project_notes": "Oak worktops."}
    assert (user.layer(), user.layer(THESIS), other.layer(KITCHEN)) == (own, thesis, others)

    # Back to the person's own memory, with its keys and its limit.
    switcher(page).select_option(label="My memory")
    expect(item(page, "user_preferences")).to_contain_text("Short answers.")
    assert keys_of(page) == ["user_preferences"]
    expect(page.get_by_text(f"of {OWN_LIMIT} tokens")).to_be_visible()
    expect(page.get_by_label("Key", exact=True).get_by_role("option")).to_have_text(
        ["Choose a key…", *OWN_KEYS]
    )


def test_suggestions_export_import_and_clear_act_on_the_scope_shown(
    server: ServeProcess, open_page: Any, tmp_path: Path
) -> None:
    user = User(server)
    user.put("user_preferences", "Short answers.")
    user.put("project_notes", "Vegetarian recipes.", COOK)
    user.put("project_notes", "Oak worktops.", KITCHEN)
    propose(server, user.name, "learned_facts", "Has a cat.", "")
    propose(server, user.name, "project_decisions", "Cooks on Sundays.", COOK)
    propose(server, user.name, "project_notes", "Vegan recipes.", COOK)
    own, kitchen = user.layer(), user.layer(KITCHEN)

    page, _ = open_as(open_page, user)
    expect(suggestion(page, "learned_facts")).to_be_visible()
    # On the person's own memory, Export holds every layer, each entry with its scope.
    with page.expect_download() as download:
        page.get_by_role("button", name="Export").click()
    everything = tmp_path / "everything.json"
    download.value.save_as(everything)
    document = json.loads(everything.read_text(encoding="utf-8"))
    served = user.call("GET", "/memory/export").json()
    assert {**document, "exported_at": None} == {**served, "exported_at": None}
    assert {(entry["scope"], entry["key"]) for entry in document["memories"]} == {
        (None, "user_preferences"),
        (COOK, "project_notes"),
        (KITCHEN, "project_notes"),
    }
    expect(page.get_by_role("status").filter(has_text="your own and every scope's")).to_be_visible()

    switcher(page).select_option(label=COOK)
    expect(suggestion(page, "project_decisions")).to_contain_text("Cooks on Sundays.")
    expect(suggestion(page, "learned_facts")).to_have_count(0)
    suggestion(page, "project_decisions").get_by_role("button", name="Keep").click()
    expect(item(page, "project_decisions")).to_contain_text("Cooks on Sundays.")
    suggestion(page, "project_notes").get_by_role("button", name="Dismiss").click()
    expect(suggestion(page, "project_notes")).to_have_count(0)
    assert user.call("GET", "/memory/proposals", COOK).json()["proposals"] == []
    assert [p["key"] for p in user.call("GET", "/memory/proposals").json()["proposals"]] == [
        "learned_facts"
    ]
    assert user.values(COOK) == {
        "project_notes": "Vegetarian recipes.",
        "project_decisions": "Cooks on Sundays.",
    }

    # Export: the scope's entries, as the API exports that scope.
    with page.expect_download() as download:
        page.get_by_role("button", name="Export").click()
    saved = tmp_path / download.value.suggested_filename
    download.value.save_as(saved)
    document = json.loads(saved.read_text(encoding="utf-8"))
    served = user.call("GET", "/memory/export", COOK).json()
    assert {**document, "exported_at": None} == {**served, "exported_at": None}
    assert sorted(entry["key"] for entry in document["memories"]) == [
        "project_decisions",
        "project_notes",
    ]
    assert re.fullmatch(r"kvmem-memory-assistant_cook-\d{4}-\d{2}-\d{2}\.json", saved.name)

    # Clear all: that scope only; the switcher stays on it, empty.
    page.get_by_role("button", name="Clear all").click()
    dialog = page.get_by_role("dialog", name=f"Clear all memories in “{COOK}”?")
    dialog.get_by_role("button", name="Clear all memories").click()
    expect(dialog).to_be_hidden()
    expect(page.get_by_text(f"Nothing is remembered in “{COOK}” yet.", exact=False)).to_be_visible()
    expect(switcher(page)).to_have_value(COOK)
    assert user.values(COOK) == {}
    assert (user.layer(), user.layer(KITCHEN)) == (own, kitchen)

    # Import: back into the scope shown.
    with page.expect_file_chooser() as chooser:
        page.get_by_role("button", name="Import").click()
    chooser.value.set_files(str(saved))
    expect(item(page, "project_decisions")).to_contain_text("Cooks on Sundays.")
    assert user.values(COOK) == {
        "project_notes": "Vegetarian recipes.",
        "project_decisions": "Cooks on Sundays.",
    }
    assert (user.layer(), user.layer(KITCHEN)) == (own, kitchen)

    # On the person's own memory, Clear all clears theirs only, and importing the whole
    # export puts each entry back into its layer; a scope it brings back joins the switcher.
    switcher(page).select_option(label="My memory")
    page.get_by_role("button", name="Clear all").click()
    dialog = page.get_by_role("dialog", name="Clear all memories?")
    expect(dialog).to_contain_text("your scopes keep theirs")
    dialog.get_by_role("button", name="Clear all memories").click()
    expect(memories(page).get_by_role("listitem")).to_have_count(0)
    assert user.values() == {}
    assert user.call("DELETE", "/memory", KITCHEN).json()["deleted"] == 1
    page.reload()
    expect(switcher(page).get_by_role("option")).to_have_text(["My memory", COOK])
    with page.expect_file_chooser() as chooser:
        page.get_by_role("button", name="Import").click()
    chooser.value.set_files(str(everything))
    expect(item(page, "user_preferences")).to_contain_text("Short answers.")
    expect(switcher(page).get_by_role("option")).to_have_text(["My memory", COOK, KITCHEN])
    assert (user.values(), user.values(KITCHEN)) == (
        {"user_preferences": "Short answers."},
        {"project_notes": "Oak worktops."},
    )


def test_a_new_scope_opens_empty_and_a_name_with_html_characters_stays_text(
    server: ServeProcess, open_page: Any
) -> None:
    user = User(server)
    user.put("user_preferences", "Short answers.")
    page, _ = open_as(open_page, user, expected_statuses=(400,))
    marked = "<img src=x onerror=\"document.body.dataset.injected='yes'\">"

    # A typed name the server refuses: its message, nothing made, nothing switched.
    opener = open_scope(page, marked)
    expect(opener.get_by_role("alert")).to_contain_text("invalid scope")
    expect(opener.get_by_label("Scope name")).to_have_value(marked)
    expect(switcher(page)).to_have_value("")
    assert keys_of(page) == ["user_preferences"]

    # A name it accepts opens an empty scope, kept once it holds a memory.
    opener.get_by_label("Scope name").fill(COOK)
    opener.get_by_role("button", name="Open").click()
    expect(opener).to_be_hidden()
    expect(switcher(page)).to_have_value(COOK)
    expect(page.get_by_text(f"Nothing is remembered in “{COOK}” yet.", exact=False)).to_be_visible()
    save(page, "project_notes", "Vegetarian recipes.")
    expect(item(page, "project_notes")).to_be_visible()
    assert user.call("GET", "/memory/scopes").json()["scopes"] == [
        {"scope": COOK, "entries": 1, "total_tokens": user.layer(COOK)["total_tokens"]}
    ]
    assert user.values() == {"user_preferences": "Short answers."}

    # A name with HTML characters from the API (the server never stores one; the page must not
    # trust that, so the browser is handed one): shown as text wherever the page names it.
    def marked_layer(route: Route) -> None:
        query = parse_qs(urlsplit(route.request.url).query)
        if route.request.url.endswith("/memory/scopes"):
            route.fulfill(json={"scopes": [{"scope": marked, "entries": 0, "total_tokens": 0}]})
        elif query.get("scope") == [marked] and "/memory/proposals" in route.request.url:
            route.fulfill(json={"proposals": [], "scope": marked})
        elif query.get("scope") == [marked]:
            route.fulfill(json={**user.layer(COOK), "memories": [], "scope": marked})
        else:
            route.continue_()

    page.route(re.compile(r".*/memory(/scopes|/proposals)?(\?.*)?$"), marked_layer)
    page.reload()
    expect(memories(page)).to_have_attribute("aria-busy", "false")
    expect(switcher(page).get_by_role("option")).to_have_text(["My memory", marked])
    switcher(page).select_option(label=marked)
    expect(switcher(page)).to_have_value(marked)
    expect(page.get_by_text(f"Only chats in the scope “{marked}” see")).to_be_visible()
    expect(page.get_by_text(f"Nothing is remembered in “{marked}” yet.")).to_be_visible()
    assert page.evaluate("document.querySelectorAll('img').length") == 0
    assert page.evaluate("document.body.dataset.injected") is None


def test_without_scopes_there_is_no_switcher_and_no_question_about_them(
    plain_server: ServeProcess, open_page: Any
) -> None:
    httpx.put(f"{plain_server.url}/memory/name", json={"value": "Ada"}, timeout=WAIT)
    page, log = open_page(f"{plain_server.url}/ui")
    expect(item(page, "name")).to_be_visible()
    expect(switcher(page)).to_have_count(0)
    expect(page.get_by_role("button", name="New scope")).to_have_count(0)
    assert not [url for url in log.requests if "scope" in url]


@pytest.mark.parametrize(
    ("look", "options"),
    [
        ("light", {"viewport": {"width": 900, "height": 900}, "color_scheme": "light"}),
        ("dark", {"viewport": {"width": 900, "height": 900}, "color_scheme": "dark"}),
        ("360px", {"viewport": {"width": 360, "height": 740}, "color_scheme": "dark"}),
    ],
)
def test_the_switcher_in_light_dark_and_on_a_360px_screen(
    server: ServeProcess, open_page: Any, shots: Path, look: str, options: dict[str, Any]
) -> None:
    user = User(server)
    user.put("user_preferences", "Short answers.")
    user.put("project_notes", "Oak worktops and a long note: " + "x" * 90, KITCHEN)
    user.put("project_notes", "Chapter two: priors.", THESIS)
    page, _ = open_as(open_page, user, **options)
    switcher(page).select_option(label=KITCHEN)
    expect(item(page, "project_notes")).to_be_visible()
    page.get_by_role("button", name="New scope").click()
    expect(page.get_by_role("form", name="Open a scope")).to_be_visible()
    page.screenshot(path=str(shots / f"scopes-{look}.png"), full_page=True)
    width = options["viewport"]["width"]
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    for control in (
        switcher(page),
        page.get_by_role("button", name="New scope"),
        page.get_by_role("button", name="Open", exact=True),
        page.get_by_label("Scope name"),
    ):
        box = control.bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width
