"""The `kvmem` command: serve, check the config, migrate, edit memory, manage keys, and
evaluate the memory agent (`kvmem eval`).

Only this package knows click: `main` here, one module per group of commands (`server`,
`db`, `memory`, `users`, `keys`, `eval`, `imports`), and what they share in `command.py`. It imports
neither litellm nor tiktoken at import time (a test checks it), so `kvmem memory list`
starts fast; `serve` imports the app and `eval` its machinery when they run.
Exit codes: 0 success, 1 a failed operation, 2 bad usage or config.
"""

from __future__ import annotations

import click

from kvmem.cli.command import config_option
from kvmem.cli.db import db_group
from kvmem.cli.eval import evaluate
from kvmem.cli.imports import import_foreign
from kvmem.cli.keys import keys_group
from kvmem.cli.memory import memory_group
from kvmem.cli.server import check, mcp, serve
from kvmem.cli.users import usage, user_group


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@config_option
@click.version_option(package_name="kvmem")
def main() -> None:
    """kvmem: a key/value memory sidecar for LLM chat."""


main.add_command(serve)
main.add_command(check)
main.add_command(mcp)
main.add_command(db_group)
main.add_command(memory_group)
main.add_command(user_group)
main.add_command(usage)
main.add_command(evaluate)
main.add_command(keys_group)
main.add_command(import_foreign)
