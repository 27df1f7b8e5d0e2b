"""The mutant catalogue: deliberately broken stores, each removing exactly one guarantee.

A harness is evidence only if it says no to a broken store. Each ``Mutant`` names the guarantee it
removes, says how in one line, and lists the checks named for that guarantee (``killers``): conformance
tests by function name, or wd-chaos checkers as ``chaos:<scenario>:<checker>``. ``wd-chaos mutants``
runs every mutant and the real store it derives from through the same checks in one run: a mutant must
fail at least one of its killers, and the real store must pass all of them.

The types a mutant is written with (``Mutant``, ``Swap``, ``swap``, ``replaced``) live in the core's
``without_durability.testing.mutants``, beside ``MutatePlan``, so a store's package can hold its own
mutants without importing the harness; they are re-exported here. Every process of a wd-chaos run
opens its stores through the spec that names the mutant (``install_from_env`` for a process a check
starts).

The catalogue is the one mutant mechanism: each store's kit names the modules holding its mutants
(``StoreKit.mutant_modules``, each with a ``MUTANTS`` list), and loading the catalogue checks that every
killer a mutant names exists (a conformance test, a test in a file, a scenario and its checker). To add
a mutant for your own store: write the subclass in your store's package, append a ``Mutant`` to its
``MUTANTS`` list and name that module in your kit; ``wd-chaos mutants --catalogue module`` adds a module
for one run (``WD_MUTANT_MODULES``, comma-separated, carries those modules to every process of the run).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import os
from collections.abc import Iterable
from pathlib import Path

from without_durability.testing.mutants import Mutant, Swap, Wrap, mutant_class, replaced, swap

from ..mutation.catalogue import CatalogueError, find_mutant, load, modules_from_env

__all__ = [
    "MUTANT_ENV",
    "CatalogueError",
    "Mutant",
    "Swap",
    "Wrap",
    "catalogue",
    "check_killers",
    "find_mutant",
    "install_from_env",
    "modules_from_env",
    "mutant_class",
    "replaced",
    "swap",
]

MUTANT_ENV = "WD_MUTANT"
"""Set to a mutant's name while a check runs on it, so a process the check starts can meet it too."""

_INSTALLED = contextlib.ExitStack()


def install_from_env() -> None:
    """For a process a check starts (a worker script): put the mutant ``WD_MUTANT`` names in place
    of the real class for this process's whole life, as ``replaced`` does in the check's own process.
    Without ``WD_MUTANT``, nothing changes. A generated mutant (``WD_MUTANT_EDIT``, see
    ``wd_chaos.mutate``) is put in place too."""
    from ..mutation.patch import apply_from_env

    apply_from_env()
    name = os.environ.get(MUTANT_ENV)
    if not name:
        return
    # The gate checked the killers before it started this process; checking them again would
    # import the conformance suite (and Hypothesis), seconds of a short run's workers' start.
    found = {m.name: m for m in load(modules_from_env())}
    if name not in found:
        raise ValueError(f"{MUTANT_ENV}={name!r} names no mutant; the catalogue has {sorted(found)}")
    _INSTALLED.enter_context(replaced(found[name]))


def catalogue(modules: Iterable[str] = (), *, check: bool = True) -> list[Mutant]:
    """Every mutant: those each installed store kit names (``StoreKit.mutant_modules``; a kit whose
    driver is not installed contributes none), then those in ``modules`` (each a module with a
    ``MUTANTS`` list). With ``check``, every killer must exist (``check_killers``)."""
    found = load(modules)
    if check:
        check_killers(found)
    return found


def check_killers(mutants: Iterable[Mutant], *, files_required: bool = False) -> None:
    """Raise ``CatalogueError`` unless every killer names something that exists: a bare test name
    a test of the conformance suite; ``path::test`` a test function in that file (a file missing
    from this folder is an error only with ``files_required``: the gate runs from the project that
    holds it); ``chaos:<scenario>:<checker>`` a scenario that exists and a checker it runs;
    ``sim:<scenario>:<checker>`` the same for a simulation of a store ``wd-chaos sim`` runs."""
    from without_durability.testing import conformance

    from ..scenario import ScenarioError, find

    problems: list[str] = []
    for m in mutants:
        if not m.killers:
            problems.append(f"{m.name}: names no killer")
        for killer in m.killers:
            if killer.startswith("chaos:"):
                parts = killer.split(":")
                if len(parts) != 3:
                    problems.append(f"{m.name}: {killer!r} is not chaos:<scenario>:<checker>")
                    continue
                try:
                    scenario = find(parts[1])
                except ScenarioError as exc:
                    problems.append(f"{m.name}: {killer!r}: {exc}")
                    continue
                if parts[2] not in scenario.checks:
                    problems.append(
                        f"{m.name}: {killer!r}: scenario {parts[1]} runs no checker {parts[2]!r} "
                        f"(it runs {', '.join(scenario.checks)})"
                    )
            elif killer.startswith("sim:"):
                problems.extend(_sim_killer_problems(m, killer))
            elif "::" in killer:
                file, _, test = killer.partition("::")
                why = _missing_test(Path(file), test, files_required)
                if why:
                    problems.append(f"{m.name}: {killer!r}: {why}")
            elif not callable(getattr(conformance, killer, None)):
                problems.append(
                    f"{m.name}: {killer!r} is not a test of the conformance suite "
                    "(without_durability.testing.conformance); name a file's test as path::test"
                )
    if problems:
        raise CatalogueError(
            "the mutant catalogue names killers that do not exist:\n  " + "\n  ".join(problems)
        )


def _sim_killer_problems(m: Mutant, killer: str) -> list[str]:
    """What is wrong with a ``sim:<scenario>:<checker>`` killer: a scenario the simulator runs, a
    checker it judges with, on a store it simulates."""
    from ..scenario import ScenarioError, find
    from ..sim import SIM_CHECKS, SIMULATED, simulated_stores, simulates

    parts = killer.split(":")
    if len(parts) != 3:
        return [f"{m.name}: {killer!r} is not sim:<scenario>:<checker>"]
    if not simulates(m.store):
        return [
            f"{m.name}: {killer!r}: wd-chaos sim runs the stores whose kit provides {SIMULATED!r} "
            f"({', '.join(simulated_stores())}), not {m.store!r}"
        ]
    try:
        scenario = find(parts[1])
    except ScenarioError as exc:
        return [f"{m.name}: {killer!r}: {exc}"]
    judged = (*scenario.checks, *SIM_CHECKS)
    if parts[2] not in judged:
        return [
            f"{m.name}: {killer!r}: a simulation of {parts[1]} judges no {parts[2]!r} ({', '.join(judged)})"
        ]
    return []


@functools.cache
def _tests_in(path: Path) -> frozenset[str]:
    tree = ast.parse(path.read_text(), str(path))
    return frozenset(
        node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    )


def _missing_test(path: Path, test: str, files_required: bool) -> str | None:
    if not path.is_file():
        return f"no file {path} (from {Path.cwd()})" if files_required else None
    if test.split("[")[0] not in _tests_in(path.resolve()):
        return f"{path} defines no test {test!r}"
    return None
