"""The mutant catalogue as every process of a run loads it, below the stores it breaks and the
processes that open them: the mutants each installed kit names (``load``), a catalogue entry found
by name for a store (``find_mutant``), and the wrap a process opens its store with
(``mutant_wrap``). Checking that each mutant's killers exist needs the scenarios and the simulator,
so it stays above them in ``wd_chaos.mutants``, which re-exports what is here."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from without_durability.testing.mutants import Mutant

from .patch import apply_from_env


def modules_from_env() -> list[str]:
    """The extra catalogue modules ``WD_MUTANT_MODULES`` names (comma-separated)."""
    return [m for m in os.environ.get("WD_MUTANT_MODULES", "").split(",") if m]


class CatalogueError(ValueError):
    """A mutant module that cannot be loaded, a repeated name, or a killer that names nothing; the
    message names the mutant, the killer and what was looked for."""


def _import_mutants(path: str, optional: bool) -> list[Mutant]:
    try:
        module = importlib.import_module(path)
    except ModuleNotFoundError as exc:
        # a kit's mutants need its driver; a kit whose driver is missing contributes none
        if optional and exc.name and not path.startswith(exc.name) and exc.name != path:
            return []
        raise CatalogueError(f"mutant module {path!r} cannot be imported: {exc}") from exc
    mutants = getattr(module, "MUTANTS", None)
    if not isinstance(mutants, list):
        raise CatalogueError(f"mutant module {path!r} has no MUTANTS list")
    return mutants


def load(modules: Iterable[str] = ()) -> list[Mutant]:
    """Every mutant: those each installed store kit names (``StoreKit.mutant_modules``; a kit whose
    driver is not installed contributes none), then those in ``modules`` (each a module with a
    ``MUTANTS`` list), their names unique. Their killers are not looked for here: that is
``wd_chaos.mutants.catalogue``'s, above the scenarios it reads."""
    from without_durability.testing.kit import kits

    paths: dict[str, bool] = {}
    for kit in kits().values():
        for path in kit.mutant_modules:
            paths.setdefault(path, True)
    for path in modules:
        paths[path] = False
    found: list[Mutant] = []
    for path, optional in paths.items():
        found.extend(_import_mutants(path, optional))
    names = [m.name for m in found]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise CatalogueError(f"mutant names must be unique; repeated: {duplicated}")
    return found


def find_mutant(name: str, store: str) -> Any:
    """The catalogue entry ``name`` (every installed kit's mutants, plus the modules
    ``WD_MUTANT_MODULES`` names), checked to break ``store`` (a kit name or alias)."""
    from without_durability.testing.kit import resolve

    # A run needs the mutant, not its killers checked (that imports the conformance suite).
    found = {m.name: m for m in load(modules_from_env())}
    if name not in found:
        raise ValueError(f"no mutant {name!r}; the catalogue has {sorted(found)}")
    mutant = found[name]
    kit = resolve(store)
    if mutant.store != kit:
        raise ValueError(f"mutant {name!r} breaks the {mutant.store} store, not {kit}")
    return mutant


def mutant_wrap(spec: Mapping[str, Any]) -> Callable[[Any], Any] | None:
    """What a process of a run opens its store with (``stores.open_store``'s ``wrap``): the wrap of
    the catalogue mutant the store spec names (its ``mutant``, checked to break the spec's store),
    or None. A generated mutant in ``WD_MUTANT_EDIT`` is put in place in this process first."""
    apply_from_env()
    name = spec.get("mutant")
    if not name:
        return None
    # the spec's kit: ``store``, or ``kind`` in runs recorded before kits (as ``stores`` reads it)
    wrap: Callable[[Any], Any] = find_mutant(str(name), str(spec.get("store") or spec.get("kind"))).wrap
    return wrap
