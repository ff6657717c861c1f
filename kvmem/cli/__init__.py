"""The `kvmem` command: serve, check the config, migrate, edit memory, manage keys, and
evaluate the memory agent (`kvmem eval`).

Only this package knows click: `main` here, one module per group of commands (`server`,
`db`, `memory`, `users`, `keys`, `eval`, `imports`), and what they share in `command.py`. It imports
neither litellm nor tiktoken at import time (a test checks it), so `kvmem memory list`
starts fast; `serve` imports the app and `eval` its machinery when they run.
Exit codes: 0 success, 1 a failed operation, 2 bad usage or config.
"""

from __future__ import annotations

import gc

# No garbage collection while the command's modules load: imports make hundreds of thousands
# of objects and almost no garbage, and the collections they set off cost ~0.1 s of CPU
# (a seventh of `kvmem serve`'s start to ready). Turned back on at the end of this module.
_COLLECTING = gc.isenabled()
gc.disable()

import click  # noqa: E402

from kvmem.cli.command import config_option  # noqa: E402
from kvmem.cli.db import db_group  # noqa: E402
from kvmem.cli.eval import evaluate  # noqa: E402
from kvmem.cli.imports import import_foreign  # noqa: E402
from kvmem.cli.keys import keys_group  # noqa: E402
from kvmem.cli.memory import memory_group  # noqa: E402
from kvmem.cli.server import check, mcp, serve  # noqa: E402
from kvmem.cli.users import usage, user_group  # noqa: E402


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

if _COLLECTING:
    gc.enable()
