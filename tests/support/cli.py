"""`kvmem` commands run inside the test process, through click's runner.

A real `python -m kvmem` costs about 0.6 s of CPU before the command starts (SQLAlchemy,
pydantic, click); the suite ran some two hundred of them. The commands' behaviour is
tested here, in process; what only a real process shows (the entry point, stdin, the exit
status, what `kvmem` imports, `serve`) keeps its subprocess tests (`processes.run`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path

from click.testing import CliRunner

from kvmem.cli import main
from tests.support.processes import Result


def invoke(
    args: Sequence[str], *, cwd: Path, input: str | None = None, env: dict[str, str] | None = None
) -> Result:
    """`kvmem ARGS` in `cwd`, as `processes.run` runs it (without the caller's KVMEM_CONFIG),
    in this process. An exception the command does not handle fails the test with its
    traceback (a real process would print it and exit 1)."""
    runner = CliRunner()
    environ: dict[str, str | None] = {"KVMEM_CONFIG": None} | dict(env or {})
    with contextlib.chdir(cwd):
        result = runner.invoke(
            main, list(args), input=input, env=environ, catch_exceptions=False, prog_name="kvmem"
        )
    return Result(result.exit_code, result.stdout, result.stderr)


def invoke_all(commands: list[list[str]], cwd: Path) -> list[Result]:
    """Independent commands, one after the other (each takes milliseconds in process)."""
    return [invoke(args, cwd=cwd) for args in commands]
