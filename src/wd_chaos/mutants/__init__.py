"""The mutant catalogue: deliberately broken stores, each removing exactly one guarantee.

A harness is evidence only if it says no to a broken store. Each ``Mutant`` names the guarantee it
removes, says how in one line, and lists the checks named for that guarantee (``killers``): conformance
tests by function name, or wd-chaos checkers as ``chaos:<scenario>:<checker>``. ``wd-chaos mutants``
runs every mutant and the real store it derives from through the same checks in one run: a mutant must
fail at least one of its killers, and the real store must pass all of them.

A mutant is a small subclass of a real store class. ``wrap`` swaps the class of the live checkpointer
or scheduler inside a freshly opened ``Durable``, so the mutant shares the real store's connection, pool
or client, and the suite's effect kit and the harness's workers need nothing special.

To add a mutant for your own store: write the subclass next to the others (or in your own module),
append a ``Mutant`` to a list, and pass that module to ``wd-chaos mutants --catalogue module``.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

Wrap = Callable[[Any], Any]


@dataclass(frozen=True)
class Mutant:
    """One deliberately broken store.

    ``store`` is the conformance-registry name of the real store it derives from; ``wrap`` turns a
    fresh ``Durable`` of that store into the mutant (in place or by returning a new one).
    """

    name: str
    store: str
    guarantee: str
    description: str
    killers: tuple[str, ...]
    wrap: Wrap


def swap(part: str, cls: type) -> Wrap:
    """A ``wrap`` that turns the durable's ``part`` ("checkpointer" or "scheduler") into an instance
    of ``cls``, which must subclass that part's class directly: same object, same connection, one
    method broken."""

    def wrap(durable: Any) -> Any:
        target = getattr(durable, part)
        if not isinstance(target, cls.__mro__[1]):
            raise TypeError(f"{cls.__name__} mutates {cls.__mro__[1].__name__}, not {type(target).__name__}")
        target.__class__ = cls
        return durable

    return wrap


BUILT_IN = ("memory", "sqlite", "postgres", "redis")

LEASE_CLOCK_KILLERS = (
    "tests/test_lease_clock.py::test_a_wall_clock_step_forward_does_not_lapse_a_live_claim",
    "tests/test_lease_clock.py::test_a_wall_clock_step_back_neither_frees_nor_keeps_a_pass",
)
"""The checks that catch a process-clock store (Memory, SQLite) measuring leases on the wall clock."""


def catalogue(modules: Iterable[str] = ()) -> list[Mutant]:
    """Every mutant: the built-in ones whose store's driver is importable, then those in ``modules``
    (each a module with a ``MUTANTS`` list)."""
    found: list[Mutant] = []
    for name in BUILT_IN:
        if importlib.util.find_spec(f"{__name__}.{name}") is None:
            continue
        try:
            module = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:  # that store's driver is not installed
            if exc.name and exc.name.startswith(__name__):
                raise
            continue
        found.extend(module.MUTANTS)
    for path in modules:
        found.extend(importlib.import_module(path).MUTANTS)
    names = [m.name for m in found]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise ValueError(f"mutant names must be unique; repeated: {duplicated}")
    return found
