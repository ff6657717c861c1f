"""Evaluation scenarios for `kvmem eval`: their shape, reading a suite file, and what each
scenario expects of the memory agent.

A suite is a YAML list of scenarios (or `{"scenarios": [...]}`), or JSON lines (`.jsonl`,
one scenario a line). A scenario gives the memory before, the chat, optionally its own
`valid_keys`, and `expect`: keys `set` (their values containing substrings,
case-insensitively; an item that is a list means any one of its strings), `deleted`,
`unchanged`, `no_writes`, and `expires` (each key's expiry date, `YYYY-MM-DD` in UTC, checked
on the entry after the run). An optional `now` (a date-time) is the moment the scenario runs
at: the agent is told it is today, and expiry is judged against it. Every problem in a file is a `SuiteError` naming the file, the
line and scenario id, and the field. kvmem's own suite ships as package data
(`kvmem/eval/suite.yaml`). This module runs nothing: kvmem/eval/run.py does.

A suite file is input like any other: it is read up to `MAX_SUITE_BYTES` (a device such as
`/dev/zero` included), JSON lines one line at a time (each up to `MAX_LINE_BYTES`, nested at
most `MAX_DEPTH` deep, validated as it is read, so only the scenarios stay in memory), and
at most `MAX_SCENARIOS` scenarios; past any bound, a `SuiteError` names the file and line.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime
from importlib import resources
from pathlib import Path
from typing import IO, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from kvmem.config import KEY_PATTERN, RESERVED_KEYS, reserved_keys_text
from kvmem.errors import SuiteError

CATEGORIES: tuple[str, ...] = (
    "remember",
    "update",
    "forget",
    "chit_chat",
    "implicit",
    "language",
    "injection",
    "routing",
    "expiry",
)
Category = Literal[
    "remember",
    "update",
    "forget",
    "chit_chat",
    "implicit",
    "language",
    "injection",
    "routing",
    "expiry",
]
BUILTIN_SUITE = "built-in"
# Bounds on a suite file (the built-in suite is 25 KB and 70-odd scenarios; a suite of
# 10,000 is hours of model calls already).
MAX_SUITE_BYTES = 16 * 1024 * 1024
MAX_LINE_BYTES = 1024 * 1024
MAX_SCENARIOS = 10_000
MAX_DEPTH = 32  # a scenario is 4 deep; Python's parser recurses once per level
# A JSON string, whose brackets are not structure.
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACKET = re.compile(r"[\[\]{}]")


def _check_key(key: str) -> str:
    if not KEY_PATTERN.fullmatch(key) or key in RESERVED_KEYS:
        raise ValueError(
            f"{key!r} can never be stored: keys match ^[a-z][a-z0-9_]{{0,127}}$ and are not "
            f"{reserved_keys_text()}"
        )
    return key


class Message(BaseModel):
    """One chat message of a scenario (system messages are left out of the agent's window,
    as in production)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    role: Literal["system", "user", "assistant"]
    content: str = Field(min_length=1)


class Expectation(BaseModel):
    """What the memory must look like after the agent ran."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    set: dict[str, list[str | list[str]]] = Field(default_factory=dict)
    deleted: list[str] = Field(default_factory=list)
    unchanged: list[str] = Field(default_factory=list)
    no_writes: bool = False
    # Each key's expiry date (UTC) after the run: the entry must be there and expire that day.
    expires: dict[str, date] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self) -> Expectation:
        if not (self.set or self.deleted or self.unchanged or self.no_writes or self.expires):
            raise ValueError("nothing expected: give set, deleted, unchanged, no_writes or expires")
        if self.no_writes and (self.set or self.deleted):
            raise ValueError("no_writes contradicts set and deleted")
        for key in [*self.set, *self.deleted, *self.unchanged, *self.expires]:
            _check_key(key)
        if {*self.expires} & {*self.deleted}:
            raise ValueError("expires: a deleted key cannot expire")
        twice = {*self.set} & {*self.deleted} | ({*self.set} | {*self.deleted}) & {*self.unchanged}
        if twice:
            raise ValueError(f"{', '.join(sorted(twice))}: expected two different ways")
        for key, parts in self.set.items():
            if not parts or any(not part for part in parts):
                raise ValueError(f"set.{key}: give at least one non-empty substring")
        return self

    @property
    def writes(self) -> bool:
        """Whether the scenario expects the agent to write (set or delete)."""
        return bool(self.set or self.deleted)

    def problems(
        self,
        before: Mapping[str, str],
        after: Mapping[str, str],
        writes: int,
        expiries: Mapping[str, datetime | None] | None = None,
    ) -> list[str]:
        """What the memory `after` the run (its entries' `expiries`, and its number of
        `writes`) got wrong; [] when all is as expected."""
        problems = []
        for key, day in self.expires.items():
            if key not in after:
                problems.append(f"{key}: not set, so it cannot expire {day.isoformat()}")
                continue
            moment = (expiries or {}).get(key)
            found = moment.astimezone(UTC).date().isoformat() if moment else "never"
            if found != day.isoformat():
                problems.append(f"{key}: expires {found}, expected {day.isoformat()}")
        for key, parts in self.set.items():
            value = after.get(key)
            if value is None:
                problems.append(f"{key}: not set")
                continue
            for part in parts:
                choices = [part] if isinstance(part, str) else part
                if not any(choice.casefold() in value.casefold() for choice in choices):
                    wanted = " or ".join(json.dumps(c, ensure_ascii=False) for c in choices)
                    shown = json.dumps(value, ensure_ascii=False)
                    problems.append(f"{key}: {shown} lacks {wanted}")
        problems += [f"{key}: not deleted" for key in self.deleted if key in after]
        problems += [
            f"{key}: changed to {json.dumps(after.get(key), ensure_ascii=False)}"
            for key in self.unchanged
            if after.get(key) != before.get(key)
        ]
        if self.no_writes and writes:
            problems.append(f"expected no writes; the agent made {writes}")
        return problems


class Scenario(BaseModel):
    """One test of the memory agent: memory before, the chat, and what should come of it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str = Field(min_length=1, max_length=100)
    category: Category
    language: str | None = Field(None, min_length=2, max_length=16)
    note: str | None = None  # why the scenario expects what it does
    memory: dict[str, str] = Field(default_factory=dict)
    messages: list[Message] = Field(min_length=1)
    valid_keys: list[str] | None = None
    # The moment the scenario runs at (a time without offset is UTC): the agent's today.
    now: datetime | None = None
    expect: Expectation

    @field_validator("now")
    @classmethod
    def _in_utc(cls, now: datetime | None) -> datetime | None:
        if now is None:
            return None
        return now.replace(tzinfo=UTC) if now.tzinfo is None else now.astimezone(UTC)

    @model_validator(mode="after")
    def _consistent(self) -> Scenario:
        for key in [*self.memory, *(self.valid_keys or ())]:
            _check_key(key)
        if self.messages[-1].role != "user":
            raise ValueError(
                "messages: the last message must be the user's (the agent reads up to it)"
            )
        if self.valid_keys:
            allowed = set(self.valid_keys)
            for field, keys in (
                ("memory", self.memory),
                ("expect.set", self.expect.set),
                ("expect.deleted", self.expect.deleted),
            ):
                outside = [key for key in keys if key not in allowed]
                if outside:
                    raise ValueError(f"{field}: {', '.join(outside)} not among valid_keys")
        absent = [key for key in self.expect.deleted if key not in self.memory]
        if absent:
            raise ValueError(
                f"expect.deleted: {', '.join(absent)} not in memory (nothing to delete)"
            )
        return self

    @property
    def newest_message(self) -> str:
        """The newest user message: what the intent gate reads."""
        return self.messages[-1].content


@dataclass(frozen=True)
class Suite:
    """Scenarios and where they came from (a path, or `built-in`)."""

    source: str
    scenarios: tuple[Scenario, ...]


def builtin_suite() -> Suite:
    """kvmem's own suite, shipped as package data."""
    resource = resources.files("kvmem") / "eval" / "suite.yaml"
    return _parse_yaml(resource.read_text(encoding="utf-8"), BUILTIN_SUITE)


def load_suite(path: Path) -> Suite:
    """The suite in `path`: JSON lines when it ends in `.jsonl`, else YAML."""
    source = str(path)
    try:
        with path.open("rb") as file:
            if path.suffix == ".jsonl":
                return _validate(_json_lines(file, source), source)
            data = file.read(MAX_SUITE_BYTES + 1)
    except OSError as exc:
        raise SuiteError(f"{path}: cannot read the suite file: {exc.strerror}") from exc
    if len(data) > MAX_SUITE_BYTES:
        raise SuiteError(f"{source}: the suite file is over {MAX_SUITE_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SuiteError(f"{path}: cannot read the suite file: {exc}") from exc
    return _parse_yaml(text, source)


def _json_lines(file: IO[bytes], source: str) -> Iterator[tuple[int, Any]]:
    """Each scenario line's number and parsed JSON, read one line at a time."""
    size = 0
    for number in itertools.count(1):
        raw = file.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        where = f"{source}, line {number}"
        size += len(raw)
        if size > MAX_SUITE_BYTES:
            raise SuiteError(f"{where}: the suite file is over {MAX_SUITE_BYTES} bytes")
        if len(raw) > MAX_LINE_BYTES:
            raise SuiteError(f"{where}: the line is over {MAX_LINE_BYTES} bytes")
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SuiteError(f"{where}: not UTF-8 (byte {exc.start})") from None
        if not line.strip():
            continue
        if _depth(line) > MAX_DEPTH:
            raise SuiteError(f"{where}: nested deeper than {MAX_DEPTH} levels")
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as exc:
            raise SuiteError(f"{where}: not valid JSON: {exc.msg}") from None


def _depth(line: str) -> int:
    """How deep the arrays and objects of a JSON line nest (brackets inside strings aside;
    an unbalanced line is the parser's to refuse)."""
    depth = deepest = 0
    for bracket in _BRACKET.findall(_JSON_STRING.sub("", line)):
        if bracket in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def _parse_yaml(text: str, source: str) -> Suite:
    # The document as nodes (their lines name a bad scenario's place), then as values;
    # libyaml's loader when PyYAML has it: the pure-Python one takes a second per suite.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(text)
    try:
        root = loader.get_single_node()
        document = loader.construct_document(root) if root is not None else None
    except yaml.YAMLError as exc:
        raise SuiteError(f"{source}: not valid YAML: {exc}") from None
    finally:
        loader.dispose()
    if root is None:
        raise SuiteError(f"{source}: the suite has no scenarios")
    if isinstance(document, dict) and set(document) == {"scenarios"}:
        document = document["scenarios"]
        assert isinstance(root, yaml.MappingNode)
        root = root.value[0][1]
    if not isinstance(document, list) or not isinstance(root, yaml.SequenceNode):
        raise SuiteError(f"{source}: expected a list of scenarios (or a mapping with `scenarios:`)")
    lines = [node.start_mark.line + 1 for node in root.value]
    return _validate(list(zip(lines, document, strict=True)), source)


def _validate(items: Iterable[tuple[int, Any]], source: str) -> Suite:
    scenarios: list[Scenario] = []
    seen: dict[str, int] = {}
    for line, item in items:
        where = f"{source}, line {line}"
        if len(scenarios) == MAX_SCENARIOS:
            raise SuiteError(f"{where}: a suite holds at most {MAX_SCENARIOS} scenarios")
        if isinstance(item, dict) and isinstance(item.get("id"), str):
            where += f" (scenario {item['id']!r})"
        try:
            scenario = Scenario.model_validate(item)
        except ValidationError as exc:
            raise SuiteError(f"{where}: {_describe(exc)}") from None
        if scenario.id in seen:
            first = seen[scenario.id]
            raise SuiteError(f"{where}: id: also the id of the scenario on line {first}")
        seen[scenario.id] = line
        scenarios.append(scenario)
    if not scenarios:
        raise SuiteError(f"{source}: the suite has no scenarios")
    return Suite(source, tuple(scenarios))


def _describe(exc: ValidationError) -> str:
    """The first problem of a scenario: the field's path and what was expected."""
    error = exc.errors(include_url=False)[0]
    field = ".".join(str(part) for part in error["loc"])
    message = error["msg"].removeprefix("Value error, ")  # a model validator names its field
    more = len(exc.errors()) - 1
    described = f"{field}: {message}" if field else message
    return described + (f" (and {more} more problem{'s' * (more > 1)})" if more else "")
