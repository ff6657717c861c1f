"""The before/after bench (`tests.bench.ab`) runs each kvmem from its own tree: the scripts it
writes import the tree they name, and refuse to run when `kvmem` would come from elsewhere.
Its load numbers are not checked here (`python -m tests.bench.ab --quick` is the smoke test,
~20 s: too long for the suite)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.bench.ab import BEFORE_REF, IMPORTED, launcher, write_scripts
from tests.bench.servers import REPO


def run(script: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)


def test_each_script_imports_its_own_tree(tmp_path: Path) -> None:
    before, after = write_scripts(tmp_path, BEFORE_REF)
    tree = tmp_path / "before-tree"
    for script, imported in ((before, tree), (after, REPO)):
        done = run(script)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stderr.splitlines()[0] == f"{IMPORTED}{imported / 'kvmem' / '__init__.py'}"
        assert done.stdout.startswith(f"Usage: {script.name} [OPTIONS] COMMAND [ARGS]...")
    # The exported tree carries its own migrations, not this checkout's.
    assert (tree / "kvmem" / "migrations" / "env.py").is_file()


def test_a_script_refuses_a_tree_without_kvmem(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    done = run(launcher(tmp_path / "kvmem-empty", empty))
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.startswith("kvmem came from ")
    assert done.stderr.rstrip().endswith(f", not from {empty}")
