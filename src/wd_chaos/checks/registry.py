"""Where checkers are found: every ``Check`` (see ``wd_chaos.checks.core.checker``) defined in a
module of this package, by its name. Adding a checker is adding a module; nothing here changes."""

from __future__ import annotations

import functools
import importlib
import pkgutil
import traceback
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .core import UNKNOWN, Check, Checker, CheckFn, Verdict

if TYPE_CHECKING:
    from ..history import Op

PACKAGES = ("wd_chaos.checks", "wd_chaos.faults")
"""The packages whose modules hold checks: the checkers, and each fault kind's bite checks."""


@functools.cache
def _found() -> tuple[dict[str, Check], dict[str, Check]]:
    checks: dict[str, Check] = {}
    bites: dict[str, Check] = {}
    for package in PACKAGES:
        path = importlib.import_module(package).__path__
        for info in sorted(pkgutil.iter_modules(path), key=lambda i: i.name):
            module = importlib.import_module(f"{package}.{info.name}")
            for value in vars(module).values():
                if not isinstance(value, Check):
                    continue
                table = bites if value.bite else checks
                other = table.setdefault(value.name, value)
                if other is not value:
                    raise RuntimeError(
                        f"two checks are named {value.name!r}: {other.__module__} and {module.__name__}; "
                        "rename one (scenarios and mutant killers name checks)"
                    )
    return checks, bites


def checkers() -> dict[str, Check]:
    """Every checker by name (what a scenario's ``checks`` may list). The same dict each call."""
    return _found()[0]


def bites() -> dict[str, Check]:
    """Every bite check by name (what a scenario's ``bite`` may be). The same dict each call."""
    return _found()[1]


def bite(kind: str) -> Checker:
    """The check that the scenario's fault touched something: a run where it did not proves
    nothing either way, so that verdict is unknown (never invalid). ``KeyError`` for a name no
    module defines."""
    return bites()[kind]


def run_checker(name: str, fn: CheckFn, ops: list[Op], final: dict[str, Any]) -> Verdict:
    """Run one checker; a crash is ``unknown`` with the traceback, never valid."""
    try:
        verdict: Verdict = fn(ops, final)
    except Exception:
        return Verdict(name, UNKNOWN, "the checker crashed", [{"traceback": traceback.format_exc()}])
    verdict.name = name
    return verdict


def check(
    ops: list[Op],
    final: dict[str, Any],
    checks: Iterable[str],
    bite_kind: str,
    coverage: Iterable[str] = (),
) -> list[Verdict]:
    """Run the named checkers and the bite check, reading the history's wall-clock steps once for
    all of them (into ``final["wall_clock_steps"]`` unless the caller already did); and, when the
    scenario names coverage windows, the ``coverage`` verdict (see ``wd_chaos.checks.coverage``)."""
    from .. import wallclock

    if "wall_clock_steps" not in final:
        final = {**final, "wall_clock_steps": wallclock.steps(ops)}
    found = checkers()
    out = [run_checker(name, found[name], ops, final) for name in checks]
    out.append(run_checker(f"bite: {bite_kind}", bite(bite_kind), ops, final))
    windows = list(coverage)
    if windows:
        from .coverage import coverage as reached

        out.append(run_checker("coverage", lambda o, _f: reached(o, windows), ops, final))
    return out
