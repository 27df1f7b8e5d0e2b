"""Where checkers are found: every ``Check`` (see ``wd_chaos.checks.core.checker``) defined in a
module of this package, by its name. Adding a checker is adding a module; nothing here changes."""

from __future__ import annotations

import functools
import importlib
import pkgutil

from .core import Check, Checker

CORE = ("take-exclusive", "receipts-distinct", "stale-answer", "wakeup-stands", "queue-bounded", "pickup")
"""The core checkers: every scenario runs them, whatever its ``checks`` list says (a scenario may add
checkers, never drop one of these). They judge the scheduler, which every run uses (``pickup``: how
long a due workflow waited for a take, and that no take found nothing while one was due;
``receipts-distinct``: that no two takes of a workflow were handed one receipt)."""

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


def with_core(names: list[str]) -> list[str]:
    """``names`` followed by every ``CORE`` checker it leaves out, in ``CORE``'s order."""
    return [*names, *(name for name in CORE if name not in names)]


def bites() -> dict[str, Check]:
    """Every bite check by name (what a scenario's ``bite`` may be). The same dict each call."""
    return _found()[1]


def bite(kind: str) -> Checker:
    """The check that the scenario's fault touched something: a run where it did not proves
    nothing either way, so that verdict is unknown (never invalid). ``KeyError`` for a name no
    module defines."""
    return bites()[kind]
