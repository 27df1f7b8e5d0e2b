"""fleet-mixed: a mixed fleet's bite. The fleet is mixed for the store only where one workflow's
passes were claimed by workers of different settings: a row one variant left behind is then read
by the other (a presence id, a lease length), which is what the scenario means to test."""

from __future__ import annotations

import json
from collections import defaultdict
from itertools import pairwise
from typing import Any

from ..history import Op
from ..rundir import FinalState
from .bitten import bit
from .core import Verdict, bite_check, operations


def variants_by_pid(ops: list[Op]) -> dict[int, str]:
    """Each worker process's variant (its start line's ``variant``, as sorted JSON); processes of
    a fleet alike have none."""
    return {
        int(line["pid"]): json.dumps(line["variant"], sort_keys=True)
        for line in ops
        if line["type"] == "info" and line.get("what") == "start" and isinstance(line.get("variant"), dict)
    }


@bite_check("fleet-mixed")
def fleet_mixed(ops: list[Op], final: FinalState) -> Verdict:
    """Bit when some workflow was claimed, one pass after another, by workers of two variants."""
    variants = variants_by_pid(ops)
    by_workflow: dict[str, list[tuple[float, str, Any]]] = defaultdict(list)
    for o in operations(ops):
        pid = o.invoke.get("pid")
        if o.f == "claim" and o.ok and o.workflow is not None and isinstance(pid, int) and pid in variants:
            by_workflow[o.workflow].append((o.start, variants[pid], o))
    hits = []
    for passes in by_workflow.values():
        passes.sort(key=lambda p: p[0])
        for (_, before, _), (_, after, then) in pairwise(passes):
            if before != after:
                hits.append(then.brief(f"claimed by a worker with {after} after one with {before}"))
                break
    return bit("fleet-mixed", hits, len(by_workflow), "workflow(s) passed between variants")
