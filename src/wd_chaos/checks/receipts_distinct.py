"""receipts-distinct (core): no two takes of a workflow are handed the same receipt."""

from __future__ import annotations

from collections import Counter
from typing import Any

from ..history import Op
from ..rundir import FinalState
from .core import Verdict, checker, operations
from .queue_calls import Queue, final_key

REDELIVERED = "redelivered_receipts"
"""The final state's key for the receipts a transport handed out twice on its own (the simulator's
wire: a take's reply delivered to a second caller), each as many times as it did so."""


@checker("receipts-distinct")
def receipts_distinct(ops: list[Op], final: FinalState) -> Verdict:
    """Every take that handed out a workflow got a receipt no other take of that workflow got (a
    receipt identifies one take). Two takes with one receipt leave a holder's answer impossible to
    tell from the other's: the first holder's late answer acts on the second's delivery, and no
    checker that matches answers to takes by receipt can see it. A receipt that hides a workflow
    until a time, alone, repeats when two takes' visibilities end at the same instant (a take for
    3 s, a wakeup a second later, a take for 2 s). A receipt the transport itself handed out again
    (``final["redelivered_receipts"]``: the simulator's wire) is excused as often as it says so.
    Takes whose receipt the history does not record (Python's default ``repr``) are not judged."""
    q = Queue.of(operations(ops))
    redelivered = final_key(final, REDELIVERED)
    excused = Counter(str(r) for r in redelivered) if isinstance(redelivered, list) else Counter[str]()
    bad: list[dict[str, Any]] = []
    judged = repeats = 0
    for wf, takes in sorted(q.takes.items()):
        first: dict[str, Any] = {}
        for take in takes:
            receipt = take.got("receipt")
            if receipt is None:
                continue
            judged += 1
            key = str(receipt)
            if key not in first:
                first[key] = take
                continue
            if excused[key] > 0:
                excused[key] -= 1
                continue
            repeats += 1
            bad += [
                first[key].brief(f"took {wf!r}, receipt {key}"),
                take.brief("took it again and was handed the same receipt"),
            ]
    counts = {"takes": judged, "repeated": repeats}
    if bad:
        return Verdict("receipts-distinct", False, f"{repeats} take(s) handed a receipt another take got", bad, counts)
    return Verdict("receipts-distinct", True, f"{judged} takes with receipts, each its own", [], counts)
