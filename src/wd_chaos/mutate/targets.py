"""What ``wd-chaos mutate`` mutates: a store's statement constants and scripts, and the mutants
derived from them.

A statement is a module-level string constant with an upper-case name that holds SQL and is read
when the store runs (a function refers to it, by name or as an attribute such as ``self.CLAIM``):
a constant read only at import, to build other constants, is left alone, since patching it later
would change nothing. A module may instead name its statements itself with ``WD_STATEMENTS``, a
tuple of constant names: that is how a third-party store exposes its statements to ``mutate``.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import pkgutil
import re
from dataclasses import dataclass
from importlib.resources import files
from types import ModuleType

from ..mutation.patch import LUA_PREFIX, Spec
from .operators import LUA_OPERATORS, SQL_OPERATORS, edits

_SQL = re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE)\b")


@dataclass(frozen=True)
class Target:
    """One statement constant (``module:NAME``) or script (``lua:NAME``) and its text; a script's
    ``reader`` is the ``module:function`` its store reads it through."""

    name: str
    text: str
    reader: str = ""

    @property
    def is_lua(self) -> bool:
        """Whether this is a Lua script (else a SQL statement)."""
        return self.name.startswith(LUA_PREFIX)

    @property
    def short(self) -> str:
        """The constant's or script's own name, without its module."""
        return self.name.rpartition(":")[2]


def _modules(name: str) -> list[ModuleType]:
    """``name`` and, for a package, every module in it."""
    module = importlib.import_module(name)
    found = [module]
    for info in pkgutil.iter_modules(getattr(module, "__path__", [])):
        found.append(importlib.import_module(f"{name}.{info.name}"))
    return found


def _read_at_run_time(modules: list[ModuleType]) -> set[str]:
    """Every name a function body in ``modules`` reads (``NAME`` or ``anything.NAME``)."""
    read: set[str] = set()
    for module in modules:
        try:
            tree = ast.parse(inspect.getsource(module))
        except (OSError, TypeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                for inner in ast.walk(node):
                    if isinstance(inner, ast.Name):
                        read.add(inner.id)
                    elif isinstance(inner, ast.Attribute):
                        read.add(inner.attr)
    return read


def statement_targets(package: str) -> list[Target]:
    """The statement constants of ``package`` (a module or a package), in module and name order."""
    modules = _modules(package)
    read = _read_at_run_time(modules)
    found: list[Target] = []
    seen: set[int] = set()
    for module in modules:
        named = getattr(module, "WD_STATEMENTS", None)
        for attr, value in vars(module).items():
            # a package that re-exports its modules' statements names each once, by its own name
            if not isinstance(value, str) or id(value) in seen:
                continue
            if named is not None:
                chosen = attr in named
            else:
                chosen = attr.lstrip("_").isupper() and bool(_SQL.search(value)) and attr in read
            if chosen:
                seen.add(id(value))
                found.append(Target(f"{module.__name__}:{attr}", value))
    return sorted(found, key=lambda t: t.name)


def script_targets(package: str, reader: str = "") -> list[Target]:
    """The Lua scripts (prelude files included) shipped in ``package``'s ``scripts`` folder, each
    read at run time through ``reader`` (``module:function``; see ``MutatePlan.script_reader``)."""
    folder = files(package) / "scripts"
    names = sorted(p.name.removesuffix(".lua") for p in folder.iterdir() if p.name.endswith(".lua"))
    return [
        Target(f"{LUA_PREFIX}{n}", (folder / f"{n}.lua").read_text(encoding="utf-8"), reader) for n in names
    ]


def _line(text: str, start: int, end: int) -> str:
    a = text.rfind("\n", 0, start) + 1
    b = text.find("\n", end)
    return " ".join(text[a : len(text) if b < 0 else b].split())


def mutants(store: str, targets: list[Target]) -> list[Spec]:
    """Every mutant ``targets`` yield, each with a stable id: the store, the constant or script,
    the operator and a digest of the changed line and the change (plus a counter when one line
    yields the same change twice), so an id survives edits elsewhere in the file."""
    found: list[Spec] = []
    for target in targets:
        seen: dict[str, int] = {}
        for edit in edits(target.text, LUA_OPERATORS if target.is_lua else SQL_OPERATORS):
            line = _line(target.text, edit.start, edit.start + len(edit.old))
            key = f"{target.name}|{edit.operator}|{edit.old}|{edit.new}|{line}"
            count = seen[key] = seen.get(key, -1) + 1
            digest = hashlib.sha1(f"{key}|{count}".encode()).hexdigest()[:8]
            found.append(
                Spec(
                    f"{store}:{target.short}:{edit.operator}:{digest}",
                    target.name,
                    edit.operator,
                    edit.start,
                    edit.old,
                    edit.new,
                    target.reader,
                )
            )
    return found


def describe(spec: Spec, text: str) -> dict[str, str]:
    """The changed line of ``text`` before and after ``spec``'s edit, for a report."""
    edit = spec.edit
    after = edit.apply(text)
    return {
        "before": _line(text, edit.start, edit.start + len(edit.old)),
        "after": _line(after, edit.start, edit.start + len(edit.new)),
    }
