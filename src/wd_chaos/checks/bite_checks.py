"""The bite checks that belong to no fault kind: a storm's (its load overlapped), and ``none``.
A fault kind's own bite checks live in its module in ``wd_chaos.faults``."""

from __future__ import annotations

from ..history import Op
from ..rundir import FinalState
from .bitten import bit
from .core import Operation, Verdict, bite_check, operations


@bite_check("storm")
def storm(ops: list[Op], final: FinalState) -> Verdict:
    all_ops = [o for o in operations(ops) if o.f in ("take", "append") and o.determinate]
    all_ops.sort(key=lambda o: o.start)
    overlaps = 0
    active: list[Operation] = []
    for o in all_ops:
        active = [a for a in active if a.end > o.start]
        if active:
            overlaps += 1
        active.append(o)
    verdict = bit("storm", [{"overlapping_ops": overlaps}] if overlaps else [], len(all_ops), "storm")
    if overlaps:
        verdict.summary = f"{overlaps} of {len(all_ops)} operations overlapped another"
    return verdict


@bite_check("none")
def none(ops: list[Op], final: FinalState) -> Verdict:
    """For a scenario that injects no fault (a storm judges its own overlap): nothing to bite."""
    return Verdict("bite", True, "this scenario injects no fault")
