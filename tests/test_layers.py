"""The import graph of ``src/`` points down the layers only: the core knows no store package and no
harness, the core's testing package names no store, a store package knows no other store and no
harness, and the harness reaches stores through their kits (only the mutant modules, which subclass
a store's classes, and the generated-mutant patcher, which edits a store's statements, import one).

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
    # the mutant modules subclass a store's classes, and the generated mutants (wd_chaos.mutate)
    # patch a store's own statements in place: both must reach inside the store they break
    harness = _under(me, ("wd_chaos",)) and not _under(me, ("wd_chaos.mutants", "wd_chaos.mutate"))
    if harness and _under(target, (*STORE_PACKAGES, *CORE_STORES)):
        broken.append("the harness reaches stores through their kits")
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
        ("without_durability_redis/extra.py", "from without_durability_postgres import kit", "no other store"),
        ("wd_chaos/extra.py", "def f():\n    from without_durability_postgres import sweep", "through their kits"),
    ],
)
def test_the_layer_check_sees_an_import_against_the_layers(
    tmp_path: Path, module: str, line: str, rule: str
) -> None:
    """The check is not vacuous: each rule catches a module that breaks it (in a copy of the tree's shape)."""
    for package in ("without_durability/testing", "without_durability_postgres", "without_durability_redis", "wd_chaos"):
        (tmp_path / package).mkdir(parents=True, exist_ok=True)
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / module).write_text(line + "\n")
    found = violations(tmp_path)
    assert found and all(rule in f for f in found), found
