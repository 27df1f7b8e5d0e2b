"""liveness: every workflow finished once the faults were healed."""

from __future__ import annotations

from ..history import Op
from ..rundir import FinalState
from .core import (
    UNKNOWN,
    Verdict,
    _final_records,
    checker,
)


@checker("liveness")
def liveness(ops: list[Op], final: FinalState) -> Verdict:
    """Every workflow of the workload finished (holds its ``done`` record) after the final heal."""
    expected = list(final.get("expected_workflows", []))
    if not expected:
        return Verdict("liveness", UNKNOWN, "the final state names no workflows to check")
    stuck = []
    for wf in expected:
        keys = [r[0] for r in _final_records(final, wf)]
        if "done" not in keys:
            stuck.append({"workflow": wf, "records": keys, "why": "not finished after the final heal"})
    counts = {"workflows": len(expected), "finished": len(expected) - len(stuck)}
    if stuck:
        return Verdict(
            "liveness",
            False,
            f"{len(stuck)} of {len(expected)} workflows unfinished",
            stuck,
            counts,
        )
    return Verdict("liveness", True, f"all {len(expected)} workflows finished", [], counts)
