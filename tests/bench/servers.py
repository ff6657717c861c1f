"""The processes the benchmark measures: the scripted upstream, kvmem and the LiteLLM proxy.

Every server is a subprocess on 127.0.0.1 in its own process group, with its output in a log
file; `Fleet` starts them, polls each until it is ready, and kills every one it started when
its `with` block ends, on success or failure.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.support.ports import PortHold

HOST = "127.0.0.1"
REPO = Path(__file__).resolve().parents[2]
API_KEY = "sk-bench"
# `chat.client` of the kvmem instances (`litellm` measures the path before the direct one).
CHAT_CLIENT_ENV = "KVMEM_BENCH_CHAT_CLIENT"
MAIN_MODEL = "openai/bench-model"  # what clients of kvmem and of the proxy ask for
UPSTREAM_MAIN = "bench-model"  # what the upstream sees (litellm drops the provider)
# The litellm path: a provider that litellm translates (kvmem's `chat.client: auto` sends it
# through litellm), served by the upstream's Anthropic-shaped `/v1/messages`.
ANTHROPIC_MODEL = "anthropic/bench-model"
USER_ID = "local"  # auth.mode local: every request is this user


def tool(name: str) -> list[str]:
    """The command of a console script installed beside this Python."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return [str(beside)]
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} is not installed (pip install -e '.[test]')")
    return [found]


def child_env(**extra: str) -> dict[str, str]:
    """The environment of every server: offline litellm, loopback never proxied."""
    env = dict(os.environ)
    # As installed: each server's first start caches its bytecode for the next ones (with
    # this set, every start compiled kvmem's own modules again).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update(
        LITELLM_LOCAL_MODEL_COST_MAP="True",
        LITELLM_TELEMETRY="False",
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Have the kernel SIGTERM the child if the benchmark process dies without cleaning up."""
    with suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    """A plain GET; (status, body), status 0 when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (loopback)
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (OSError, urllib.error.URLError):
        return 0, b""


@dataclass
class Server:
    """One running server process."""

    name: str
    process: subprocess.Popen[bytes]
    port: int
    log: Path
    ready_path: str
    started: float  # time.perf_counter() at spawn
    ready_seconds: float | None = None
    config: Path | None = None

    @property
    def url(self) -> str:
        """The server's base URL."""
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int:
        """The process id (also its process group id)."""
        return self.process.pid

    def log_tail(self, lines: int = 40) -> str:
        """The end of the server's output, for error messages."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def wait_ready(self, timeout: float) -> float:
        """Poll the ready path until it answers 200; the seconds from spawn to ready."""
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with code {self.process.returncode} before it was "
                    f"ready; its log ({self.log}) ends with:\n{self.log_tail()}"
                )
            status, _ = http_get(self.url + self.ready_path, timeout=1.0)
            if status == 200:
                self.ready_seconds = time.perf_counter() - self.started
                return self.ready_seconds
            time.sleep(0.01)
        raise RuntimeError(
            f"{self.name} was not ready within {timeout:g} s; its log ({self.log}) ends with:\n"
            f"{self.log_tail()}"
        )

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the process group, then SIGKILL it if it does not end in time."""
        if self.process.poll() is None:
            _signal_group(self.process, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                _signal_group(self.process, signal.SIGKILL)
                self.process.wait(5)
        # The group may still hold children of a process that ended first.
        _signal_group(self.process, signal.SIGKILL)


def _signal_group(process: subprocess.Popen[bytes], sig: int) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


@dataclass
class AgentSpec:
    """The memory agent of a kvmem instance: which upstream model, and its grace period."""

    model: str  # "bench-agent" (answers) or "bench-hang" (never answers)
    grace_seconds: float = 3.0


@dataclass
class Fleet:
    """Starts servers into `workdir` and stops every one of them at the end."""

    workdir: Path
    servers: list[Server] = field(default_factory=list)
    holds: list[PortHold] = field(default_factory=list)

    def port(self) -> int:
        """A port for a server of this fleet, held from every other process until the fleet
        stops (a port picked and let go could be taken first: tests/support/ports.py)."""
        hold = PortHold(HOST)
        self.holds.append(hold)
        return hold.port

    def spawn(
        self,
        name: str,
        command: list[str],
        port: int,
        ready_path: str,
        env: dict[str, str] | None = None,
        config: Path | None = None,
    ) -> Server:
        """Start `command` in its own process group, output to `workdir/<name>.log`."""
        log = self.workdir / f"{name}.log"
        with log.open("ab") as out:
            process = subprocess.Popen(
                command,
                cwd=REPO,
                env=env or child_env(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        server = Server(name, process, port, log, ready_path, time.perf_counter(), config=config)
        self.servers.append(server)
        return server

    def stop(self, server: Server) -> None:
        """Stop one server now."""
        server.stop()
        if server in self.servers:
            self.servers.remove(server)

    def stop_all(self) -> None:
        """Stop every server still running, newest first; give their ports back."""
        while self.servers:
            self.stop(self.servers[-1])
        while self.holds:
            self.holds.pop().close()

    # -- the three kinds of server --------------------------------------------------------

    def upstream(
        self, main_latency: float, agent_latency: float, chunks: int, chunk_delay: float
    ) -> Server:
        """The scripted upstream (`tests.bench.upstream`), uvloop + httptools."""
        port = self.port()
        return self.spawn(
            "upstream",
            [
                sys.executable,
                "-m",
                "tests.bench.upstream",
                "--port",
                str(port),
                "--main-latency",
                str(main_latency),
                "--agent-latency",
                str(agent_latency),
                "--chunks",
                str(chunks),
                "--chunk-delay",
                str(chunk_delay),
            ],
            port,
            "/control/ping",
        )

    def kvmem_config(
        self,
        name: str,
        upstream: Server,
        agent: AgentSpec | None,
        database_url: str | None = None,
        memory_extra: dict[str, Any] | None = None,
        chat_model: str = MAIN_MODEL,
        auth: dict[str, Any] | None = None,
    ) -> tuple[Path, int]:
        """Write `<name>.yaml` for a kvmem instance; (its path, its port). `auth` replaces
        the `auth` section (default `mode: local`)."""
        port = self.port()
        memory: dict[str, Any] = {"tokenLimit": 20000, **(memory_extra or {})}
        if agent is not None:
            memory["agent"] = {
                "enabled": True,
                "provider": "openai",
                "model": agent.model,
                "api_base": f"{upstream.url}/v1",
                "api_key": API_KEY,
                "grace_seconds": agent.grace_seconds,
                # Every bench client acts as the one local user, standing for many users:
                # bounds high enough that no run is `busy`, so the workload (an agent call per
                # chat request) stays the one earlier runs measured.
                "max_runs_per_user": 1024,
                "max_concurrent_runs": 1024,
            }
        config = {
            "server": {"host": HOST, "port": port},
            "database": {"url": database_url or f"sqlite:///{self.workdir / (name + '.db')}"},
            "auth": auth or {"mode": "local"},
            "chat": {
                "model": chat_model,
                "api_base": upstream_base(upstream, chat_model),
                "api_key": API_KEY,
                "timeout": 30,
                "client": os.environ.get(CHAT_CLIENT_ENV) or "auto",
            },
            "memory": memory,
        }
        path = self.workdir / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path, port

    def kvmem(self, name: str, config: Path, port: int, command: str | None = None) -> Server:
        """`kvmem serve --config <config>` (it migrates the database first); `command` is
        another installation's `kvmem` script (default: the one beside this Python)."""
        return self.spawn(
            name,
            [*([command] if command else tool("kvmem")), "serve", "--config", str(config)],
            port,
            "/healthz",
            config=config,
        )

    def litellm_proxy(self, upstream: Server) -> Server:
        """The LiteLLM proxy in front of the same upstream: no database, no network."""
        port = self.port()
        config = {
            "model_list": [
                {
                    "model_name": model,
                    "litellm_params": {
                        "model": model,
                        "api_base": upstream_base(upstream, model),
                        "api_key": API_KEY,
                    },
                }
                for model in (MAIN_MODEL, ANTHROPIC_MODEL)
            ],
            "litellm_settings": {"telemetry": False},
            # Like kvmem's auth.mode local: no credentials. Without this, recent proxies
            # refuse to start with no master key.
            "general_settings": {"dangerously_permit_weak_or_unset_master_key": True},
        }
        path = self.workdir / "litellm-proxy.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        env = child_env(LITELLM_LOG="ERROR", DISABLE_ADMIN_UI="True")
        for name in ("DATABASE_URL", "LITELLM_MASTER_KEY", "REDIS_HOST", "REDIS_URL"):
            env.pop(name, None)
        return self.spawn(
            "litellm-proxy",
            [*tool("litellm"), "--config", str(path), "--host", HOST, "--port", str(port)],
            port,
            "/health/liveliness",
            env=env,
            config=path,
        )


def upstream_base(upstream: Server, model: str) -> str:
    """The `api_base` for `model`: litellm appends `/v1/messages` to an Anthropic base and
    `/chat/completions` to an OpenAI one."""
    return upstream.url if model.startswith("anthropic/") else f"{upstream.url}/v1"


@contextmanager
def fleet(workdir: Path) -> Iterator[Fleet]:
    """A `Fleet` whose servers are all stopped when the block ends, however it ends."""
    servers = Fleet(workdir)
    try:
        yield servers
    finally:
        servers.stop_all()


def upstream_hangs(upstream: Server, clear: bool = False) -> dict[str, dict[str, float | None]]:
    """The hanging agent requests the upstream saw (see `tests.bench.upstream`)."""
    if clear:
        request = urllib.request.Request(upstream.url + "/control/hangs/clear", method="POST")
        with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310
            response.read()
        return {}
    status, body = http_get(upstream.url + "/control/hangs", timeout=5)
    if status != 200:
        raise RuntimeError(f"the upstream's control endpoint answered {status}")
    return json.loads(body)


@contextmanager
def postgres_database(admin_url: str) -> Iterator[str]:
    """A fresh PostgreSQL database `kvmem_bench_<random>` on the server of `admin_url`,
    dropped at the end; yields its URL."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"kvmem_bench_{os.urandom(4).hex()}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            yield make_url(admin_url).set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.connect() as connection:
                connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()
