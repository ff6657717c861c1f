"""Reading memory.yaml: find it, drop what kvmem ignores, interpolate `${VAR}`, validate; and
the built-in config, made from `KVMEM_*` variables, when there is no file to read.

Every error is a `ConfigError` whose message names the file, the field's path and what was
expected. An unknown field, and a top-level section or custom-endpoint field that is ignored,
gets every valid name it is a typo of as a suggestion, best first (see `_near_misses`).
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, SecretStr, ValidationError
from sqlalchemy.engine import make_url

from kvmem.config import Config, CustomEndpoint, DatabaseConfig
from kvmem.errors import ConfigError

DEFAULT_PATH = "memory.yaml"
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
# A service key shorter than this is refused: it is the one secret between a front end and
# every user's memory (`openssl rand -hex 32` makes one of 64).
MIN_SERVICE_KEY_LENGTH = 16
DEFAULT_CHAT_MODEL = "ollama/llama3.1"
BUILTIN_SOURCE = "built-in, from KVMEM_* variables (no memory.yaml here)"


@dataclass(frozen=True)
class LoadedConfig:
    """A validated config, the file it came from and the warnings loading it raised.

    `builtin` is true for the built-in config (no file: `path` is then `./memory.yaml`,
    the file that was not there, whose folder relative SQLite paths are relative to)."""

    config: Config
    path: Path
    warnings: tuple[str, ...]
    builtin: bool = False

    def source(self) -> str:
        """Where the config came from, for a person: the file's absolute path, or the
        built-in config."""
        return BUILTIN_SOURCE if self.builtin else str(self.path.resolve())


def find_config_path(explicit: str | None, environ: Mapping[str, str]) -> Path:
    """`--config PATH`, else `$KVMEM_CONFIG`, else `./memory.yaml`."""
    return Path(explicit or environ.get("KVMEM_CONFIG") or DEFAULT_PATH)


def load_found_config(explicit: str | None, environ: Mapping[str, str]) -> LoadedConfig:
    """The config a `kvmem` command runs with: the file `--config` or `$KVMEM_CONFIG` names
    (an error when it cannot be read), else `./memory.yaml`, else, when there is no
    `./memory.yaml`, the built-in config (`builtin_config`)."""
    path = find_config_path(explicit, environ)
    if explicit or environ.get("KVMEM_CONFIG") or path.exists():
        return load_config(path, environ)
    return builtin_config(environ, Path.cwd())


def builtin_config(environ: Mapping[str, str], folder: Path) -> LoadedConfig:
    """The config of a folder without memory.yaml (and of the container image), from the
    environment:

    - `KVMEM_SERVICE_KEY` set: `auth.mode: keys` with it as the one service key (refused when
      empty, shorter than `MIN_SERVICE_KEY_LENGTH` or edged with spaces); unset: `local`.
    - `KVMEM_CHAT_MODEL` (default `ollama/llama3.1`), `KVMEM_CHAT_API_BASE`, `KVMEM_CHAT_API_KEY`.
    - The memory agent: `KVMEM_AGENT_MODEL` (`provider/model`; without a provider, `openai`),
      `KVMEM_AGENT_API_BASE`, `KVMEM_AGENT_API_KEY`; unset, the chat model and its upstream.
    - `KVMEM_DATABASE_URL` (default `sqlite:///kvmem.db` in `folder`), `KVMEM_LOG_FORMAT`.

    An empty variable counts as unset, as in `${VAR:-default}` (compose passes `${VAR}` of
    an unset variable as empty), except `KVMEM_SERVICE_KEY`: empty there is a mistake.
    Values are taken as they are: a `${...}` in one is not interpolated.
    """
    path = folder / DEFAULT_PATH

    def variable(name: str) -> str | None:
        return environ.get(name) or None

    auth: dict[str, Any] = {"mode": "local"}
    if "KVMEM_SERVICE_KEY" in environ:
        auth = {"mode": "keys", "service_keys": [_service_key(environ["KVMEM_SERVICE_KEY"])]}
    chat_model = variable("KVMEM_CHAT_MODEL") or DEFAULT_CHAT_MODEL
    chat = {
        "model": chat_model,
        "api_base": variable("KVMEM_CHAT_API_BASE"),
        "api_key": variable("KVMEM_CHAT_API_KEY"),
    }
    if agent_model := variable("KVMEM_AGENT_MODEL"):
        api_base, api_key = variable("KVMEM_AGENT_API_BASE"), variable("KVMEM_AGENT_API_KEY")
    else:
        agent_model, api_base, api_key = chat_model, chat["api_base"], chat["api_key"]
    provider, slash, model = agent_model.partition("/")
    if not slash:
        provider, model = "openai", agent_model
    if not provider or not model:
        raise ConfigError(
            f"KVMEM_AGENT_MODEL {agent_model!r} names no model: write provider/model, "
            "such as openai/gpt-4.1-mini (a name alone is an OpenAI model)"
        )
    data: dict[str, Any] = {
        "server": {"log_format": variable("KVMEM_LOG_FORMAT") or "text"},
        "database": {"url": variable("KVMEM_DATABASE_URL") or "sqlite:///kvmem.db"},
        "auth": auth,
        "chat": chat,
        "memory": {
            "agent": {
                "provider": provider,
                "model": model,
                "api_base": api_base,
                "api_key": api_key,
            }
        },
    }
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, Path("built-in config (KVMEM_* variables)"))) from None
    config = _resolve_sqlite_path(config, folder)
    return LoadedConfig(config=config, path=path, warnings=(), builtin=True)


def _service_key(key: str) -> str:
    """`KVMEM_SERVICE_KEY` if it can be a service key, else a `ConfigError` saying what to do
    (the key itself is never in the message)."""
    fix = (
        "set it to a random secret of at least "
        f"{MIN_SERVICE_KEY_LENGTH} characters (openssl rand -hex 32), or unset it to serve "
        "only this machine in local mode, or write a memory.yaml (or mount one and name it in "
        "KVMEM_CONFIG)"
    )
    problem = None
    if not key:
        problem = "is empty"
    elif key != key.strip():
        problem = "starts or ends with white space, which HTTP headers drop"
    elif len(key) < MIN_SERVICE_KEY_LENGTH:
        problem = f"has {len(key)} characters, too short for a key that acts for every user"
    if problem:
        raise ConfigError(
            f"KVMEM_SERVICE_KEY {problem}: without a memory.yaml, kvmem's built-in config "
            f"takes its one service key (auth.mode keys) from it; {fix}"
        )
    return key


def load_config(path: Path, environ: Mapping[str, str] | None = None) -> LoadedConfig:
    """Read, interpolate and validate the config file at `path`."""
    environ = os.environ if environ is None else environ
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config file: {exc.strerror}") from exc
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    return parse_config(raw, path, environ)


def parse_config(raw: Any, path: Path, environ: Mapping[str, str]) -> LoadedConfig:
    """Validate an already-parsed YAML document as if it were read from `path`."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level")
    warnings: list[str] = []
    data = _drop_ignored(raw, warnings)
    try:
        data = interpolate(data, environ)
    except KeyError as exc:
        variable, field = exc.args
        raise ConfigError(
            f"{path}: {field}: environment variable {variable} is not set "
            f"(write ${{{variable}:-default}} to give a default)"
        ) from None
    _refuse_agent_id(data, path)
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, path)) from None
    config = _resolve_sqlite_path(config, path.parent)
    return LoadedConfig(config=config, path=path, warnings=tuple(warnings))


def interpolate(value: Any, environ: Mapping[str, str], field: str = "") -> Any:
    """Replace `${VAR}` and `${VAR:-default}` in every string of `value`.

    A missing variable without a default raises `KeyError(variable, field path)`.
    """
    if isinstance(value, dict):
        return {k: interpolate(v, environ, _join(field, k)) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, environ, f"{field}[{i}]") for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def replace(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        # As in the shell: `${VAR:-default}` uses the default when VAR is unset or empty.
        if environ.get(name) or (name in environ and default is None):
            return environ[name]
        if default is not None:
            return default
        raise KeyError(name, field)

    return _VARIABLE.sub(replace, value)


def _drop_ignored(raw: dict[str, Any], warnings: list[str]) -> dict[str, Any]:
    """Remove what a pasted librechat.yaml carries that kvmem does not use, with a warning each."""
    data: dict[str, Any] = {}
    for name, value in raw.items():
        if name in Config.model_fields:
            data[name] = value
        else:
            warnings.append(
                f"ignoring top-level section {name!r} (not used by kvmem)"
                + _did_you_mean(_near_misses(str(name), Config.model_fields))
            )
    endpoints = data.get("endpoints")
    if isinstance(endpoints, dict):
        for name in [n for n in endpoints if n != "custom"]:
            warnings.append(
                f"ignoring endpoints.{name} (kvmem reads only endpoints.custom)"
                + _did_you_mean(_near_misses(str(name), {"custom": "custom"}))
            )
            del endpoints[name]
        custom = endpoints.get("custom")
        if isinstance(custom, list):
            endpoints["custom"] = [
                _drop_custom_extras(entry, f"endpoints.custom[{i}]", warnings)
                for i, entry in enumerate(custom)
            ]
    return data


def _drop_custom_extras(
    entry: Any, field: str, warnings: list[str], known: Mapping[str, Any] | None = None
) -> Any:
    if not isinstance(entry, dict):
        return entry
    known = _fields_by_name(CustomEndpoint) if known is None else known
    kept = {}
    for name, value in entry.items():
        if name == "models" and isinstance(value, dict):
            # kvmem never fetches a model list: only `models.default` means something here.
            value = _drop_custom_extras(
                value, f"{field}.models", warnings, known={"default": "default"}
            )
        if name in known:
            kept[name] = value
        elif meant := _near_misses(str(name), known):
            # A typo of a field kvmem uses: ignored all the same (LibreChat's rule), but named.
            warnings.append(f"ignoring {field}.{name} (unknown field){_did_you_mean(meant)}")
        else:
            warnings.append(f"ignoring {field}.{name} (a LibreChat field kvmem does not use)")
    return kept


def _refuse_agent_id(data: dict[str, Any], path: Path) -> None:
    agent = (
        (data.get("memory") or {}).get("agent") if isinstance(data.get("memory"), dict) else None
    )
    if isinstance(agent, dict) and "id" in agent:
        raise ConfigError(
            f"{path}: memory.agent.id: LibreChat's predefined agents do not exist in kvmem; "
            "expected memory.agent.provider and memory.agent.model instead"
        )


def _resolve_sqlite_path(config: Config, base: Path) -> Config:
    url = make_url(config.database.url)
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        return config
    if Path(url.database).is_absolute():
        return config
    absolute = url.set(database=str((base / url.database).resolve()))
    database = config.database.model_copy(
        update={"url": absolute.render_as_string(hide_password=False)}
    )
    return config.model_copy(update={"database": database})


def _describe(exc: ValidationError, path: Path) -> str:
    lines = [f"{path}: invalid config:"]
    for error in exc.errors():
        field = _loc(error["loc"])
        if error["type"] == "extra_forbidden":
            message = "unknown field"
            message += _did_you_mean(_suggestions(error["loc"]))
        else:
            message = error["msg"]
            if error["type"] not in ("value_error", "missing") and not _is_secret(error["loc"]):
                message += f" (got {error['input']!r})"
        lines.append(f"  {field}: {message}")
    return "\n".join(lines)


def _loc(loc: tuple[Any, ...]) -> str:
    text = ""
    for part in loc:
        text = f"{text}[{part}]" if isinstance(part, int) else _join(text, str(part))
    return text


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else str(name)


def _suggestions(loc: tuple[Any, ...]) -> list[str]:
    """The valid names the unknown last element of `loc` may have meant, best first: every
    field it is a typo of, else the one field most like it (if any is much like it)."""
    model: Any = Config
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = _fields_by_name(model).get(part)
        if field is None:
            return []
        model = _model_of(field.annotation)
        if model is None:
            return []
    name, fields = str(loc[-1]), _fields_by_name(model)
    return _near_misses(name, fields) or difflib.get_close_matches(
        name, sorted(fields), n=1, cutoff=0.5
    )


def _near_misses(name: str, spellings: Mapping[str, Any]) -> list[str]:
    """The valid names that `name` is a typo of, best first; `spellings` maps each valid
    name to its field, and a field with several (aliases) is named once, by the nearest.

    A typo is at most a quarter of the name's letters (at least one) inserted, deleted,
    replaced or swapped with a neighbour, case ignored (`modle`: `model` and `mode` are
    both one edit away). Ties go to the name of the typed length: a swap keeps every
    letter, so `modle` is `model` before it is `mode`.
    """
    bound = max(1, len(name) // 4)
    nearest: dict[int, tuple[tuple[int, int, str], str]] = {}
    for spelling, field in spellings.items():
        rank = _typo_rank(name, spelling)
        if rank[0] <= bound and (id(field) not in nearest or rank < nearest[id(field)][0]):
            nearest[id(field)] = (rank, spelling)
    return [spelling for _rank, spelling in sorted(nearest.values())]


def _typo_rank(name: str, other: str) -> tuple[int, int, str]:
    return _edits(name.lower(), other.lower()), abs(len(other) - len(name)), other


def _edits(a: str, b: str) -> int:
    """How many single-letter insertions, deletions, replacements and swaps of neighbours
    turn `a` into `b` (the optimal string alignment distance)."""
    before: list[int] = []
    previous = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        current = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            current[j] = min(
                previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (a[i - 1] != b[j - 1])
            )
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                current[j] = min(current[j], before[j - 2] + 1)
        before, previous = previous, current
    return previous[-1]


def _did_you_mean(names: list[str]) -> str:
    """`; did you mean 'a', 'b' or 'c'?`, or '' for no names."""
    if not names:
        return ""
    quoted = [repr(name) for name in names]
    listed = quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"
    return f"; did you mean {listed}?"


def _is_secret(loc: tuple[Any, ...]) -> bool:
    """Whether `loc` is in a secret field (or the database URL), whose value is never echoed."""
    model: Any = Config
    for part in loc:
        if isinstance(part, int):
            continue
        field = _fields_by_name(model).get(part) if model is not None else None
        if field is None:
            return False
        if _mentions_secret(field.annotation) or (model is DatabaseConfig and part == "url"):
            return True
        model = _model_of(field.annotation)
    return False


def _mentions_secret(annotation: Any) -> bool:
    if annotation is SecretStr:
        return True
    return any(_mentions_secret(arg) for arg in getattr(annotation, "__args__", ()))


def _fields_by_name(model: type[BaseModel]) -> dict[str, Any]:
    fields = {}
    for name, field in model.model_fields.items():
        for alias in _aliases(name, field):
            fields[alias] = field
    return fields


def _aliases(name: str, field: Any) -> list[str]:
    names = [field.alias or name]
    choices = getattr(field.validation_alias, "choices", None)
    if choices:
        names = [str(choice) for choice in choices]
    return names


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_of(arg)
        if found is not None:
            return found
    return None
