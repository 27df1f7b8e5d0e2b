"""The harness names no store: no string literal under ``src/wd_chaos`` equals the name of an
installed store kit (or an alias or family of one), a store server's kind or program, or a scheme a
store server is reached at. A store's name lives in its kit; the harness asks the kit registry
(``default_kit``, a capability, ``StoreKit.recipe``) instead of writing the name down.

Read with ``ast``: string constants in code count, f-string pieces included. A bare string
statement does not: docstrings (module, class, function, and the attribute docstrings under an
assignment) may name a store to explain, as comments may; they steer nothing. Scenario files
(``scenarios/*.toml``) are data a user may write too and are not read here.

What must stay is in ``ALLOWED``, each with why. The names come from the kits installed where the
test runs, so a third-party kit's name is kept out of the harness as well.
"""

from __future__ import annotations

import ast
from pathlib import Path

from without_durability.testing.kit import kits, server_recipes

SRC = Path(__file__).resolve().parents[1] / "src"

ALLOWED: dict[tuple[str, str], str] = {
    ("wd_chaos/control/runner.py", "redis"): (
        "a Python distribution (redis-py) whose version a run records beside psycopg's, not a store "
        "chosen: the report says which drivers were installed"
    ),
}
"""(file under ``src/``, literal) -> why it may stay."""


def store_names() -> set[str]:
    """Every name that would tie the harness to one store: each installed kit's name, aliases and
    family, its server's kind and program, and the URL schemes its server recipe answers at
    (toxiproxy's ``http`` is the harness's own server, kept beside its recipe in ``wd_chaos``)."""
    names: set[str] = set()
    for name, kit in kits().items():
        names.update({name, kit.store_kind, *kit.aliases})
        if kit.server_binary:
            names.add(kit.server_binary)
    for recipe in server_recipes():
        names.add(recipe.kind)
        names.update(scheme for scheme, _ in recipe.schemes)
    return names


def _bare_strings(tree: ast.AST) -> set[int]:
    """The ids of string constants that stand alone as a statement (docstrings of every kind)."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    }


def named_stores(root: Path, names: set[str]) -> list[tuple[str, int, str]]:
    """Each string constant in code under ``root/wd_chaos`` equal to one of ``names``, as (file
    relative to ``root``, line, literal), docstrings left out."""
    found: list[tuple[str, int, str]] = []
    for path in sorted((root / "wd_chaos").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        skip = _bare_strings(tree)
        where = path.relative_to(root).as_posix()
        for node in ast.walk(tree):
            literal = isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
            if literal and node.value in names:
                found.append((where, node.lineno, node.value))
    return sorted(found)


def test_the_harness_names_no_store() -> None:
    names = store_names()
    assert {"sqlite", "memory"} <= names, f"the built-in kits are not installed here: {sorted(names)}"
    found = named_stores(SRC, names)
    unexplained = [f"{file}:{line}: {value!r}" for file, line, value in found if (file, value) not in ALLOWED]
    assert not unexplained, (
        "store names written in the harness (ask the kit registry, or add to ALLOWED with why):\n"
        + "\n".join(unexplained)
    )
    stale = sorted(set(ALLOWED) - {(file, value) for file, _, value in found})
    assert not stale, f"ALLOWED entries no longer needed (remove them): {stale}"


def test_the_check_sees_a_store_name_in_code_and_not_in_a_docstring(tmp_path: Path) -> None:
    """The check is not vacuous: a literal in code is found wherever it stands, the same word in
    a docstring or an attribute docstring is not, and neither is a longer string that contains it."""
    (tmp_path / "wd_chaos" / "faults").mkdir(parents=True)
    (tmp_path / "wd_chaos" / "faults" / "step.py").write_text(
        '"""A fault that steps the postgres server\'s clock."""\n'
        "\n"
        "def f(kind: str) -> bool:\n"
        '    """Whether ``kind`` is postgres."""\n'
        '    return kind != "postgres"\n'
        "\n"
        'STORE = "memory"\n'
        '"""memory"""\n'
        'CHOICES = ["memory", "sqlite"]\n'
        'PREFIX = f"{STORE}-postgres" + "postgres-like"\n'
        'USER = dict(user="postgres")\n'
    )
    found = named_stores(tmp_path, {"postgres", "memory", "sqlite"})
    assert found == [
        ("wd_chaos/faults/step.py", 5, "postgres"),
        ("wd_chaos/faults/step.py", 7, "memory"),
        ("wd_chaos/faults/step.py", 9, "memory"),
        ("wd_chaos/faults/step.py", 9, "sqlite"),
        ("wd_chaos/faults/step.py", 11, "postgres"),
    ], found
