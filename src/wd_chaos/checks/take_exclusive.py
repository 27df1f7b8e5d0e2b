"""take-exclusive (core): no workflow is held by two live takes at once."""

from __future__ import annotations

import itertools
from typing import Any

from ..history import Op
from ..rundir import FinalState
from .core import Verdict, _Breach, _unjudged, checker, operations
from .queue_calls import HIDDEN_SHARE, Queue, final_key, queue_steps, sort_breach, visibility_ns
from .takeover import Takeovers


@checker("take-exclusive")
def take_exclusive(ops: list[Op], final: FinalState) -> Verdict:
    """Two takes never hand out the same workflow while it is hidden: a second take of a workflow
    that completed within 80% of the visibility of the first (measured from the first's
    completion), with no wakeup (schedule, arrive, deliver) of it and no answer carrying the first
    take's receipt in between (from the earlier of the two calls' starts: calls that overlap may
    have run in either order), is a double delivery. A stale answer
    (another take's receipt) reopens nothing, so it excuses nothing. Two takes handed the same
    receipt are a double delivery too (a receipt identifies one take), except where the final state
    says the transport itself hands a delivery out twice (``redelivers``: the simulator's wire). A
    re-take that a clock step the scenario made accounts for is excused (the queue's clock jumped
    past the visibility); one that only a step of this machine's clock accounts for is unknown.
    With fast failover a re-take after a fault struck the first taker's process, or ended the
    server's sessions, inside the window is the documented trade (``Takeovers``), counted apart."""
    q = Queue.of(operations(ops))
    takeovers = Takeovers.of(ops, final)
    bad: list[dict[str, Any]] = []
    steps = queue_steps(ops, final)
    explained: list[dict[str, Any]] = []
    count = excused = taken_over = 0
    redelivers = bool(final_key(final, "redelivers"))
    for wf, group in q.takes.items():
        count += len(group)
        if redelivers:  # a receipt seen before is the wire's copy of that take: the store took nothing
            seen: set[object] = set()
            group = [t for t in group if t.got("receipt") is None or _first(seen, t.got("receipt"))]
        for a, b in itertools.pairwise(group):
            same = a.got("receipt") is not None and a.got("receipt") == b.got("receipt")
            if same and redelivers:
                continue
            visibility = visibility_ns(a)
            # judged from the second take's end: a take that ran long (across a restart, on a
            # loaded machine) may have read the queue at any moment of its call
            if b.end - a.end >= HIDDEN_SHARE * visibility:
                continue
            # two takes whose calls overlap may have run in either order, so a wakeup from the
            # first one's start on may have come between them
            if q.reopened(wf, a, min(a.start, b.start), b.end) is not None:
                continue
            if takeovers.excuses(a.invoke.get("pid"), a.start, b.end):
                taken_over += 1
                continue
            why = "took it again while hidden" + (", with the same receipt" if same else "")
            breach = _Breach(
                [a.brief("took it"), b.brief(why)],
                (a.start, b.end),
                visibility - (b.end - a.start),  # the widest the gap can have been
                ahead=True,
            )
            where = sort_breach(breach, steps)
            if where == "excused":
                excused += 1
            else:
                (explained if where == "explained" else bad).extend(breach.evidence)
    counts = {"takes": count, "after an injected clock step": excused}
    if taken_over:
        counts["taken over from a faulted holder (fast failover)"] = taken_over
    if bad:
        return Verdict("take-exclusive", False, f"{len(bad) // 2} double deliveries", bad, counts)
    if explained:
        return _unjudged(
            "take-exclusive", f"{len(explained) // 2} double deliveries", explained, steps, counts
        )
    also = (
        f" ({excused} taken again after a clock step the scenario made ended a visibility)" if excused else ""
    )
    if taken_over:
        also += f"; {taken_over} taken over from a faulted holder (fast failover)"
    return Verdict("take-exclusive", True, f"{count} takes, none doubled{also}", [], counts)


def _first(seen: set[object], receipt: object) -> bool:
    """Whether ``receipt`` is new to ``seen`` (and note it)."""
    if receipt in seen:
        return False
    seen.add(receipt)
    return True
