"""The house's shape: kvmem's imports form no cycle, and the module map in the docs is true.

Every `import` and `from ... import` statement of a module counts, wherever it stands: at the
top, inside a function (the lazy imports of litellm's and mcp's users) and under
`TYPE_CHECKING` (an import for types only is still an arrow between two modules). A `from
package import name` points at `package.name` when that is a module, else at `package`.

The module map is the table of `| module | owns |` rows in the section headed "Module map";
its rule: "Dependencies point down this list: a module imports only modules listed above it"
(modules in one row may import each other). A row names modules as `errors.py` or a package
as `routes/` (all of its modules). Outside the map: `kvmem/__init__.py`, the package itself
(its version: it imports nothing of kvmem, and anyone may import it), and `kvmem/__main__.py`
(`python -m kvmem`: it may import anything, and nothing imports it). `kvmem.migrations`
(Alembic's scripts, `migrations/` at the top of the repository) is not in the map either, nor
is a package's face: the `__init__.py` of a package whose modules the map lists one by one
(`memory/`, `agent/`, ...), which says what the package offers and imports nothing of kvmem.

The same rule holds between packages: the map lists each package's modules together (the
modules at the top of `kvmem/` first, as one floor), and a package imports only packages listed
above it. The tree itself stays a table of contents: at most `MAX_TOP_ENTRIES` entries at the
top of `kvmem/`, at most `MAX_FOLDER_MODULES` modules in any folder.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = "kvmem"
# The docs site's development page holds the map.
MAP_DOCUMENT = "docs/development.md"
ROOT_RANK = -1  # the package itself: above every row
MAIN_RANK = 10**6  # `__main__`: below every row
UNMAPPED = ("migrations",)  # subpackages that live elsewhere and are not in the map
TOP_FLOOR = "(top)"  # the floor of the modules at the top of the package, in package order
MAX_TOP_ENTRIES = 20
MAX_FOLDER_MODULES = 16


@dataclass(frozen=True)
class Arrow:
    """One import of a module of the package by another: where it is written, what it names."""

    source: str
    target: str
    path: str
    line: int

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass(frozen=True)
class Row:
    """One row of the module map: its number (from 1) and the names in its first cell."""

    number: int
    names: tuple[str, ...]


def modules_of(root: Path, package: str) -> dict[str, Path]:
    """Every module of `package` (under `root`) by dotted name; a package by its own name."""
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def arrows_of(root: Path, package: str) -> list[Arrow]:
    """Every import from one module of `package` to another (see the module docstring)."""
    modules = modules_of(root, package)
    arrows = []
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's own package upwards
                    anchor = name.split(".") if is_package else name.split(".")[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                    for alias in node.names
                ]
            for target in targets:
                target = _known(target, modules)
                if target is not None and target != name:
                    relative = path.relative_to(root).as_posix()
                    arrows.append(Arrow(name, target, relative, node.lineno))
    return list(dict.fromkeys(arrows))  # `from m import a, b` is one arrow


def _known(target: str, modules: dict[str, Path]) -> str | None:
    """The module of the package that an imported name loads, or None (outside the package,
    or in a subpackage the map leaves out)."""
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or None


def cycles_of(arrows: list[Arrow]) -> list[list[Arrow]]:
    """For each group of modules that import each other in a circle (directly or through
    others of the group), every import from one of them to another."""
    graph: dict[str, set[str]] = {}
    for arrow in arrows:
        graph.setdefault(arrow.source, set()).add(arrow.target)
    groups = [group for group in _strongly_connected(graph) if len(group) > 1]
    return [
        [a for a in arrows if a.source in group and a.target in group]
        for group in sorted(groups, key=min)
    ]


def _strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's strongly connected components of `graph`."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def map_rows(text: str, source: str) -> list[Row]:
    """The rows of the "Module map" section's table in a markdown document."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if re.fullmatch(r"#+\s+Module map\s*", line)]
    assert len(starts) == 1, (
        f"{source}: expected one section headed 'Module map', found {len(starts)}"
    )
    rows = []
    for line in lines[starts[0] + 1 :]:
        if line.startswith("#"):
            break
        if not line.startswith("|"):
            continue
        first = line.strip("|").split("|")[0].strip()
        if first == "module" or set(first) <= set("-: "):
            continue  # the header and the rule under it
        names = tuple(re.findall(r"`([^`]+)`", first))
        assert names, f"{source}: a module map row names no `module`: {line!r}"
        rows.append(Row(len(rows) + 1, names))
    assert rows, f"{source}: the 'Module map' section has no table rows"
    return rows


def map_document(root: Path) -> Path:
    """The document that holds the module map."""
    return root / MAP_DOCUMENT


@dataclass(frozen=True)
class ModuleMap:
    """What the map says of a package's modules: each one's row, and what does not match."""

    rank: dict[str, int]
    label: dict[str, str]
    unlisted: list[str]
    missing: list[str]


def read_map(rows: list[Row], modules: dict[str, Path], package: str) -> ModuleMap:
    """Each module's row (a module's own entry wins over its package's), the modules no row
    lists and the entries that name no module."""
    rank: dict[str, int] = {package: ROOT_RANK, f"{package}.__main__": MAIN_RANK}
    label = {package: f"{package}/__init__.py", f"{package}.__main__": f"{package}/__main__.py"}
    specific: set[str] = set()
    missing = []
    for row in rows:
        for entry in row.names:
            if entry.endswith("/"):
                prefix = f"{package}.{entry.rstrip('/').replace('/', '.')}"
                members = [m for m in modules if m == prefix or m.startswith(prefix + ".")]
            else:
                dotted = entry.removesuffix(".py").replace("/", ".").removesuffix(".__init__")
                members = [m for m in (f"{package}.{dotted}",) if m in modules]
            if not members:
                missing.append(f"row {row.number}: `{entry}`")
            for member in members:
                is_own = not entry.endswith("/")
                if member in specific or (member in rank and not is_own):
                    continue
                rank[member] = row.number
                label[member] = f"`{entry}`"
                if is_own:
                    specific.add(member)
    for face in faces_of(modules, package):
        rank.setdefault(face, ROOT_RANK)
    outside = {f"{package}.{name}" for name in UNMAPPED}
    unlisted = [
        m
        for m in modules
        if m not in rank and not any(m == o or m.startswith(o + ".") for o in outside)
    ]
    return ModuleMap(rank, label, unlisted, missing)


def faces_of(modules: dict[str, Path], package: str) -> list[str]:
    """The `__init__` of each subpackage (not `package` itself): its face."""
    return [
        name
        for name, path in modules.items()
        if name != package and path.name == "__init__.py" and not _unmapped(name, package)
    ]


def _unmapped(name: str, package: str) -> bool:
    return any(name == f"{package}.{o}" or name.startswith(f"{package}.{o}.") for o in UNMAPPED)


def floor_of(module: str, modules: dict[str, Path], package: str) -> str:
    """The package of `package` that a module belongs to (its first folder, the face
    included), `TOP_FLOOR` for a module at the top, "" for `package` itself and `__main__`."""
    parts = module.split(".")[1:]
    if not parts or parts == ["__main__"]:
        return ""
    first = f"{package}.{parts[0]}"
    return parts[0] if modules.get(first, Path()).name == "__init__.py" else TOP_FLOOR


def entry_floor(entry: str) -> str:
    """The package a module map entry names a module of (`memory/store.py`: `memory`)."""
    return entry.split("/")[0] if "/" in entry else TOP_FLOOR


def floors_in_map_order(rows: list[Row]) -> tuple[list[str], list[str]]:
    """The packages in the order the map lists them, and each package whose rows are not
    together (another package's row between two of its own)."""
    runs: list[str] = []
    for row in rows:
        for floor in dict.fromkeys(entry_floor(entry) for entry in row.names):
            if not runs or runs[-1] != floor:
                runs.append(floor)
    scattered = sorted({floor for floor in runs if runs.count(floor) > 1})
    return list(dict.fromkeys(runs)), scattered


def package_arrows(arrows: list[Arrow], modules: dict[str, Path], package: str) -> list[Arrow]:
    """Each import from a module of one package to a module of another, as an arrow between
    the two packages (the first such import between them says where)."""
    found: dict[tuple[str, str], Arrow] = {}
    for arrow in arrows:
        source = floor_of(arrow.source, modules, package)
        target = floor_of(arrow.target, modules, package)
        if source and target and source != target:
            found.setdefault((source, target), Arrow(source, target, arrow.path, arrow.line))
    return list(found.values())


def package_back_arrows(arrows: list[Arrow], order: list[str]) -> list[str]:
    """Each package import that points at a package the map lists below the importer."""
    rank = {floor: number for number, floor in enumerate(order)}
    return [
        f"{a.where}: package {a.source} imports package {a.target}, which the map lists below it"
        for a in arrows
        if a.source in rank and a.target in rank and rank[a.target] > rank[a.source]
    ]


def back_arrows(arrows: list[Arrow], module_map: ModuleMap) -> list[str]:
    """Each import of a module that the map lists below the importer, said in full."""
    broken = []
    for arrow in arrows:
        if arrow.source not in module_map.rank or arrow.target not in module_map.rank:
            continue  # unlisted: reported on their own
        source_rank = module_map.rank[arrow.source]
        target_rank = module_map.rank[arrow.target]
        if target_rank > source_rank:
            broken.append(
                f"{arrow.where}: {arrow.source} imports {arrow.target}, which the map lists "
                f"below it ({module_map.label[arrow.target]}, row {target_rank}; "
                f"{module_map.label[arrow.source]} is row {source_rank})"
            )
    return broken


@pytest.fixture(scope="module")
def arrows() -> list[Arrow]:
    return arrows_of(REPO, PACKAGE)


@pytest.fixture(scope="module")
def module_map() -> ModuleMap:
    document = map_document(REPO)
    rows = map_rows(document.read_text(encoding="utf-8"), document.name)
    return read_map(rows, modules_of(REPO, PACKAGE), PACKAGE)


def test_kvmem_imports_form_no_cycle(arrows: list[Arrow]) -> None:
    described = [
        "a circle through "
        + ", ".join(sorted({a.source for a in cycle}))
        + ":\n"
        + "\n".join(f"  {a.where}: {a.source} imports {a.target}" for a in cycle)
        for cycle in cycles_of(arrows)
    ]
    assert described == [], "import cycles:\n" + "\n".join(described)


def test_the_module_map_lists_every_module(module_map: ModuleMap) -> None:
    assert module_map.unlisted == [], (
        f"modules missing from the module map: {', '.join(module_map.unlisted)}"
    )


def test_every_module_the_map_lists_exists(module_map: ModuleMap) -> None:
    assert module_map.missing == [], (
        f"module map entries that name no module: {', '.join(module_map.missing)}"
    )


def test_every_module_imports_only_modules_listed_above_it(
    arrows: list[Arrow], module_map: ModuleMap
) -> None:
    broken = back_arrows(arrows, module_map)
    assert broken == [], "imports against the module map's order:\n" + "\n".join(broken)


def test_the_package_itself_and_main_keep_to_their_places(arrows: list[Arrow]) -> None:
    """`kvmem/__init__.py` imports nothing of kvmem; nothing imports `kvmem/__main__.py`."""
    misplaced = [
        f"{a.where}: {a.source} imports {a.target}"
        for a in arrows
        if a.source == PACKAGE or a.target == f"{PACKAGE}.__main__"
    ]
    assert misplaced == []


def test_package_faces_import_nothing_of_kvmem(arrows: list[Arrow]) -> None:
    """A package's face (`memory/__init__.py`) says what it offers; importing a module of the
    package runs it, so it loads nothing else."""
    faces = set(faces_of(modules_of(REPO, PACKAGE), PACKAGE))
    mapped_whole = {"kvmem.cli", "kvmem.server.routes"}  # packages with code in __init__
    loading = [
        f"{a.where}: {a.source} imports {a.target}"
        for a in arrows
        if a.source in faces - mapped_whole
    ]
    assert loading == []


def test_the_map_lists_each_package_together() -> None:
    document = map_document(REPO)
    _, scattered = floors_in_map_order(map_rows(document.read_text(encoding="utf-8"), "map"))
    assert scattered == [], f"packages whose rows the map splits: {', '.join(scattered)}"


def test_packages_import_only_packages_listed_above_them(arrows: list[Arrow]) -> None:
    modules = modules_of(REPO, PACKAGE)
    between = package_arrows(arrows, modules, PACKAGE)
    described = [
        "a circle through " + ", ".join(sorted({a.source for a in cycle}))
        for cycle in cycles_of(between)
    ]
    assert described == [], "package cycles:\n" + "\n".join(described)
    document = map_document(REPO)
    order, _ = floors_in_map_order(map_rows(document.read_text(encoding="utf-8"), "map"))
    assert order[0] == TOP_FLOOR, "the modules at the top of kvmem/ are the ground floor"
    broken = package_back_arrows(between, order)
    assert broken == [], "imports against the packages' order:\n" + "\n".join(broken)


def test_the_tree_reads_as_a_table_of_contents() -> None:
    """At most `MAX_TOP_ENTRIES` files and folders at the top of `kvmem/` (caches aside), and
    at most `MAX_FOLDER_MODULES` modules in any folder."""
    top = REPO / PACKAGE
    entries = [p.name for p in top.iterdir() if p.name != "__pycache__"]
    assert len(entries) <= MAX_TOP_ENTRIES, sorted(entries)
    crowded = {
        str(folder.relative_to(REPO)): count
        for folder in [top, *(p for p in top.rglob("*") if p.is_dir())]
        if (count := len(list(folder.glob("*.py")))) > MAX_FOLDER_MODULES
    }
    assert crowded == {}


# The checks themselves, on a small package made for the purpose: they see the imports that
# the real package would have to break them (an import inside a function, one for types only).
SAMPLE = {
    "__init__.py": "",
    "__main__.py": "from sample.top import run\n",
    "low.py": "import os\n",
    "mid.py": (
        "from typing import TYPE_CHECKING\nfrom sample import low\n"
        "if TYPE_CHECKING:\n    from sample.top import run\n"
    ),
    "top.py": "def run():\n    from . import mid\n    import sample.web.pages\n",
    "web/__init__.py": "",
    "web/pages.py": "from sample.web import forms\n",
    "web/forms.py": "from ..low import *\n",
    "orphan.py": "",
}
SAMPLE_MAP = """\
# Sample
### Module map

Dependencies point down this list: a module imports only modules listed above it.

| module | owns |
|---|---|
| `low.py` | the ground floor |
| `mid.py` | the middle |
| `web/` | the pages; `web/pages.py` is named here only in passing |
| `top.py`, `gone.py` | the top |

## After
| `orphan.py` | not in the map's section |
"""


@pytest.fixture
def sample(tmp_path: Path) -> Path:
    for name, source in SAMPLE.items():
        (tmp_path / "sample" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "sample" / name).write_text(source)
    return tmp_path


def test_the_checks_see_every_kind_of_import(sample: Path) -> None:
    arrows = {(a.source, a.target, a.where) for a in arrows_of(sample, "sample")}
    assert arrows == {
        ("sample.__main__", "sample.top", "sample/__main__.py:1"),
        ("sample.mid", "sample.low", "sample/mid.py:2"),
        ("sample.mid", "sample.top", "sample/mid.py:4"),
        ("sample.top", "sample.mid", "sample/top.py:2"),
        ("sample.top", "sample.web.pages", "sample/top.py:3"),
        ("sample.web.pages", "sample.web.forms", "sample/web/pages.py:1"),
        ("sample.web.forms", "sample.low", "sample/web/forms.py:1"),
    }
    cycles = cycles_of(arrows_of(sample, "sample"))
    assert [[(a.source, a.target) for a in cycle] for cycle in cycles] == [
        [("sample.mid", "sample.top"), ("sample.top", "sample.mid")]
    ]


def test_the_checks_name_each_broken_rule(sample: Path) -> None:
    rows = map_rows(SAMPLE_MAP, "sample.md")
    assert rows == [
        Row(1, ("low.py",)),
        Row(2, ("mid.py",)),
        Row(3, ("web/",)),
        Row(4, ("top.py", "gone.py")),
    ]
    module_map = read_map(rows, modules_of(sample, "sample"), "sample")
    assert module_map.unlisted == ["sample.orphan"]
    assert module_map.missing == ["row 4: `gone.py`"]
    assert back_arrows(arrows_of(sample, "sample"), module_map) == [
        "sample/mid.py:4: sample.mid imports sample.top, which the map lists below it "
        "(`top.py`, row 4; `mid.py` is row 2)"
    ]


def test_the_checks_see_packages_out_of_order(sample: Path) -> None:
    """In the sample, the top's `top.py` imports `web/`, which imports the top's `low.py`: a
    circle between two packages, and the map lists the top's rows on both sides of `web/`."""
    modules = modules_of(sample, "sample")
    between = package_arrows(arrows_of(sample, "sample"), modules, "sample")
    assert {(a.source, a.target) for a in between} == {(TOP_FLOOR, "web"), ("web", TOP_FLOOR)}
    assert [sorted({a.source for a in cycle}) for cycle in cycles_of(between)] == [
        sorted([TOP_FLOOR, "web"])
    ]
    order, scattered = floors_in_map_order(map_rows(SAMPLE_MAP, "sample.md"))
    assert (order, scattered) == ([TOP_FLOOR, "web"], [TOP_FLOOR])
    assert package_back_arrows(between, ["web", TOP_FLOOR]) == [
        "sample/web/forms.py:1: package web imports package (top), which the map lists below it"
    ]
    assert faces_of(modules, "sample") == ["sample.web"]


def test_pyproject_ships_every_package() -> None:
    """`pip install .` (not editable) installs only the packages pyproject names: a new folder
    missing there works in the editable checkout and is gone once installed."""
    import tomllib

    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"][
        "setuptools"
    ]
    folders = {
        ".".join(path.parent.relative_to(REPO).parts)
        for path in (REPO / PACKAGE).rglob("__init__.py")
    }
    assert folders <= set(setuptools["packages"]), sorted(folders - set(setuptools["packages"]))
