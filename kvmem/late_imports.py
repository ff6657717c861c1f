"""Imports made after start-up (litellm, the MCP SDK, tiktoken): the large ones one at a
time, and none leaving a half-imported package behind.

Two threads that import at once can meet in a cycle of CPython's per-module import locks
(a package and a submodule that imports it back, taken in opposite orders). CPython then
breaks the tie by handing one thread a partially initialized module, and that thread's
import fails. What the failed import had finished stays in `sys.modules` (for litellm:
`litellm.utils` and hundreds more) while the package itself is removed, so every later
import of it in the process fails as well: "partially initialized module 'litellm' has no
attribute 'utils'". One CI run lost ten tests of one worker that way.

`import_late` therefore imports under one process-wide lock, so kvmem's large late imports
(litellm, the MCP SDK) never run side by side, and after a failure it forgets the whole package and imports it
once more from scratch (with whatever other package the failure left orphaned), so that one
unlucky import does not break the process for good.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import sys
import threading
from types import ModuleType

logger = logging.getLogger(__name__)

# Reentrant, so that a late import whose module asks for another one cannot deadlock itself.
_LOCK = threading.RLock()


def forget(names: tuple[str, ...]) -> None:
    """Remove each of `names` and all its submodules from `sys.modules`, then every module
    whose parent package is no longer there (what a failed import of another package left
    behind: a module whose package is gone breaks every later import of that package)."""
    for module in [m for m in sys.modules if any(m == n or m.startswith(n + ".") for n in names)]:
        del sys.modules[module]
    for module in sorted(sys.modules, key=lambda m: m.count(".")):
        parent = module.rpartition(".")[0]
        if parent and parent not in sys.modules:
            del sys.modules[module]


def import_late(name: str, *, packages: tuple[str, ...] = (), alone: bool = True) -> ModuleType:
    """`importlib.import_module(name)`, one late import at a time (unless `alone` is false:
    for a small import that must not wait behind litellm's). A failed import is logged,
    then `name` and `packages` (the third-party packages it imports; by default `name`'s
    own top-level package) are forgotten and the import is tried once more."""
    module = sys.modules.get(name)
    if module is not None and not getattr(module.__spec__, "_initializing", False):
        return module  # the usual case: imported already, no lock taken
    names = (name, *packages) if packages else (name.split(".")[0],)
    with _LOCK if alone else contextlib.nullcontext():
        try:
            return importlib.import_module(name)
        except Exception:
            logger.warning(
                "importing %s failed; importing it again from scratch", name, exc_info=True
            )
            forget(names)
        try:
            return importlib.import_module(name)
        except Exception:
            forget(names)  # so that the next attempt starts clean as well
            raise
