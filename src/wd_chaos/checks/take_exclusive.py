"""take-exclusive: a storm's deliveries went to one taker at a time."""

from __future__ import annotations

import itertools
from collections import defaultdict
from typing import Any

from ..history import Op
from ..rundir import FinalState
from .core import (
    Operation,
    Verdict,
    _Breach,
    _Prefix,
    _store_steps,
    _unjudged,
    checker,
    operations,
)


@checker("take-exclusive")
def take_exclusive(ops: list[Op], final: FinalState) -> Verdict:
    """Two takes never hand out the same workflow while it is hidden: a second take of a workflow
    within 80% of the visibility of the first, with no wake_at, schedule, arrive or deliver of it
    in between, is a double delivery."""
    all_ops = operations(ops)
    takes: dict[str, list[Operation]] = defaultdict(list)
    opens: dict[str, list[Operation]] = defaultdict(list)
    for o in all_ops:
        if o.f == "take" and o.ok and o.got("workflow"):
            takes[str(o.got("workflow"))].append(o)
        elif o.f in ("wake_at", "schedule", "arrive", "deliver", "append", "supply") and o.workflow:
            opens[o.workflow].append(o)
    bad: list[dict[str, Any]] = []
    steps = _store_steps(ops, final)
    explained: list[dict[str, Any]] = []
    count = 0
    for wf, group in takes.items():
        group.sort(key=lambda o: o.end)
        count += len(group)
        reopened = _Prefix([(o.start, o.end, o) for o in opens.get(wf, [])])
        for a, b in itertools.pairwise(group):
            visibility = float(a.invoke.get("visibility", 0)) * 1e9
            hidden = 0.8 * visibility
            hit = reopened.highest_before(b.end)
            if b.start - a.end < hidden and (hit is None or hit[0] <= a.start):
                breach = _Breach(
                    [a.brief("took it"), b.brief("took it again while hidden")],
                    (a.start, b.end),
                    visibility - (b.end - a.start),  # the widest the gap can have been
                    ahead=True,
                )
                (explained if breach.stepped(steps) else bad).extend(breach.evidence)
    counts = {"takes": count}
    if bad:
        return Verdict("take-exclusive", False, f"{len(bad) // 2} double deliveries", bad, counts)
    if explained:
        return _unjudged(
            "take-exclusive", f"{len(explained) // 2} double deliveries", explained, steps, counts
        )
    return Verdict("take-exclusive", True, f"{count} takes, none doubled", [], counts)
