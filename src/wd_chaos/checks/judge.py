"""Judging a history: run the named checkers, the fault's bite check and the coverage windows on
one history and final state, each crash an unknown verdict, never a valid one."""

from __future__ import annotations

import traceback
from collections.abc import Iterable, Mapping
from typing import Any

from .. import wallclock
from ..history import Op
from ..rundir import FinalState
from .core import UNKNOWN, CheckFn, Verdict
from .coverage import coverage as reached
from .registry import bite, checkers


def run_checker(name: str, fn: CheckFn, ops: list[Op], final: FinalState) -> Verdict:
    """Run one checker; a crash is ``unknown`` with the traceback, never valid."""
    try:
        verdict: Verdict = fn(ops, final)
    except Exception:
        return Verdict(name, UNKNOWN, "the checker crashed", [{"traceback": traceback.format_exc()}])
    verdict.name = name
    return verdict


def check(
    ops: list[Op],
    final: FinalState | Mapping[str, Any],
    checks: Iterable[str],
    bite_kind: str,
    coverage: Iterable[str] = (),
) -> list[Verdict]:
    """Run the named checkers and the bite check, reading the history's wall-clock steps once for
    all of them (into ``final.wall_clock_steps`` unless the caller already did); and, when the
    scenario names coverage windows, the ``coverage`` verdict (see ``wd_chaos.checks.coverage``)."""
    if not isinstance(final, FinalState):  # a final.json object, as a test writes one
        final = FinalState.from_json(final)
    if final.wall_clock_steps is None and not final.unread:
        final = final.with_steps(wallclock.steps(ops))
    found = checkers()
    out = [run_checker(name, found[name], ops, final) for name in checks]
    out.append(run_checker(f"bite: {bite_kind}", bite(bite_kind), ops, final))
    windows = list(coverage)
    if windows:
        out.append(run_checker("coverage", lambda o, _f: reached(o, windows), ops, final))
    return out
