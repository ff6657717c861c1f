"""The memory page (CONTRACT section 15) in a real browser, on a real `kvmem serve`.

Chromium (the system package) driven by Playwright. Elements are found by role and
accessible name only, the handles the contract promises screen-reader users. Two servers
serve the whole module (starting one takes seconds): a `keys` one, where each test acts as
its own user through a session token in the page's `#token=`, and a `local` one with
`memory.personalize: false`. Every page's requests and console are recorded: nothing may
leave 127.0.0.1 and no error may reach the console but the refusals a test provokes.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright
from starlette.testclient import TestClient

from kvmem.config_loader import parse_config
from kvmem.db.engine import Database
from kvmem.errors import ConfigError
from kvmem.memory.proposals import ProposalStore
from kvmem.memory.rules import MemoryRules
from kvmem.memory.store import MemoryStore
from kvmem.tokens import TokenCounter
from tests.support.apps import AGENT_MODEL, MAIN_MODEL, set_memory, wait_until
from tests.support.browser import PageLog, launch
from tests.support.cli import invoke
from tests.support.processes import ServeProcess
from tests.support.upstream import Reply, ScriptedUpstream

# One browser and two servers for the module: its tests stay on one worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ui")]

SERVICE_KEY = "svc-ui-4d2c7f1e9a"
VALID_KEYS = ["user_preferences", "learned_facts", "personal_info", "conversation_context"]
TOKEN_LIMIT = 40
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'self'"
)
PAGE_FILES = {"/ui", "/ui/app.js", "/ui/style.css", "/ui/icon.svg"}
# The agent's writes and the server's start are bounded by their own timeouts; these waits
# only need to be longer than those, with room for a loaded machine.
WAIT = 30.0
expect.set_options(timeout=15_000)


# --- servers and pages ------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        chromium = launch(playwright)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def model() -> Iterator[ScriptedUpstream]:
    server = ScriptedUpstream().start()
    yield server
    server.stop()


def chat_sections(model: ScriptedUpstream, folder: Path, **memory: Any) -> dict[str, Any]:
    return {
        "database": {"url": f"sqlite:///{folder / 'kvmem.db'}"},
        "chat": {"model": f"openai/{MAIN_MODEL}", "api_base": model.url, "api_key": "k"},
        "memory": {
            "agent": {
                "provider": "openai",
                "model": AGENT_MODEL,
                "api_base": model.url,
                "api_key": "k",
                "grace_seconds": 10,
            },
            **memory,
        },
    }


@pytest.fixture(scope="module")
def keys_server(
    tmp_path_factory: pytest.TempPathFactory, model: ScriptedUpstream
) -> Iterator[ServeProcess]:
    """`auth.mode: keys`, validKeys, a tokenLimit and `memory.review: per_user`; user
    `veteran` has a key stored before validKeys was set (a key the page must let the server
    refuse)."""
    folder = tmp_path_factory.mktemp("keys")
    sections = chat_sections(
        model, folder, validKeys=VALID_KEYS, tokenLimit=TOKEN_LIMIT, review="per_user"
    )
    sections["auth"] = {"mode": "keys", "service_keys": [SERVICE_KEY]}
    before = {"database": sections["database"]}
    (folder / "before.yaml").write_text(json.dumps(before), encoding="utf-8")
    seeded = invoke(
        [
            "--config",
            "before.yaml",
            "memory",
            "set",
            "hobby",
            "Bouldering on Sundays.",
            "--user",
            "veteran",
        ],
        cwd=folder,
    )
    assert seeded.code == 0, seeded.stderr
    server = ServeProcess(folder, sections).start(timeout=120)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def local_server(
    tmp_path_factory: pytest.TempPathFactory, model: ScriptedUpstream
) -> Iterator[ServeProcess]:
    """`auth.mode: local`, no token limit, and users may not switch memory off."""
    folder = tmp_path_factory.mktemp("local")
    server = ServeProcess(folder, chat_sections(model, folder, personalize=False)).start(
        timeout=120
    )
    yield server
    server.stop()


class User:
    """A fresh user of the keys server, and REST calls made as them with the service key."""

    def __init__(self, server: ServeProcess, name: str | None = None) -> None:
        self.server = server
        self.name = name or f"user-{uuid.uuid4().hex[:10]}"
        self.headers = {"Authorization": f"Bearer {SERVICE_KEY}", "X-User-Id": self.name}

    def call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.request(
            method, self.server.url + path, headers=self.headers, timeout=WAIT, **kwargs
        )

    def put(self, key: str, value: str) -> None:
        assert self.call("PUT", f"/memory/{key}", json={"value": value}).status_code in (200, 201)

    def session(self) -> str:
        made = self.call("POST", "/sessions")
        assert made.status_code == 201, made.text
        return made.json()["token"]


@pytest.fixture
def open_page(browser: Browser) -> Iterator[Callable[..., tuple[Page, PageLog]]]:
    """Open a URL in a fresh browser context; on teardown, check what the page did."""
    opened: list[tuple[Any, PageLog, str]] = []

    def open_(
        url: str,
        *,
        expected_statuses: tuple[int, ...] = (),
        fake_clock: bool = False,
        **context_options: Any,
    ) -> tuple[Page, PageLog]:
        context = browser.new_context(**context_options)
        page = context.new_page()
        log = PageLog(expected_statuses=set(expected_statuses))
        log.attach(page)
        if fake_clock:
            page.clock.install()
        page.goto(url)
        opened.append((context, log, url))
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
    """The page opened the way a front end links to it: with a session token in the fragment."""
    page, log = open_page(f"{user.server.url}/ui#token={user.session()}", **options)
    expect(memories(page)).to_have_attribute("aria-busy", "false")
    return page, log


def memories(page: Page) -> Any:
    return page.get_by_role("list", name="Memories", exact=True)


def item(page: Page, key: str) -> Any:
    """The list item of `key` (its heading is the key)."""
    return (
        memories(page)
        .get_by_role("listitem")
        .filter(has=page.get_by_role("heading", name=key, exact=True))
    )


def form(page: Page) -> Any:
    return page.get_by_role("form", name="Add memory")


def save(page: Page, key: str | None, value: str) -> None:
    """Fill the form as a person would and press Save."""
    if key is not None:
        field = page.get_by_label("Key", exact=True)
        if field.evaluate("node => node.tagName") == "SELECT":
            field.select_option(key)
        else:
            field.fill(key)
    page.get_by_label("Value", exact=True).fill(value)
    form(page).get_by_role("button", name="Save").click()


def keys_of(page: Page) -> list[str]:
    return memories(page).get_by_role("heading").all_inner_texts()


def suggestions(page: Page) -> Any:
    return page.get_by_role("list", name="Suggested memories")


def suggestion(page: Page, key: str) -> Any:
    """The suggested memory of `key` (its heading is the key)."""
    return (
        suggestions(page)
        .get_by_role("listitem")
        .filter(has=page.get_by_role("heading", name=key, exact=True))
    )


def propose(server: ServeProcess, user: str, key: str, value: str | None) -> None:
    """A proposal of the memory agent's for `user`, made in the server's database (as a run
    under `memory.review: on` makes it; the agent's side is tests/test_proposals.py's)."""
    config = parse_config(json.loads(server.config.read_text()), server.config, {}).config
    database = Database.from_config(config.database)
    try:
        store = MemoryStore(database, MemoryRules.from_config(config.memory), TokenCounter())
        ProposalStore(store).propose(user, key, value, conversation_id="conv-ui")
    finally:
        database.dispose()


# --- loading ---------------------------------------------------------------------------


def test_the_page_loads_from_kvmem_alone(local_server: ServeProcess, open_page: Any) -> None:
    httpx.delete(f"{local_server.url}/memory")
    httpx.put(f"{local_server.url}/memory/user_preferences", json={"value": "Short answers."})
    page, log = open_page(f"{local_server.url}/ui")
    expect(item(page, "user_preferences")).to_contain_text("Short answers.")

    paths = {url.removeprefix(local_server.url) for url in log.requests}
    assert paths == PAGE_FILES | {"/memory", "/preferences", "/memory/proposals"}
    assert all(url.startswith(local_server.url + "/") for url in log.requests)
    assert log.console_errors == log.page_errors == []

    served = httpx.get(f"{local_server.url}/ui")
    assert (served.status_code, served.headers["content-security-policy"]) == (200, CSP)
    assert served.headers["content-type"] == "text/html; charset=utf-8"
    assert "<script>" not in served.text and "://" not in served.text


def test_serve_prints_the_page_url(local_server: ServeProcess) -> None:
    assert f"kvmem: the memory page is at {local_server.url}/ui\n" in local_server.log.read_text()


def test_every_page_file_carries_the_csp_and_frame_ancestors_come_from_the_config(
    make_client: Callable[..., TestClient],
) -> None:
    client = make_client(ui={"frame_ancestors": ["'self'", "https://chat.example.com"]})
    for path in PAGE_FILES:
        served = client.get(path)
        assert served.status_code == 200, path
        assert served.headers["content-security-policy"] == CSP.replace(
            "frame-ancestors 'self'", "frame-ancestors 'self' https://chat.example.com"
        )
        assert served.headers["x-content-type-options"] == "nosniff"
    assert client.get("/ui/", follow_redirects=False).headers["location"] == "/ui"
    assert client.get("/ui/../kvmem.db").status_code == 404


@pytest.mark.parametrize("source", ["https://a.example; script-src *", "'unsafe-inline'", "a b"])
def test_ui_frame_ancestors_refuses_what_is_not_one_source(tmp_path: Path, source: str) -> None:
    with pytest.raises(
        ConfigError, match=r"ui\.frame_ancestors: Value error, .* is not a frame-ancestors source"
    ):
        parse_config({"ui": {"frame_ancestors": [source]}}, tmp_path / "memory.yaml", {})


# --- local mode ------------------------------------------------------------------------


def test_local_mode_needs_no_sign_in_and_adds_and_edits(
    local_server: ServeProcess, open_page: Any
) -> None:
    httpx.delete(f"{local_server.url}/memory")
    page, _ = open_page(f"{local_server.url}/ui")
    expect(page.get_by_text("Nothing is remembered yet.", exact=False)).to_be_visible()
    expect(page.get_by_text("0 tokens, no limit", exact=True)).to_be_visible()
    expect(page.get_by_role("progressbar", name="Memory usage")).to_have_count(0)
    expect(page.get_by_role("textbox", name="Key or session token")).to_be_hidden()

    save(page, "favourite_tea", "Genmaicha, no sugar.")
    entry = item(page, "favourite_tea")
    expect(entry).to_contain_text("Genmaicha, no sugar.")
    tokens = httpx.get(f"{local_server.url}/memory/favourite_tea").json()["token_count"]
    expect(entry).to_contain_text(f"{tokens} tokens")
    expect(entry).to_contain_text("manual")
    expect(entry.get_by_text("just now", exact=True)).to_have_attribute(
        "title", re.compile(r"\d{4}")
    )
    expect(page.get_by_label("Value", exact=True)).to_have_value("")

    entry.get_by_role("button", name="Edit").click()
    expect(page.get_by_label("Key", exact=True)).to_have_value("favourite_tea")
    expect(page.get_by_label("Value", exact=True)).to_have_value("Genmaicha, no sugar.")
    save(page, None, "Sencha.")
    expect(item(page, "favourite_tea")).to_contain_text("Sencha.")
    stored = httpx.get(f"{local_server.url}/memory/favourite_tea").json()
    assert (stored["value"], stored["source"]) == ("Sencha.", "manual")
    assert keys_of(page) == ["favourite_tea"]


def test_a_bad_key_shows_the_servers_message_and_keeps_the_text(
    local_server: ServeProcess, open_page: Any
) -> None:
    page, log = open_page(f"{local_server.url}/ui", expected_statuses=(422,))
    save(page, "Not A Key", "typed with care")
    expected = httpx.put(f"{local_server.url}/memory/Not%20A%20Key", json={"value": "x"}).json()
    expect(form(page).get_by_role("alert")).to_have_text(expected["error"]["message"])
    expect(page.get_by_label("Key", exact=True)).to_have_value("Not A Key")
    expect(page.get_by_label("Value", exact=True)).to_have_value("typed with care")


def test_without_personalize_the_switch_is_disabled_and_says_why(
    local_server: ServeProcess, open_page: Any
) -> None:
    page, _ = open_page(f"{local_server.url}/ui")
    switch = page.get_by_role("checkbox", name="Use memory in chats")
    expect(switch).to_be_disabled()
    expect(switch).to_be_checked()
    expect(switch).to_have_accessible_description(re.compile("memory.personalize is false"))


def test_an_agent_write_through_chat_appears_on_reload(
    keys_server: ServeProcess, model: ScriptedUpstream, open_page: Any
) -> None:
    user = User(keys_server)
    page, _ = open_as(open_page, user)
    expect(page.get_by_text("Nothing is remembered yet.", exact=False)).to_be_visible()
    model.script(MAIN_MODEL, Reply(content="Noted."))
    model.script(
        AGENT_MODEL,
        Reply(content=None, tool_calls=[set_memory("learned_facts", "Has a cat called Miso.")]),
    )
    chat = user.call("POST", "/chat", json={"message": "Remember that my cat is called Miso."})
    assert chat.status_code == 200, chat.text
    wait_until(
        lambda: user.call("GET", "/memory/learned_facts").status_code == 200,
        WAIT,
        "the agent's write",
    )
    page.reload()
    entry = item(page, "learned_facts")
    expect(entry).to_contain_text("Has a cat called Miso.")
    expect(entry).to_contain_text("agent")


# --- keys mode -------------------------------------------------------------------------


def test_keys_mode_takes_the_token_from_the_fragment_and_hides_it(
    keys_server: ServeProcess, open_page: Any
) -> None:
    user = User(keys_server)
    user.put("personal_info", "Name: Ada.")
    token = user.session()
    page, log = open_page(f"{keys_server.url}/ui#token={token}")
    expect(item(page, "personal_info")).to_contain_text("Name: Ada.")
    assert page.url == f"{keys_server.url}/ui"
    assert page.evaluate("sessionStorage.getItem('kvmem.token')") == token
    page.reload()  # the tab keeps it
    expect(item(page, "personal_info")).to_be_visible()
    assert token not in page.url

    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_role("textbox", name="Key or session token")).to_be_focused()
    assert page.evaluate("sessionStorage.getItem('kvmem.token')") is None
    ended = httpx.get(f"{keys_server.url}/memory", headers={"Authorization": f"Bearer {token}"})
    assert ended.status_code == 401

    # A link followed from the open page changes only the fragment: no reload, still read.
    page.goto(f"{keys_server.url}/ui#token={user.session()}")
    expect(item(page, "personal_info")).to_contain_text("Name: Ada.")
    assert page.url == f"{keys_server.url}/ui"


def test_a_link_for_another_user_asks_before_switching(
    keys_server: ServeProcess, open_page: Any
) -> None:
    alice, bob = User(keys_server, f"alice-{uuid.uuid4().hex[:6]}"), User(keys_server)
    alice.put("personal_info", "Name: Alice.")
    bob.put("personal_info", "Name: Bob.")
    page, _ = open_as(open_page, alice)
    mine = page.evaluate("sessionStorage.getItem('kvmem.token')")

    # A link from this very page (only the fragment changes), then a fresh load (the query
    # changes too): each asks, and Stay keeps alice signed in.
    for url in (
        f"{keys_server.url}/ui#token={bob.session()}",
        f"{keys_server.url}/ui?again#token={bob.session()}",
    ):
        page.goto(url)
        dialog = page.get_by_role("dialog", name="Switch user?")
        expect(dialog).to_be_visible()
        expect(dialog).to_have_accessible_description(
            f"You are signed in as “{alice.name}”. "
            f"This link would sign you in as “{bob.name}” instead."
        )
        dialog.get_by_role("button", name=f"Stay signed in as {alice.name}").click()
        expect(dialog).to_be_hidden()
        expect(item(page, "personal_info")).to_contain_text("Name: Alice.")
        assert page.evaluate("sessionStorage.getItem('kvmem.token')") == mine
        assert "token=" not in page.url

    # Escape stays too; Switch signs bob in.
    page.goto(f"{keys_server.url}/ui#token={bob.session()}")
    expect(page.get_by_role("dialog", name="Switch user?")).to_be_visible()
    page.keyboard.press("Escape")
    expect(page.get_by_role("dialog", name="Switch user?")).to_be_hidden()
    expect(item(page, "personal_info")).to_contain_text("Name: Alice.")
    page.goto(f"{keys_server.url}/ui#token={bob.session()}")
    page.get_by_role("button", name=f"Switch to {bob.name}").click()
    expect(item(page, "personal_info")).to_contain_text("Name: Bob.")
    # A new link of the user already signed in switches nothing and asks nothing.
    page.goto(f"{keys_server.url}/ui#token={bob.session()}")
    expect(item(page, "personal_info")).to_contain_text("Name: Bob.")
    expect(page.get_by_role("dialog", name="Switch user?")).to_be_hidden()


MALFORMED_LINK = (
    "The link's token could not be read: it is cut short or mistyped. "
    "Open the link again from where you found it, or paste a key or token."
)


def test_a_malformed_link_says_so_instead_of_loading_forever(
    keys_server: ServeProcess, local_server: ServeProcess, open_page: Any
) -> None:
    page, _ = open_page(f"{keys_server.url}/ui#token=%E0%A4%A")
    expect(page.get_by_role("textbox", name="Key or session token")).to_be_focused()
    expect(page.get_by_role("alert")).to_have_text(MALFORMED_LINK)
    expect(page.get_by_text("Loading your memory…")).to_be_hidden()
    assert "token=" not in page.url

    # Signed in already: the page stays who it was, and says what was wrong with the link.
    user = User(keys_server)
    user.put("personal_info", "Name: Ada.")
    page, _ = open_as(open_page, user)
    page.goto(f"{keys_server.url}/ui#token=%E0%A4%A")
    expect(page.get_by_role("alert").filter(has_text="could not be read")).to_have_text(
        MALFORMED_LINK
    )
    expect(item(page, "personal_info")).to_contain_text("Name: Ada.")

    # local mode needs no token at all: the memory loads, with the same message.
    page, _ = open_page(f"{local_server.url}/ui#token=%E0%A4%A")
    expect(memories(page)).to_have_attribute("aria-busy", "false")
    expect(page.get_by_role("alert").filter(has_text="could not be read")).to_have_text(
        MALFORMED_LINK
    )


def test_keys_mode_asks_for_a_key_and_shows_why_one_is_refused(
    keys_server: ServeProcess, open_page: Any
) -> None:
    user = User(keys_server)
    user.put("user_preferences", "Metric units.")
    page, log = open_page(f"{keys_server.url}/ui", expected_statuses=(401,))
    field = page.get_by_role("textbox", name="Key or session token")
    expect(field).to_be_focused()
    expect(memories(page)).to_be_hidden()
    assert {url.removeprefix(keys_server.url) for url in log.requests} == PAGE_FILES

    field.fill("kvm_not-a-real-key")
    page.get_by_role("button", name="Continue").click()
    expect(page.get_by_role("region", name="Sign in").get_by_role("alert")).to_have_text(
        "the API key is not valid (unknown or revoked)"
    )
    assert page.evaluate("sessionStorage.getItem('kvmem.token')") is None

    token = user.session()
    field.fill(token)
    page.get_by_role("button", name="Continue").click()
    expect(item(page, "user_preferences")).to_contain_text("Metric units.")

    # The session ends while the page is open: the next action asks for a key again.
    ended = httpx.delete(
        f"{keys_server.url}/sessions/current", headers={"Authorization": f"Bearer {token}"}
    )
    assert ended.status_code == 204
    item(page, "user_preferences").get_by_role("button", name="Delete").click()
    expect(page.get_by_role("region", name="Sign in").get_by_role("alert")).to_have_text(
        "the session token is not valid (unknown, ended or expired)"
    )
    expect(field).to_be_focused()
    assert user.call("GET", "/memory/user_preferences").status_code == 200


# --- the usage bar, refusals, validKeys ------------------------------------------------


def test_the_usage_bar_follows_the_limit_and_turns_amber_then_red(
    keys_server: ServeProcess, open_page: Any
) -> None:
    user = User(keys_server)
    user.put("user_preferences", " ".join(["hello"] * 31))
    page, _ = open_as(open_page, user)
    bar = page.get_by_role("progressbar", name="Memory usage")
    fill = "bar => getComputedStyle(bar.firstElementChild).backgroundColor"
    expect(bar).to_have_attribute("aria-valuenow", "77.5")
    expect(page.get_by_text(f"31 of {TOKEN_LIMIT} tokens", exact=True)).to_be_visible()
    green = bar.evaluate(fill)

    user.put("learned_facts", "hello")
    page.reload()
    expect(bar).to_have_attribute("aria-valuenow", "80")
    amber = bar.evaluate(fill)

    user.put("personal_info", " ".join(["hello"] * 8))
    page.reload()
    expect(bar).to_have_attribute("aria-valuenow", "100")
    expect(page.get_by_text(f"{TOKEN_LIMIT} of {TOKEN_LIMIT} tokens", exact=True)).to_be_visible()
    red = bar.evaluate(fill)
    assert len({green, amber, red}) == 3
    assert amber == "rgb(183, 121, 31)" and red == "rgb(197, 48, 48)"


def test_a_write_over_the_token_limit_shows_the_servers_message(
    keys_server: ServeProcess, open_page: Any
) -> None:
    user = User(keys_server)
    user.put("user_preferences", " ".join(["hello"] * 35))
    page, _ = open_as(open_page, user, expected_statuses=(409,))
    typed = "Works nights as a nurse in Lyon and likes long answers."
    save(page, "learned_facts", typed)
    refused = user.call("PUT", "/memory/learned_facts", json={"value": typed})
    assert refused.status_code == 409
    expect(form(page).get_by_role("alert")).to_have_text(refused.json()["error"]["message"])
    expect(page.get_by_label("Key", exact=True)).to_have_value("learned_facts")
    expect(page.get_by_label("Value", exact=True)).to_have_value(typed)
    assert keys_of(page) == ["user_preferences"]

    # A shorter value fits: the alert goes, the list and the bar follow.
    page.get_by_label("Value", exact=True).fill("Nurse.")
    form(page).get_by_role("button", name="Save").click()
    expect(item(page, "learned_facts")).to_contain_text("Nurse.")
    expect(form(page).get_by_role("alert")).to_be_hidden()


def test_with_valid_keys_the_key_is_a_choice_and_an_old_key_is_refused_by_the_server(
    keys_server: ServeProcess, open_page: Any
) -> None:
    veteran = User(keys_server, "veteran")
    page, _ = open_as(open_page, veteran, expected_statuses=(422,))
    key = page.get_by_role("combobox", name="Key")
    assert key.get_by_role("option").all_inner_texts() == ["Choose a key…", *VALID_KEYS]

    item(page, "hobby").get_by_role("button", name="Edit").click()
    save(page, None, "Bouldering on Saturdays.")
    refused = veteran.call("PUT", "/memory/hobby", json={"value": "Bouldering on Saturdays."})
    assert refused.status_code == 422
    expect(form(page).get_by_role("alert")).to_have_text(refused.json()["error"]["message"])
    expect(page.get_by_label("Value", exact=True)).to_have_value("Bouldering on Saturdays.")
    assert veteran.call("GET", "/memory/hobby").json()["value"] == "Bouldering on Sundays."


# --- delete, undo, history, restore ----------------------------------------------------


def test_delete_removes_at_once_and_undo_brings_it_back_for_ten_seconds(
    keys_server: ServeProcess, open_page: Any
) -> None:
    user = User(keys_server)
    user.put("personal_info", "Name: Ada.")
    user.put("learned_facts", "Plays the cello.")
    page, _ = open_as(open_page, user, fake_clock=True)

    item(page, "personal_info").get_by_role("button", name="Delete").click()
    expect(item(page, "personal_info")).to_have_count(0)
    assert user.call("GET", "/memory/personal_info").status_code == 404
    undo = page.get_by_role("button", name="Undo")
    expect(undo).to_be_focused()
    expect(page.get_by_role("status").filter(has=undo)).to_contain_text("Deleted “personal_info”.")
    undo.click()
    expect(item(page, "personal_info")).to_contain_text("Name: Ada.")
    restored = user.call("GET", "/memory/personal_info").json()
    assert (restored["value"], restored["source"]) == ("Name: Ada.", "revert")
    changes = user.call("GET", "/memory/personal_info/history").json()["changes"]
    assert [(c["op"], c["source"]) for c in changes] == [
        ("set", "revert"),
        ("delete", "manual"),
        ("set", "manual"),
    ]

    # The offer lasts ten seconds (of the page's clock, stopped here so that a slow
    # machine's real seconds do not count).
    page.clock.pause_at(datetime.now() + timedelta(seconds=2))
    item(page, "learned_facts").get_by_role("button", name="Delete").click()
    expect(undo).to_be_visible()
    page.clock.run_for(9_900)
    expect(undo).to_be_visible()
    page.clock.run_for(200)
    expect(undo).to_have_count(0)
    assert keys_of(page) == ["personal_info"]


def test_history_lists_each_change_and_restore_sets_it_back(
    keys_server: ServeProcess, open_page: Any
) -> None:
    user = User(keys_server)
    user.put("user_preferences", "Short answers.")
    user.put("user_preferences", "Long answers.")
    page, _ = open_as(open_page, user)

    item(page, "user_preferences").get_by_role("button", name="History").click()
    dialog = page.get_by_role("dialog", name="History of “user_preferences”")
    changes = dialog.get_by_role("list", name="Changes").get_by_role("listitem")
    expect(changes).to_have_count(2)
    expect(changes.nth(0)).to_contain_text("Long answers.")
    expect(changes.nth(1)).to_contain_text("Short answers.")
    expect(changes.nth(0).get_by_role("button", name="Restore")).to_be_disabled()  # current

    changes.nth(1).get_by_role("button", name="Restore").click()
    expect(changes).to_have_count(3)
    expect(changes.nth(0)).to_contain_text("Short answers.")
    expect(changes.nth(0)).to_contain_text("revert")
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()
    expect(item(page, "user_preferences")).to_contain_text("Short answers.")
    assert user.call("GET", "/memory/user_preferences").json()["source"] == "revert"


def test_history_lists_every_change_past_one_page(
    keys_server: ServeProcess, open_page: Any
) -> None:
    """The route answers 500 changes at most a page (50 unless asked): the dialog reads on."""
    user = User(keys_server)
    config = parse_config(json.loads(keys_server.config.read_text()), keys_server.config, {}).config
    database = Database.from_config(config.database)
    try:
        store = MemoryStore(database, MemoryRules.from_config(config.memory), TokenCounter())
        for n in range(1, 503):
            store.set(user.name, "learned_facts", f"Fact {n}.", "manual")
    finally:
        database.dispose()
    page, _ = open_as(open_page, user)

    item(page, "learned_facts").get_by_role("button", name="History").click()
    dialog = page.get_by_role("dialog", name="History of “learned_facts”")
    changes = dialog.get_by_role("list", name="Changes").get_by_role("listitem")
    expect(changes).to_have_count(502)
    expect(changes.nth(0)).to_contain_text("Fact 502.")
    expect(changes.nth(501)).to_contain_text("Fact 1.")


# --- the switch, export and import, clear all ------------------------------------------


def test_suggested_memories_are_kept_or_dismissed(
    keys_server: ServeProcess, open_page: Any
) -> None:
    user = User(keys_server)
    user.put("user_preferences", "Long answers.")
    propose(keys_server, user.name, "learned_facts", "Has a cat called Miso.")
    propose(keys_server, user.name, "personal_info", "Lives in Lyon.")
    propose(keys_server, user.name, "user_preferences", None)
    page, _ = open_as(open_page, user)
    expect(page.get_by_role("heading", name="Suggested memories")).to_have_text(
        "Suggested memories (3)"
    )
    expect(suggestions(page).get_by_role("heading")).to_have_text(
        ["user_preferences", "personal_info", "learned_facts"]
    )
    expect(suggestion(page, "user_preferences")).to_contain_text("forget")
    expect(suggestion(page, "user_preferences")).to_contain_text("Long answers.")
    expect(suggestion(page, "learned_facts")).to_contain_text("remember")
    expect(suggestion(page, "learned_facts")).to_contain_text("Has a cat called Miso.")
    assert keys_of(page) == ["user_preferences"]  # nothing suggested is remembered yet

    suggestion(page, "learned_facts").get_by_role("button", name="Keep").click()
    expect(item(page, "learned_facts")).to_contain_text("Has a cat called Miso.")
    expect(item(page, "learned_facts")).to_contain_text("agent")
    expect(suggestion(page, "learned_facts")).to_have_count(0)
    expect(page.get_by_role("status").filter(has_text="Kept “learned_facts”.")).to_be_visible()

    suggestion(page, "personal_info").get_by_role("button", name="Dismiss").click()
    expect(suggestion(page, "personal_info")).to_have_count(0)
    suggestion(page, "user_preferences").get_by_role("button", name="Keep").click()
    expect(item(page, "user_preferences")).to_have_count(0)
    expect(suggestions(page)).to_be_hidden()
    assert keys_of(page) == ["learned_facts"]
    assert user.call("GET", "/memory/proposals").json() == {"proposals": []}
    changes = user.call("GET", "/memory/history").json()["changes"]
    assert [(c["key"], c["op"], c["source"], c["conversation_id"]) for c in changes[:2]] == [
        ("user_preferences", "delete", "agent", "conv-ui"),
        ("learned_facts", "set", "agent", "conv-ui"),
    ]
    page.reload()
    expect(memories(page)).to_have_attribute("aria-busy", "false")
    expect(suggestions(page)).to_be_hidden()


def test_a_suggestion_over_the_token_limit_stays_and_says_why(
    keys_server: ServeProcess, open_page: Any
) -> None:
    user = User(keys_server)
    user.put("user_preferences", " ".join(["hello"] * 35))
    propose(keys_server, user.name, "learned_facts", "one two three four five six seven")
    page, _ = open_as(open_page, user, expected_statuses=(409,))
    suggestion(page, "learned_facts").get_by_role("button", name="Keep").click()
    alert = page.get_by_role("alert").filter(has_text="learned_facts")
    expect(alert).to_have_text(
        "“learned_facts”: storing 7 tokens would take memory to 42 tokens, over the limit of 40"
    )
    expect(suggestion(page, "learned_facts")).to_be_visible()
    assert keys_of(page) == ["user_preferences"]
    assert [p["key"] for p in user.call("GET", "/memory/proposals").json()["proposals"]] == [
        "learned_facts"
    ]


def test_each_person_may_ask_to_review_before_remembering(
    keys_server: ServeProcess, local_server: ServeProcess, open_page: Any
) -> None:
    user = User(keys_server)
    page, _ = open_as(open_page, user)
    review = page.get_by_role("checkbox", name="Ask me before remembering")
    expect(review).not_to_be_checked()
    review.click()
    expect(page.get_by_role("status").filter(has_text="asks before remembering")).to_be_visible()
    assert user.call("GET", "/preferences").json() == {"memories": True, "review": True}
    page.reload()
    expect(review).to_be_checked()
    review.press("Space")
    expect(review).not_to_be_checked()
    expect(page.get_by_role("status").filter(has_text="without asking")).to_be_visible()
    assert user.call("GET", "/preferences").json() == {"memories": True, "review": False}
    # Where the operator chose (memory.review: off here), the page offers no such switch.
    local, _ = open_page(f"{local_server.url}/ui")
    expect(memories(local)).to_have_attribute("aria-busy", "false")
    expect(local.get_by_role("checkbox", name="Ask me before remembering")).to_have_count(0)


def test_the_switch_turns_memory_off_for_chats(keys_server: ServeProcess, open_page: Any) -> None:
    user = User(keys_server)
    page, _ = open_as(open_page, user)
    switch = page.get_by_role("checkbox", name="Use memory in chats")
    expect(switch).to_be_checked()
    switch.click()
    expect(switch).not_to_be_checked()
    expect(page.get_by_role("status").filter(has_text="Memory is off")).to_be_visible()
    assert user.call("GET", "/preferences").json() == {"memories": False, "review": False}
    assert user.call("GET", "/memory").json()["enabled"] is False
    page.reload()
    expect(switch).not_to_be_checked()
    switch.press("Space")
    expect(switch).to_be_checked()
    assert user.call("GET", "/preferences").json() == {"memories": True, "review": False}


EMPTY_ON = (
    "Nothing is remembered yet. Ask the assistant in a chat to remember something "
    "(\u201cremember that I prefer tea\u201d), or add a memory above."
)
EMPTY_OFF = (
    "Nothing is remembered yet. Memory is off for your chats, so the assistant remembers "
    "nothing you tell it: switch on \u201cUse memory in chats\u201d, or add a memory above."
)


def test_an_empty_memory_says_how_memory_gets_there(
    keys_server: ServeProcess, open_page: Any
) -> None:
    user = User(keys_server)
    page, _ = open_as(open_page, user)
    empty = page.get_by_text("Nothing is remembered yet.", exact=False)
    expect(empty).to_have_text(EMPTY_ON)
    expect(memories(page).get_by_role("listitem")).to_have_count(0)
    # With memory off for this user's chats, asking the assistant does nothing: it says so.
    page.get_by_role("checkbox", name="Use memory in chats").click()
    expect(empty).to_have_text(EMPTY_OFF)
    page.reload()
    expect(empty).to_have_text(EMPTY_OFF)
    page.get_by_role("checkbox", name="Use memory in chats").click()
    expect(empty).to_have_text(EMPTY_ON)
    save(page, "learned_facts", "Has a cat called Miso.")
    expect(item(page, "learned_facts")).to_be_visible()
    expect(empty).to_be_hidden()


def test_export_then_clear_all_then_import_brings_everything_back(
    keys_server: ServeProcess, open_page: Any, tmp_path: Path
) -> None:
    user = User(keys_server)
    user.put("personal_info", "Name: Ada.")
    user.put("learned_facts", "Line one.\nLine two.")
    page, _ = open_as(open_page, user)

    with page.expect_download() as download:
        page.get_by_role("button", name="Export").click()
    saved = tmp_path / download.value.suggested_filename
    download.value.save_as(saved)
    document = json.loads(saved.read_text(encoding="utf-8"))
    served = user.call("GET", "/memory/export").json()
    assert {**document, "exported_at": None} == {**served, "exported_at": None}
    assert re.fullmatch(r"kvmem-memory-\d{4}-\d{2}-\d{2}\.json", saved.name)

    page.get_by_role("button", name="Clear all").click()
    dialog = page.get_by_role("dialog", name="Clear all memories?")
    expect(dialog).to_be_visible()
    dialog.get_by_role("button", name="Clear all memories").click()
    expect(dialog).to_be_hidden()
    expect(memories(page).get_by_role("listitem")).to_have_count(0)
    expect(page.get_by_text("Nothing is remembered yet.", exact=False)).to_be_visible()
    assert user.call("GET", "/memory").json()["memories"] == []

    with page.expect_file_chooser() as chooser:
        page.get_by_role("button", name="Import").click()
    chooser.value.set_files(str(saved))
    expect(item(page, "learned_facts")).to_contain_text("Line one.\nLine two.")
    expect(page.get_by_role("status").filter(has_text="Imported 2 memories")).to_be_visible()
    assert sorted(keys_of(page)) == ["learned_facts", "personal_info"]
    assert {m["source"] for m in user.call("GET", "/memory").json()["memories"]} == {"import"}


def test_a_refused_import_writes_nothing_and_says_why(
    keys_server: ServeProcess, open_page: Any, tmp_path: Path
) -> None:
    user = User(keys_server)
    page, _ = open_as(open_page, user, expected_statuses=(422,))
    bad = tmp_path / "bad.json"
    bad.write_text(
        json.dumps(
            {
                "memories": [
                    {"key": "user_preferences", "value": "ok"},
                    {"key": "shoe_size", "value": "42"},
                ]
            }
        )
    )
    refused = user.call("POST", "/memory/import", content=bad.read_bytes())
    assert refused.status_code == 422
    with page.expect_file_chooser() as chooser:
        page.get_by_role("button", name="Import").click()
    chooser.value.set_files(str(bad))
    expect(page.get_by_role("alert").filter(has_text="bad.json")).to_have_text(
        f"bad.json: {refused.json()['error']['message']}"
    )
    expect(memories(page).get_by_role("listitem")).to_have_count(0)


def test_clear_all_asks_first_and_escape_keeps_everything(
    keys_server: ServeProcess, open_page: Any
) -> None:
    user = User(keys_server)
    user.put("personal_info", "Name: Ada.")
    page, _ = open_as(open_page, user)
    page.get_by_role("button", name="Clear all").click()
    dialog = page.get_by_role("dialog", name="Clear all memories?")
    expect(dialog).to_be_visible()
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()
    page.get_by_role("button", name="Clear all").click()
    dialog.get_by_role("button", name="Cancel").click()
    expect(dialog).to_be_hidden()
    assert keys_of(page) == ["personal_info"]
    assert len(user.call("GET", "/memory").json()["memories"]) == 1


# --- text only, keyboard, small screens, dark mode -------------------------------------


def test_values_are_shown_as_text_never_as_html(keys_server: ServeProcess, open_page: Any) -> None:
    user = User(keys_server)
    hostile = (
        "<img src=x onerror=\"document.title='owned'\"><b>bold</b> & </ul><script>x()</script>"
    )
    user.put("learned_facts", hostile)
    page, _ = open_as(open_page, user)
    expect(item(page, "learned_facts")).to_contain_text(hostile)
    assert memories(page).evaluate("list => list.querySelectorAll('img, b, script').length") == 0
    assert page.title() == "Memory · kvmem"


def test_everything_works_from_the_keyboard_with_a_visible_focus(
    keys_server: ServeProcess, open_page: Any
) -> None:
    user = User(keys_server)
    page, _ = open_as(open_page, user)
    key = page.get_by_role("combobox", name="Key")
    while not key.evaluate("node => node === document.activeElement"):
        page.keyboard.press("Tab")
    assert key.evaluate("node => getComputedStyle(node).outlineStyle") == "solid"
    page.keyboard.press("ArrowDown")  # from "Choose a key…" to the first key
    page.keyboard.press("Tab")
    page.keyboard.type("Typed without a mouse.")
    page.keyboard.press("Tab")
    expect(page.get_by_label("Remember until", exact=True)).to_be_focused()
    save_button = form(page).get_by_role("button", name="Save")
    for _ in range(5):  # past the date field's day, month and year (and its picker)
        if save_button.evaluate("node => node === document.activeElement"):
            break
        page.keyboard.press("Tab")
    expect(save_button).to_be_focused()
    assert save_button.evaluate("node => getComputedStyle(node).outlineStyle") == "solid"
    page.keyboard.press("Enter")
    expect(item(page, VALID_KEYS[0])).to_contain_text("Typed without a mouse.")

    edit = item(page, VALID_KEYS[0]).get_by_role("button", name="Edit")
    edit.focus()
    page.keyboard.press("Enter")
    expect(page.get_by_label("Value", exact=True)).to_be_focused()
    page.keyboard.press("Escape")  # leaves editing
    expect(page.get_by_label("Value", exact=True)).to_have_value("")


def test_the_page_fits_a_360px_screen_in_dark_mode(
    keys_server: ServeProcess, open_page: Any
) -> None:
    user = User(keys_server)
    user.put("learned_facts", "A long value without spaces: " + "x" * 120)
    page, _ = open_as(open_page, user, viewport={"width": 360, "height": 740}, color_scheme="dark")
    expect(item(page, "learned_facts")).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth") <= 360
    background = page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert background == "rgb(19, 20, 22)"
    for name in ("Export", "Import", "Clear all", "Save"):
        box = page.get_by_role("button", name=name, exact=True).bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 360, name


def test_the_page_benchmark_still_runs(keys_server: ServeProcess, browser: Browser) -> None:
    """`python -m tests.bench.ui` measures with this function; its number is not checked."""
    from tests.bench.ui import load_to_render

    user = User(keys_server)
    for key in VALID_KEYS:
        user.put(key, "A value.")
    times = load_to_render(
        browser, f"{keys_server.url}/ui#token={user.session()}", 1, len(VALID_KEYS)
    )
    assert len(times) == 1 and times[0] > 0


def test_with_memory_disabled_the_page_says_so(
    make_server: Callable[..., Any], open_page: Any
) -> None:
    server = make_server(memory={"disabled": True})
    page, _ = open_page(f"{server.url}/ui", expected_statuses=(403,))
    expect(
        page.get_by_role("status").filter(has_text="Memory is turned off on this server.")
    ).to_be_visible()
    expect(form(page)).to_be_hidden()
    expect(memories(page)).to_be_hidden()
