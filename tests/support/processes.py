"""kvmem as real subprocesses: `kvmem serve` (kill, signal, restart) and CLI commands."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.support.ports import PortHold

# The head of a `python -c` script that records which thread imports litellm, if any, in
# `Watch.seen` (an import hook, before anything is imported).
WATCH_LITELLM_IMPORTS = (
    "import sys, threading\n"
    "class Watch:\n"
    "    seen = []\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name == 'litellm':\n"
    "            Watch.seen.append(threading.current_thread().name)\n"
    "        return None\n"
    "sys.meta_path.insert(0, Watch())\n"
)


class ServeProcess:
    """One `python -m kvmem serve` with a config written from `sections`."""

    def __init__(self, folder: Path, sections: dict[str, Any], name: str = "kvmem") -> None:
        # Held until the server is stopped, so no other process takes it meanwhile.
        self.hold = PortHold()
        self.port = self.hold.port
        self.config = folder / f"{name}.yaml"
        self.config.write_text(json.dumps(sections), encoding="utf-8")  # JSON is YAML
        self.log = folder / f"{name}-{self.port}.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60) -> ServeProcess:
        """Start the server and wait until /healthz answers."""
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "kvmem",
                    "serve",
                    "--config",
                    str(self.config),
                    "--port",
                    str(self.port),
                ],
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        deadline = time.monotonic() + timeout
        # One client for every poll: `httpx.get` builds a client and its TLS context per call
        # (~33 ms of CPU), which made this loop take ~40 % of a core while the server started.
        with httpx.Client(timeout=1) as http:
            while True:
                if self.process.poll() is not None:
                    self.hold.close()
                    raise AssertionError(
                        f"kvmem exited {self.process.returncode}: {self.log.read_text()}"
                    )
                try:
                    if http.get(f"{self.url}/healthz").status_code == 200:
                        return self
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise AssertionError("kvmem did not start")
                time.sleep(0.05)

    def stop(self) -> None:
        """Terminate the server (kill it if it does not exit); its port is given back."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.hold.close()


@dataclass(frozen=True)
class Result:
    """What one run of `kvmem` did."""

    code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


def run(
    args: Sequence[str], *, cwd: Path, input: str | None = None, env: dict[str, str] | None = None
) -> Result:
    """Run `python -m kvmem ARGS` in `cwd`, without any KVMEM_CONFIG of the caller's."""
    environ = {k: v for k, v in os.environ.items() if k != "KVMEM_CONFIG"} | (env or {})
    done = subprocess.run(
        [sys.executable, "-m", "kvmem", *args],
        cwd=cwd,
        input=input,
        capture_output=True,
        text=True,
        env=environ,
        timeout=60,
    )
    return Result(done.returncode, done.stdout, done.stderr)


def run_all(commands: list[list[str]], cwd: Path) -> list[Result]:
    """Run independent commands side by side (each is a whole Python start-up)."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(lambda args: run(args, cwd=cwd), commands))


# What decides how a terminal program prints, none of it taken from the caller's environment.
TERMINAL_VARIABLES = ("NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE", "COLUMNS", "LINES", "TERM")


def run_in_terminal(
    args: Sequence[str], *, cwd: Path, env: dict[str, str] | None = None, columns: int = 80
) -> Result:
    """Run `python -m kvmem ARGS` with stdout on a pseudo-terminal `columns` wide (an xterm),
    as a person at a terminal runs it; `stdout` is what the terminal received (line ends
    as `\n`), `stderr` is piped."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    environ = {
        k: v for k, v in os.environ.items() if k != "KVMEM_CONFIG" and k not in TERMINAL_VARIABLES
    } | {"TERM": "xterm-256color", **(env or {})}
    with subprocess.Popen(
        [sys.executable, "-m", "kvmem", *args],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=follower,
        stderr=subprocess.PIPE,
        env=environ,
    ) as process:
        os.close(follower)
        received = bytearray()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], deadline - time.monotonic())
            if not ready:
                break
            try:
                part = os.read(leader, 65536)
            except OSError:  # EIO: the program closed the terminal's other end
                break
            if not part:
                break
            received += part
        os.close(leader)
        stderr = process.stderr.read().decode() if process.stderr else ""
        code = process.wait(timeout=60)
    return Result(code, received.decode().replace("\r\n", "\n"), stderr)
