"""Put one generated mutant in place in this process: patch one statement constant or one script.

A generated mutant travels as JSON in ``WD_MUTANT_EDIT`` so every process of a check meets it: the
pytest session (``-p wd_chaos.mutate.plugin``), a worker a test starts (``install_from_env`` in
``wd_chaos.mutants``), and every process of a wd-chaos run (``open_store``).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from dataclasses import asdict, dataclass
from functools import _lru_cache_wrapper
from typing import Any

from .operators import Edit

EDIT_ENV = "WD_MUTANT_EDIT"
"""Holds a ``Spec`` as JSON while a check runs on a generated mutant."""

LUA_PREFIX = "lua:"
"""A target naming a script file of the Redis store (``lua:claim``), not a statement constant."""


@dataclass(frozen=True)
class Spec:
    """One generated mutant: ``target`` is ``module:CONSTANT`` (a statement constant) or ``lua:NAME``
    (a script file of ``without_durability_redis``), and ``edit`` the change to its text."""

    id: str
    target: str
    operator: str
    start: int
    old: str
    new: str

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
            return cls(**{k: data[k] for k in ("id", "target", "operator", "start", "old", "new")})
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
        _patch_script(spec.target.removeprefix(LUA_PREFIX), spec.edit)
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


def _patch_script(name: str, edit: Edit) -> None:
    from without_durability_redis import _scripts

    original = _scripts._file
    text = original(name)
    changed = edit.apply(text)

    def mutated(file: str) -> str:
        return changed if file == name else original(file)

    _scripts._file = mutated  # type: ignore[assignment]
    source: Any = _scripts.script_source
    if isinstance(source, _lru_cache_wrapper):
        source.cache_clear()
