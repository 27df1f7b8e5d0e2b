"""Put one generated mutant in place in this process: patch one statement constant or one script.

A generated mutant travels as JSON in ``WD_MUTANT_EDIT`` so every process of a check meets it: the
pytest session (``-p wd_chaos.mutate.plugin``), a worker a test starts (``install_from_env`` in
``wd_chaos.mutants``), and every process of a wd-chaos run (``mutation.catalogue.mutant_wrap``,
which it opens its store with). ``wd_chaos.mutate`` derives the edits; this module, below every
process that meets one, applies them.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from dataclasses import asdict, dataclass
from functools import _lru_cache_wrapper

EDIT_ENV = "WD_MUTANT_EDIT"
"""Holds a ``Spec`` as JSON while a check runs on a generated mutant."""

LUA_PREFIX = "lua:"
"""A target naming a script file of a store's scripts package (``lua:claim``), not a statement
constant."""


@dataclass(frozen=True)
class Edit:
    """Replace ``old`` at ``start`` with ``new``; ``operator`` names the rule that made it."""

    operator: str
    start: int
    old: str
    new: str

    def apply(self, text: str) -> str:
        """``text`` with this edit made. Raises ``ValueError`` when ``text`` no longer holds ``old``
        at ``start`` (the statement changed since the edit was derived)."""
        if text[self.start : self.start + len(self.old)] != self.old:
            found = text[self.start : self.start + len(self.old)]
            raise ValueError(f"edit {self.operator}: expected {self.old!r} at {self.start}, found {found!r}")
        return text[: self.start] + self.new + text[self.start + len(self.old) :]


@dataclass(frozen=True)
class Spec:
    """One generated mutant: ``target`` is ``module:CONSTANT`` (a statement constant) or ``lua:NAME``
    (a script file of the store's scripts package), and ``edit`` the change to its text. For a
    script, ``reader`` is the ``module:function`` the store reads its scripts through (the kit's
    ``MutatePlan.script_reader``); it is not part of the id."""

    id: str
    target: str
    operator: str
    start: int
    old: str
    new: str
    reader: str = ""

    @property
    def edit(self) -> Edit:
        """The change to the target's text."""
        return Edit(self.operator, self.start, self.old, self.new)

    def to_json(self) -> str:
        """This spec as the JSON ``WD_MUTANT_EDIT`` carries."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Spec:
        """The spec ``text`` holds; ``ValueError`` naming what is missing when it is malformed."""
        try:
            data = json.loads(text)
            found = {k: data[k] for k in ("id", "target", "operator", "start", "old", "new")}
            return cls(**found, reader=str(data.get("reader", "")))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(
                f"{EDIT_ENV} must be a JSON object with id, target, operator, start, old, new ({exc})"
            ) from exc


_applied: str | None = None


def apply(spec: Spec) -> None:
    """Patch this process so the store runs the mutated text from now on. Applying the same spec
    again changes nothing; a second, different spec in one process is refused."""
    global _applied
    if _applied == spec.id:
        return
    if _applied is not None:
        raise RuntimeError(f"mutant {_applied} is already applied in this process; cannot add {spec.id}")
    if spec.target.startswith(LUA_PREFIX):
        _patch_script(spec.reader, spec.target.removeprefix(LUA_PREFIX), spec.edit)
    else:
        module_name, _, constant = spec.target.partition(":")
        _patch_constant(module_name, constant, spec.edit)
    _applied = spec.id


def apply_from_env() -> None:
    """Apply the spec ``WD_MUTANT_EDIT`` holds, if any (idempotent, cheap when unset)."""
    text = os.environ.get(EDIT_ENV)
    if text:
        apply(Spec.from_json(text))


def _patch_constant(module_name: str, constant: str, edit: Edit) -> None:
    module = importlib.import_module(module_name)
    old = getattr(module, constant, None)
    if not isinstance(old, str):
        raise ValueError(f"{module_name}.{constant} is not a string constant; cannot mutate it")
    new = edit.apply(old)
    # the module's name, and every alias of the same object: a class attribute (CLAIM = CLAIM)
    # or another module's `from module import CONSTANT`
    for loaded in list(sys.modules.values()):
        names = getattr(loaded, "__dict__", None)
        if not isinstance(names, dict):
            continue
        for attr, value in list(names.items()):
            if value is old:
                setattr(loaded, attr, new)
            elif isinstance(value, type) and value.__dict__.get(constant) is old:
                setattr(value, constant, new)


def _patch_script(reader: str, name: str, edit: Edit) -> None:
    """Put the edited text of script ``name`` in place of the one the store's ``reader``
    (``module:function``, called with a script's name) returns, and empty every ``functools``
    cache in that module, so a source assembled from the script before now is assembled again."""
    module_name, colon, function = reader.partition(":")
    if not colon or not module_name or not function:
        raise ValueError(
            f"script mutant {name!r} names no script reader ({reader!r}): the store's kit must name "
            "the module:function it reads its scripts through as MutatePlan.script_reader"
        )
    module = importlib.import_module(module_name)
    original = getattr(module, function, None)
    if not callable(original):
        raise ValueError(f"{module_name}.{function} is not a function; cannot read script {name!r}")
    changed = edit.apply(original(name))

    def mutated(file: str) -> str:
        return changed if file == name else original(file)

    setattr(module, function, mutated)
    for value in list(vars(module).values()):
        if isinstance(value, _lru_cache_wrapper):
            value.cache_clear()
