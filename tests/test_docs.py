"""The README and the docs/ site say only what kvmem does: their config examples load, the
`kvmem` commands they name exist (with the options they show), the routes they name or curl
are the app's, the eval scenario examples load as a suite, and the README's links name files
that exist.

Read from the markdown itself, so an example added later is checked too. A YAML block that
is meant to be refused is marked with `<!-- invalid-example -->` on the line before it, and
then must fail to load. Nothing here starts a server or touches a database.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
import yaml
from starlette.routing import Route

from kvmem.cli import main
from kvmem.config import Config
from kvmem.config_loader import load_config
from kvmem.errors import ConfigError
from kvmem.eval.suite import load_suite
from kvmem.server.app import create_app

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
INVALID_MARK = "<!-- invalid-example -->"
# A YAML block is a kvmem config when its top level names one of the config's sections.
CONFIG_SECTIONS = set(Config.model_fields)
_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,})(?P<lang>[\w-]*)[^\n]*$")
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)")
_INLINE_CODE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
_COMMAND = re.compile(r"(?:^|(?<=[\s(/]))kvmem((?:\s+[a-z][a-z-]*)+)")
_OPTION = re.compile(r"(?<![\w-])--[a-z][a-z-]*")
_ROUTE = re.compile(r"^(GET|POST|PUT|PATCH|DELETE) (/[^\s?`]*)")


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    marked_invalid: bool

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def code_blocks(page: Path) -> list[Block]:
    """Every fenced block of `page` (indented ones in lists included)."""
    lines = page.read_text(encoding="utf-8").split("\n")
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not re.match(rf"^ *{fence}`*\s*$", lines[j]):
            body.append(lines[j][indent:] if lines[j][:indent].isspace() else lines[j])
            j += 1
        previous = next((line for line in reversed(lines[:i]) if line.strip()), "")
        blocks.append(
            Block(page, i + 1, opening["lang"], "\n".join(body), previous.strip() == INVALID_MARK)
        )
        i = j + 1
    return blocks


def prose(page: Path) -> str:
    """The page without its fenced blocks."""
    kept: list[str] = []
    in_block: str | None = None
    for line in page.read_text(encoding="utf-8").split("\n"):
        opening = _FENCE.match(line)
        if in_block is None and opening:
            in_block = opening["fence"]
        elif in_block is not None and re.match(rf"^ *{in_block}`*\s*$", line):
            in_block = None
        elif in_block is None:
            kept.append(line)
    return "\n".join(kept)


def config_blocks() -> list[Block]:
    """The YAML blocks that are kvmem configs (not Prometheus' or an eval suite's YAML)."""
    found = []
    for page in PAGES:
        for block in code_blocks(page):
            if block.lang != "yaml":
                continue
            data = yaml.safe_load(block.text)
            if isinstance(data, dict) and CONFIG_SECTIONS & set(data):
                found.append(block)
    return found


CONFIGS = config_blocks()


def test_the_docs_hold_config_examples_of_both_kinds() -> None:
    """The pages are found and read: a parser that finds nothing would pass every test below."""
    assert (ROOT / "docs" / "config.md") in PAGES
    assert len([b for b in CONFIGS if not b.marked_invalid]) >= 10
    assert [b for b in CONFIGS if b.marked_invalid]


@pytest.mark.parametrize("block", CONFIGS, ids=[b.where for b in CONFIGS])
def test_every_config_example_loads_or_is_refused_as_marked(block: Block, tmp_path: Path) -> None:
    """Each example loads through kvmem's own loader (`${VAR}`s set to dummy values), unless
    it is marked as an invalid example: then the loader refuses it."""
    path = tmp_path / "memory.yaml"
    path.write_text(block.text, encoding="utf-8")
    environ = {name: f"dummy-{name.lower()}" for name in _VARIABLE.findall(block.text)}
    if block.marked_invalid:
        with pytest.raises(ConfigError):
            load_config(path, environ)
    else:
        loaded = load_config(path, environ)
        assert isinstance(loaded.config, Config)


def scenario_blocks() -> list[Block]:
    """The `kvmem eval` scenario examples: a YAML list, or JSON lines, of scenarios."""
    found = []
    for page in PAGES:
        for block in code_blocks(page):
            if block.lang == "yaml":
                items = yaml.safe_load(block.text)
            elif block.lang == "json":
                lines = block.text.strip().split("\n")
                items = [json.loads(line) for line in lines] if len(lines) == 1 else None
            else:
                continue
            if isinstance(items, list) and all(
                isinstance(item, dict) and "expect" in item for item in items
            ):
                found.append(block)
    return found


SCENARIOS = scenario_blocks()


def test_every_scenario_example_is_a_valid_eval_suite(tmp_path: Path) -> None:
    """The scenario format's examples (YAML and JSON lines) load as `kvmem eval --suite`."""
    assert len(SCENARIOS) == 3
    for number, block in enumerate(SCENARIOS):
        suffix = ".jsonl" if block.lang == "json" else ".yaml"
        path = tmp_path / f"suite{number}{suffix}"
        path.write_text(block.text, encoding="utf-8")
        assert len(load_suite(path).scenarios) == 1, block.where


def named_commands() -> list[tuple[str, str]]:
    """Every `kvmem ...` command line in inline code and in shell blocks, with its page."""
    found: list[tuple[str, str]] = []
    for page in PAGES:
        texts = _INLINE_CODE.findall(prose(page))
        texts += [b.text for b in code_blocks(page) if b.lang in ("sh", "")]
        for text in texts:
            for line in text.split("\n"):
                line = line.split(" #")[0]
                for match in _COMMAND.finditer(line):
                    found.append((str(page.relative_to(ROOT)), line[match.start() :].strip()))
    return found


COMMANDS = named_commands()


def test_the_docs_name_commands_of_every_group() -> None:
    """The scan finds the commands the CLI table lists."""
    words = {command.split()[1] for _, command in COMMANDS}
    assert {"serve", "check", "db", "memory", "user", "mcp", "keys", "usage", "eval"} <= words


@pytest.mark.parametrize(("page", "line"), COMMANDS, ids=[c for _, c in COMMANDS])
def test_every_named_command_and_option_exists(page: str, line: str) -> None:
    """`kvmem a b` resolves to a command of the click group (not a bare group), and every
    `--option` shown with it is one of that command's options."""
    words = line.split()[1:]
    command: click.Command = main
    path = ["kvmem"]
    for word in words:
        if not isinstance(command, click.Group) or word not in command.commands:
            break
        command = command.commands[word]
        path.append(word)
    assert len(path) > 1, f"{page}: {line!r} names no kvmem command"
    assert not isinstance(command, click.Group), (
        f"{page}: {line!r} names the group {' '.join(path)}, not one of its commands"
    )
    options = {name for param in command.params for name in getattr(param, "opts", [])}
    options |= {"--help"}
    for option in _OPTION.findall(line):
        assert option in options, f"{page}: {' '.join(path)} has no option {option}"


def named_routes() -> list[tuple[str, str, str]]:
    """Every `METHOD /path` in inline code: the route tables and the prose around them."""
    found = []
    for page in PAGES:
        for code in _INLINE_CODE.findall(prose(page)):
            match = _ROUTE.match(code)
            if match:
                found.append((str(page.relative_to(ROOT)), match[1], match[2]))
    return found


ROUTES = named_routes()


def _shape(path: str) -> str:
    """A path with its parameters unnamed: `/memory/{key}` and `/memory/{name}` are one."""
    return re.sub(r"\{[^}]*\}", "{}", path)


def app_routes(tmp_path: Path) -> list[Route]:
    """The app's routes, from `create_app` (its lifespan is not run: no database is opened)."""
    config = Config.model_validate({"database": {"url": f"sqlite:///{tmp_path / 'kvmem.db'}"}})
    return [route for route in create_app(config).routes if isinstance(route, Route)]


def _serves(route: Route, method: str) -> bool:
    """A route without methods (the /mcp endpoint) takes them all."""
    return route.methods is None or method in route.methods


def test_the_docs_name_the_routes_of_every_group() -> None:
    """The scan finds each page's route tables."""
    pages = {page for page, _, _ in ROUTES}
    assert {"docs/api.md", "docs/ollama.md", "docs/operations.md"} <= pages
    assert len(ROUTES) >= 40


def test_every_named_route_is_served(tmp_path: Path) -> None:
    """Each `METHOD /path` the docs name is a route of the app with that method."""
    routes = app_routes(tmp_path)
    missing = [
        f"{page}: {method} {path}"
        for page, method, path in ROUTES
        if not any(_shape(r.path) == _shape(path) and _serves(r, method) for r in routes)
    ]
    assert missing == []


_CURL_URL = re.compile(
    r"(?:https?://)?(?:localhost|127\.0\.0\.1|kvmem\.[a-z.]+)(?::\d+)?(/[^\s'\"?]*)"
)
_CURL_METHOD = re.compile(r"(?:-X|--request)\s+([A-Z]+)")


def curl_requests() -> list[tuple[str, str, str]]:
    """The method and path of every `curl` to kvmem in the shell examples."""
    found = []
    for page in PAGES:
        for block in code_blocks(page):
            if block.lang != "sh":
                continue
            # A request continued over several lines is one command.
            for command in block.text.replace("\\\n", " ").split("\n"):
                if not command.lstrip().startswith("curl "):
                    continue
                url = _CURL_URL.search(command)
                method = _CURL_METHOD.search(command)
                sends = re.search(r"\s(?:-d|--data[\w-]*)\s", command)
                verb = method[1] if method else "POST" if sends else "GET"
                found.append((block.where, verb, url[1] if url else f"(no kvmem URL) {command}"))
    return found


CURLS = curl_requests()


def test_every_curl_example_asks_for_a_route_the_app_serves(tmp_path: Path) -> None:
    """Each `curl` example's method and concrete path (`/memory/learned_facts`) match a
    route of the app."""
    assert len(CURLS) >= 40
    routes = app_routes(tmp_path)
    unserved = [
        f"{where}: {method} {path}"
        for where, method, path in CURLS
        if not any(r.path_regex.match(path) and _serves(r, method) for r in routes)
    ]
    assert unserved == []


def test_relative_links_of_the_readme_name_files_that_exist() -> None:
    """The README links into docs/ (MkDocs checks the links inside docs/ itself)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\((?!https?://|#)([^)#\s]+)", text)
    assert targets
    assert [t for t in targets if not (ROOT / t).exists()] == []
