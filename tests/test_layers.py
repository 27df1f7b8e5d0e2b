"""The import graph of ``src/`` points down the layers only: the core knows no store package and no
harness, the core's testing package names no store, a store package knows no other store and no
harness, and the harness reaches stores through their kits, its mutation machinery included (a
store's mutants live in its own package; a generated mutant names the module it patches as data).
Inside the harness, no module imports itself back, and neither does a part of it (a top-level
module or subpackage of ``wd_chaos``): the parts stand in floors.

Read with ``ast`` over every module, imports inside functions included, relative ones resolved: a
dozen lines, where import-linter would add a dependency and a contract file for the same four rules.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

STORE_PACKAGES = ("without_durability_postgres", "without_durability_redis")
CORE_STORES = ("without_durability.sqlite", "without_durability.memory", "without_durability.kits")
MODEL_EDGE = ("without_durability.testing.model", "without_durability.memory")
"""The one store the core's testing package may import: the model test's oracle is the Memory store."""

CLIENT, CONTROL = "wd_chaos.client", "wd_chaos.control"
CONTROL_MAY_IMPORT = (CLIENT, "wd_chaos.client.recorder")
"""What of ``client/`` the controller imports: the package itself (a docstring) and the recorder,
which records the controller's final read as the workers' calls are recorded. Worker and storm
processes it starts by module path (``python -m wd_chaos.client.workload``, locust's ``-f``)."""


def module_name(path: Path, src: Path = SRC) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, src: Path = SRC) -> set[str]:
    """Every module ``path`` imports, anywhere in it, as absolute names."""
    name = module_name(path, src)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                root = ".".join(base + ([node.module] if node.module else []))
            else:
                root = node.module or ""
            found.add(root)
            found.update(f"{root}.{alias.name}" for alias in node.names)
    return found


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def rules_broken(me: str, target: str) -> list[str]:
    """The layer rules the import of ``target`` by module ``me`` breaks."""
    broken = []
    core = _under(me, ("without_durability",)) and not _under(me, ("without_durability.kits",))
    if core and _under(target, (*STORE_PACKAGES, "wd_chaos", "without_durability.kits")):
        broken.append("the core imports no store package, kit or harness")
    model_edge = me == MODEL_EDGE[0] and _under(target, (MODEL_EDGE[1],))
    if _under(me, ("without_durability.testing",)) and _under(target, CORE_STORES) and not model_edge:
        broken.append("the core's testing package names no store")
    if _under(me, (*STORE_PACKAGES, "without_durability.kits")):
        if _under(target, ("wd_chaos",)):
            broken.append("a store package imports no harness")
        others = tuple(p for p in STORE_PACKAGES if not _under(me, (p,)))
        if _under(target, others):
            broken.append("a store package imports no other store")
    if _under(me, ("wd_chaos",)) and _under(target, (*STORE_PACKAGES, *CORE_STORES)):
        broken.append("the harness reaches stores through their kits")
    if _under(me, (CLIENT,)) and _under(target, (CONTROL,)):
        broken.append("a worker process imports nothing of the controller")
    allowed = target == CLIENT or _under(target, CONTROL_MAY_IMPORT[1:])
    if _under(me, (CONTROL,)) and _under(target, (CLIENT,)) and not allowed:
        broken.append("the controller imports of client/ only the recorder")
    return broken


def violations(src: Path = SRC) -> list[str]:
    """Every import that runs against the layers, as ``importer -> imported (rule)``."""
    out: list[str] = []
    for path in sorted(src.rglob("*.py")):
        me = module_name(path, src)
        for target in sorted(imports(path, src)):
            out.extend(f"{me} -> {target} ({rule})" for rule in rules_broken(me, target))
    return out


def test_no_import_runs_up_the_layers() -> None:
    found = violations()
    assert not found, "imports against the layers:\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("module", "line", "rule"),
    [
        ("without_durability/testing/extra.py", "from ..sqlite import SqliteCheckpointer", "names no store"),
        ("without_durability/testing/extra.py", "import without_durability_redis.kit", "no store package"),
        ("without_durability_postgres/extra.py", "from wd_chaos import stores", "imports no harness"),
        (
            "without_durability_redis/extra.py",
            "from without_durability_postgres import kit",
            "no other store",
        ),
        (
            "wd_chaos/extra.py",
            "def f():\n    from without_durability_postgres import sweep",
            "through their kits",
        ),
        ("wd_chaos/mutate/extra.py", "from without_durability_redis import _scripts", "through their kits"),
        ("wd_chaos/mutants/extra.py", "from without_durability.sqlite import store", "through their kits"),
        ("wd_chaos/client/extra.py", "from ..control.runner import Options", "nothing of the controller"),
        (
            "wd_chaos/client/extra.py",
            "def f():\n    from wd_chaos.control import services",
            "nothing of the controller",
        ),
        ("wd_chaos/control/extra.py", "from ..client.workload import main", "only the recorder"),
        ("wd_chaos/control/extra.py", "from ..client import testflow", "only the recorder"),
    ],
)
def test_the_layer_check_sees_an_import_against_the_layers(
    tmp_path: Path, module: str, line: str, rule: str
) -> None:
    """The check is not vacuous: each rule catches a module that breaks it (in a copy of the tree's shape)."""
    for package in (
        "without_durability/testing",
        "without_durability_postgres",
        "without_durability_redis",
        "wd_chaos",
    ):
        (tmp_path / package).mkdir(parents=True, exist_ok=True)
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / module).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / module).write_text(line + "\n")
    found = violations(tmp_path)
    assert found and all(rule in f for f in found), found


def test_the_controller_may_import_the_recorder(tmp_path: Path) -> None:
    """The one import across the roles the rules allow is allowed, and nothing else rides on it."""
    for package in ("wd_chaos", "wd_chaos/client", "wd_chaos/control"):
        (tmp_path / package).mkdir(parents=True, exist_ok=True)
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "wd_chaos/control/runner.py").write_text(
        "from ..client.recorder import Recorder\nfrom ..client import recorder\nfrom .. import history\n"
    )
    (tmp_path / "wd_chaos/client/workload.py").write_text("from .. import config\nfrom . import recorder\n")
    assert violations(tmp_path) == []


# -- no import cycle among the harness's modules --------------------------------------------------


def harness_graph(src: Path = SRC) -> dict[str, set[str]]:
    """Each ``wd_chaos`` module and the ``wd_chaos`` modules it imports anywhere (inside functions
    and under ``TYPE_CHECKING`` too: a cycle held apart by a deferred import is still a cycle).
    ``from pkg import name`` is an edge to the module ``pkg.name`` when there is one, else to
    ``pkg`` (its ``__init__``); an import of a name inside a module is an edge to that module."""
    modules = {
        module_name(p, src): p for p in src.rglob("*.py") if _under(module_name(p, src), ("wd_chaos",))
    }

    def known(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = {}
    for me, path in modules.items():
        package = me if path.name == "__init__.py" else me.rpartition(".")[0]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                edges.update(known(alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    root = ".".join(base + ([node.module] if node.module else []))
                else:
                    root = node.module or ""
                edges.update(known(f"{root}.{alias.name}") for alias in node.names)
        graph[me] = edges - {"", me}
    return graph


def strong_groups(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of two or more nodes of ``graph`` (each an import cycle)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def cycles(src: Path = SRC) -> list[list[str]]:
    """The import cycles among ``wd_chaos`` modules: each strongly connected group of two or more."""
    return strong_groups(harness_graph(src))


def test_no_import_cycle_among_harness_modules() -> None:
    found = cycles()
    detail = [
        f"{' <-> '.join(group)}: "
        + "; ".join(f"{a} -> {b}" for a in group for b in sorted(harness_graph()[a]) if b in group)
        for group in found
    ]
    assert not found, "import cycles among wd_chaos modules:\n" + "\n".join(detail)


@pytest.mark.parametrize(
    "b_text",
    [
        "import wd_chaos.a\n",
        "def f():\n    from .a import x\n",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n",
    ],
)
def test_the_cycle_check_sees_a_cycle_however_it_is_deferred(tmp_path: Path, b_text: str) -> None:
    (tmp_path / "wd_chaos").mkdir()
    (tmp_path / "wd_chaos" / "__init__.py").write_text("")
    (tmp_path / "wd_chaos" / "a.py").write_text("from .b import y\nx = 1\n")
    (tmp_path / "wd_chaos" / "b.py").write_text(b_text + "y = 2\n")
    (tmp_path / "wd_chaos" / "c.py").write_text("from . import a, b\n")  # importing both is no cycle
    assert cycles(tmp_path) == [["wd_chaos.a", "wd_chaos.b"]]


# -- no import cycle among the harness's parts (its folder-level floors) --------------------------


def part_of(module: str) -> str:
    """The part of ``wd_chaos`` a module belongs to: its top-level module or subpackage
    (``checks`` for ``wd_chaos.checks.core``), or ``__init__`` for the package's own."""
    names = module.split(".")
    return names[1] if len(names) > 1 else "__init__"


def part_graph(src: Path = SRC) -> dict[str, dict[str, list[str]]]:
    """Each part of ``wd_chaos``, the other parts it imports, and for each the module imports that
    make that edge (``wd_chaos.checks.misuse -> wd_chaos.client.careless``). Read off
    ``harness_graph``, so imports inside functions and under ``TYPE_CHECKING`` count here too: a
    part that needs another only for a type annotation still stands on it, and a floor that only
    holds at run time is not a floor a reader can trust."""
    graph: dict[str, dict[str, list[str]]] = {}
    for me, targets in sorted(harness_graph(src).items()):
        edges = graph.setdefault(part_of(me), {})
        for target in sorted(targets):
            if part_of(target) != part_of(me):
                edges.setdefault(part_of(target), []).append(f"{me} -> {target}")
    return graph


def part_cycles(src: Path = SRC) -> str:
    """Every import cycle among the parts of ``wd_chaos``, each with the module imports that make its
    edges, one per line; empty when the parts stand in floors (each importing only parts below)."""
    graph = part_graph(src)
    out = []
    for group in strong_groups({part: set(edges) for part, edges in graph.items()}):
        out.append("parts " + ", ".join(group) + " import each other:")
        out += [
            f"  {a} -> {b}: " + "; ".join(graph[a][b]) for a in group for b in sorted(graph[a]) if b in group
        ]
    return "\n".join(out)


def test_no_import_cycle_among_harness_parts() -> None:
    """The parts of ``wd_chaos`` (``docs/guides/harness.md`` draws their floors) import each other
    one way: a constant or a history reader two parts share lives below both, a handle is passed
    down, never reached up for."""
    found = part_cycles()
    assert not found, "import cycles among wd_chaos's parts (move what both need below both):\n" + found


@pytest.mark.parametrize(
    "faults_text",
    [
        "from ..checks import core\n",
        "def f():\n    from wd_chaos.checks.core import Verdict\n",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..checks.core import Verdict\n",
    ],
)
def test_the_part_check_sees_a_cycle_between_folders(tmp_path: Path, faults_text: str) -> None:
    """No module imports itself back, yet the folders do: ``checks/misuse`` needs ``faults/kill``
    and ``faults/stall`` needs ``checks/core``. The module check passes it; the part check names
    both parts and the imports that make each edge, however the import is deferred."""
    for folder in ("wd_chaos", "wd_chaos/checks", "wd_chaos/faults"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "wd_chaos/history.py").write_text("x = 1\n")
    (tmp_path / "wd_chaos/checks/core.py").write_text("from ..history import x\n")
    (tmp_path / "wd_chaos/checks/misuse.py").write_text("from ..faults.kill import KEY\nfrom . import core\n")
    (tmp_path / "wd_chaos/faults/kill.py").write_text("from .. import history\nKEY = 1\n")
    (tmp_path / "wd_chaos/faults/stall.py").write_text(faults_text)
    assert cycles(tmp_path) == []
    found = part_cycles(tmp_path)
    assert found.splitlines() == [
        "parts checks, faults import each other:",
        "  checks -> faults: wd_chaos.checks.misuse -> wd_chaos.faults.kill",
        "  faults -> checks: wd_chaos.faults.stall -> wd_chaos.checks.core",
    ], found


def test_the_part_check_passes_floors(tmp_path: Path) -> None:
    """Two parts that both import a third, and one above the other, make no cycle."""
    for folder in ("wd_chaos", "wd_chaos/checks", "wd_chaos/faults"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "wd_chaos/history.py").write_text("x = 1\n")
    (tmp_path / "wd_chaos/checks/bitten.py").write_text("from ..history import x\n")
    (tmp_path / "wd_chaos/faults/kill.py").write_text("from ..checks.bitten import x\nfrom .. import history\n")
    assert part_cycles(tmp_path) == ""
    assert part_graph(tmp_path)["faults"] == {
        "checks": ["wd_chaos.faults.kill -> wd_chaos.checks.bitten"],
        "history": ["wd_chaos.faults.kill -> wd_chaos.history"],
    }


# -- no harness file over 600 lines ---------------------------------------------------------------

MAX_LINES = 600
"""A harness module longer than this mixes roles: split it by what each part is for."""


def long_files(src: Path = SRC) -> list[str]:
    """Every ``wd_chaos`` module over ``MAX_LINES`` lines, with its count (the mutant catalogues
    live in the store packages, so nothing under ``wd_chaos`` is exempt)."""
    out = []
    for path in sorted((src / "wd_chaos").rglob("*.py")):
        where = path.relative_to(src).as_posix()
        count = len(path.read_text().splitlines())
        if count > MAX_LINES:
            out.append(f"{where}: {count} lines")
    return out


def test_no_harness_file_is_over_600_lines() -> None:
    found = long_files()
    assert not found, f"harness modules over {MAX_LINES} lines (split them by role):\n" + "\n".join(found)


def test_the_length_check_sees_a_long_file(tmp_path: Path) -> None:
    (tmp_path / "wd_chaos" / "mutants").mkdir(parents=True)
    (tmp_path / "wd_chaos" / "long.py").write_text("x = 1\n" * 601)
    (tmp_path / "wd_chaos" / "short.py").write_text("x = 1\n" * 600)
    (tmp_path / "wd_chaos" / "mutants" / "catalogue.py").write_text("x = 1\n" * 900)
    assert long_files(tmp_path) == ["wd_chaos/long.py: 601 lines", "wd_chaos/mutants/catalogue.py: 900 lines"]
