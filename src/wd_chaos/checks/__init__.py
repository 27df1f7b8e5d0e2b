"""Checkers: pure functions over a history and the store's final state, one module per concern.

Each returns a ``Verdict``: ``valid`` True, False or ``"unknown"``, a one-line summary, and the
operations that prove it (evidence). A checker that crashes yields unknown, never valid. Operations
whose process died before completing them are indeterminate: they may or may not have happened, so
a checker may use them to explain what it sees but never counts them as failures.

Times: ``mono`` is the system-wide monotonic clock in nanoseconds, comparable across the processes
of one machine; "A completed before B was invoked" is the real-time order the checkers rely on.
A store that decides by this machine's wall clock (``final["store_clock"] == "local"``: record
stamps, queue times, and leases too where ``final["lease_clock"] == "wall"``) cannot keep those
decisions across a step of that clock, so a violation that a wall-clock step seen in the history
(``wallclock``) accounts for makes the verdict unknown, with the step as evidence, never valid.

A bite check says whether the scenario's fault touched anything; one that found no bite is
unknown, never invalid: the fault did not test the store (``not_bitten``), so such a run exits 2
unless a checker found a real violation.

A checker is a function decorated with ``checker(NAME)`` (a bite check: ``bite_check(NAME)``) in
any module of this package; ``registry`` finds it by that name, so a new checker is one new module.
``core`` holds what they share.
"""

from __future__ import annotations

from .core import (
    NOT_TESTED,
    UNKNOWN,
    Check,
    Checker,
    CheckFn,
    Operation,
    Valid,
    Verdict,
    bite_check,
    checker,
    exit_code,
    not_bitten,
    operations,
    overall,
)
from .judge import check, run_checker
from .registry import CORE, bite, bites, checkers, with_core

__all__ = [
    "CORE",
    "NOT_TESTED",
    "UNKNOWN",
    "Check",
    "CheckFn",
    "Checker",
    "Operation",
    "Valid",
    "Verdict",
    "bite",
    "bite_check",
    "bites",
    "check",
    "checker",
    "checkers",
    "exit_code",
    "not_bitten",
    "operations",
    "overall",
    "run_checker",
    "with_core",
]
