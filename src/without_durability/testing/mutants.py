"""The mutant types a store's own package uses to write its deliberately broken forms.

A ``Mutant`` is one broken store: it names the guarantee it removes, says how in one line, and lists
the checks named for that guarantee (``killers``): conformance tests by function name, a store's own
tests as ``path::test``, or wd-chaos checkers as ``chaos:<scenario>:<checker>``. A store keeps its
mutants in its own package, in a module with a ``MUTANTS`` list that its kit names
(``StoreKit.mutant_modules``); ``wd-chaos mutants`` loads them through the kit and runs each, and
the real store it derives from, through the same checks.

A mutant is a small subclass of a real store class. ``swap`` changes the class of the live
checkpointer or scheduler inside a freshly opened ``Durable``, so the mutant shares the real store's
connection, pool or client. A check that builds its own store meets the mutant too: ``replaced``
puts the mutant class in place of the real one in every loaded module while the check runs.

This module imports nothing of any store or of the harness: the core's testing package is the floor
both stand on.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

Wrap = Callable[[Any], Any]
"""Turns a fresh ``Durable`` of the real store into the mutant (in place, or by returning a new one)."""


@dataclass(frozen=True)
class Mutant:
    """One deliberately broken store.

    ``store`` is the conformance-registry name of the real store it derives from; ``wrap`` turns a
    fresh ``Durable`` of that store into the mutant (in place or by returning a new one). ``name``
    is unique across every installed store's catalogue, and is what ``wd-chaos mutants --mutant``
    and ``WD_MUTANT`` take.
    """

    name: str
    store: str
    guarantee: str
    description: str
    killers: tuple[str, ...]
    wrap: Wrap
    unseen_by_chaos: str = ""
    """Where none of its killers is a chaos checker: why no wd-chaos run observes it (ever, or
    until a workload, nemesis or checker is extended as the text says)."""


class Swap:
    """A ``wrap`` that turns the durable's ``part`` ("checkpointer" or "scheduler") into an instance
    of ``cls``, which must subclass that part's class directly: same object, same connection, one
    method broken. ``cls`` is kept so ``replaced`` can put it in place of the real class."""

    def __init__(self, part: str, cls: type) -> None:
        self.part = part
        self.cls = cls

    def __call__(self, durable: Any) -> Any:
        target = getattr(durable, self.part)
        base = self.cls.__mro__[1]
        if not isinstance(target, base):
            raise TypeError(f"{self.cls.__name__} mutates {base.__name__}, not {type(target).__name__}")
        target.__class__ = self.cls
        return durable


def swap(part: str, cls: type) -> Wrap:
    """A ``Swap`` of ``part`` to ``cls`` (see ``Swap``)."""
    return Swap(part, cls)


def mutant_class(mutant: Mutant) -> type | None:
    """The subclass ``mutant`` swaps in, when its ``wrap`` is (or wraps) a ``Swap``; else None."""
    return mutant.wrap.cls if isinstance(mutant.wrap, Swap) else None


@contextlib.contextmanager
def replaced(mutant: Mutant) -> Iterator[None]:
    """While open, every loaded module's name for the real class (the store's own module, and every
    module that imported it by name, tests included) names the mutant class instead, so a store a
    check builds itself is the mutant too. The mutant's own module keeps the real name (its subclass
    may call the real method through it). Restored on exit."""
    cls = mutant_class(mutant)
    if cls is None:
        yield
        return
    base = cls.__mro__[1]
    changed: list[tuple[Any, str]] = []
    for module in list(sys.modules.values()):
        if module is None or getattr(module, "__name__", None) == cls.__module__:
            continue
        names = getattr(module, "__dict__", {})
        for attr, value in list(names.items()):
            if value is base:
                setattr(module, attr, cls)
                changed.append((module, attr))
    try:
        yield
    finally:
        for module, attr in changed:
            setattr(module, attr, base)
