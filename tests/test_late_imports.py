"""`import_late`: a failed late import does not break the package for the rest of the process.

The packages here are tiny stand-ins for litellm, built in a temporary directory: the package
imports from a first submodule and then from a second one that reads the first through the package (as
litellm's submodules read `litellm.utils`), and the second fails on the first import only
(as an import does when CPython breaks a cycle of two threads' import locks).
"""

from __future__ import annotations

import importlib
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvmem.late_imports import import_late

FILES = {
    # As litellm's `from .utils import client`: the name `first` is bound by the import system.
    "lateshaky/__init__.py": "from .first import VALUE\nfrom .second import VALUE as SECOND\n",
    "lateshaky/first.py": "VALUE = 42\n",
    "lateshaky/second.py": (
        "import pathlib\n"
        "import lateshaky\n"
        "VALUE = lateshaky.first.VALUE\n"
        "_once = pathlib.Path(__file__).with_name('fail-once')\n"
        "if _once.exists():\n"
        "    _once.unlink()\n"
        "    raise RuntimeError('a half-imported module (simulated)')\n"
    ),
    # Another package whose import fails inside lateshaky's: kvmem retries `lateouter`.
    "lateouter/__init__.py": "import lateshaky\nVALUE = lateshaky.second.VALUE\n",
}


@pytest.fixture
def packages(tmp_path: Path) -> Iterator[Path]:
    for name, text in FILES.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    sys.path.insert(0, str(tmp_path))
    importlib.invalidate_caches()
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m.split(".")[0] in {"lateshaky", "lateouter"}]:
            del sys.modules[name]


def fail_once(packages: Path) -> None:
    (packages / "lateshaky" / "fail-once").touch()


def test_without_it_one_failed_import_breaks_every_later_one(packages: Path) -> None:
    """The failure kvmem guards against, shown with a plain import: what the failed import
    finished stays behind without its package, and the package never imports again."""
    fail_once(packages)
    with pytest.raises(RuntimeError, match="simulated"):
        importlib.import_module("lateshaky")
    assert "lateshaky" not in sys.modules and "lateshaky.first" in sys.modules
    for _ in range(2):
        with pytest.raises(AttributeError, match="has no attribute 'first'"):
            importlib.import_module("lateshaky")


def test_a_failed_import_is_logged_and_made_again_from_scratch(
    packages: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fail_once(packages)
    with caplog.at_level(logging.WARNING, logger="kvmem.late_imports"):
        module = import_late("lateshaky")
    assert module.second.VALUE == 42 and sys.modules["lateshaky"] is module
    assert "importing lateshaky failed" in caplog.text and "simulated" in caplog.text
    assert import_late("lateshaky") is module  # imported once: no second attempt


def test_what_another_package_left_orphaned_is_forgotten_too(packages: Path) -> None:
    """`lateouter` fails inside `lateshaky`'s import: `lateshaky.first` is left without its
    package, and is forgotten with `lateouter`, so the retry imports both afresh."""
    fail_once(packages)
    assert import_late("lateouter").VALUE == 42
    assert sys.modules["lateshaky"].first is sys.modules["lateshaky.first"]


def test_a_lasting_failure_is_raised_and_leaves_no_orphan(packages: Path) -> None:
    (packages / "lateshaky" / "second.py").write_text("raise RuntimeError('always broken')\n")
    with pytest.raises(RuntimeError, match="always broken"):
        import_late("lateshaky")
    assert not [m for m in sys.modules if m.split(".")[0] == "lateshaky"]


def test_the_named_packages_are_forgotten_beside_a_module_of_another(packages: Path) -> None:
    """A kvmem module that imports a third-party package (the MCP SDK's) forgets that package,
    not kvmem."""
    (packages / "latewrapper.py").write_text("import lateshaky\nVALUE = lateshaky.first.VALUE\n")
    fail_once(packages)
    try:
        assert import_late("latewrapper", packages=("lateshaky",)).VALUE == 42
        assert "kvmem.late_imports" in sys.modules
    finally:
        sys.modules.pop("latewrapper", None)


def test_the_encoding_does_not_wait_behind_a_large_import(tmp_path: Path) -> None:
    """The first write waits for the encoding; litellm's import (seconds, under the lock)
    starts beside it. In a fresh interpreter, with the lock held, the encoding still loads."""
    code = (
        "import threading\n"
        "from kvmem import late_imports\n"
        "from kvmem.tokens import TokenCounter\n"
        "late_imports._LOCK.acquire()  # as litellm's import holds it\n"
        "loading = threading.Thread(target=TokenCounter().load, daemon=True)\n"
        "loading.start()\n"
        "loading.join(60)\n"
        "print('loaded' if not loading.is_alive() else 'waiting')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=90
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "loaded\n", "")
