"""The ``durability`` checker: every acknowledged write is in the store's final state.

A write is acknowledged when its call returned ok: a ``record``, ``supply`` or ``transact`` (the
key must hold the value the call returned; a transact that won must also have its ledger row), or
an ``append`` (the key the store named must hold the value appended). The final state is read
after the run, from whichever server is then the primary, so a write the old primary
acknowledged and the promoted standby never received is counted as lost, with the operation as
evidence. A write whose outcome the client never learned (a connection cut mid-call, ``unknown``)
was not acknowledged and is not judged. Scheduling is judged by ``liveness`` (a lost wakeup leaves
its workflow unfinished), not here: the final state holds records, not the queue.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ..history import Op
from ..rundir import FinalState
from .core import Verdict, _final_values, canon, checker, operations

JUDGED = ("record", "supply", "transact", "append")


@checker("durability")
def durability(ops: list[Op], final: FinalState) -> Verdict:
    """Count acknowledged writes and those missing from (or changed in) the final state; the
    verdict is invalid when any is lost. ``counts``: ``acknowledged``, ``lost``, and per kind."""
    ledger = {(str(r["workflow"]), str(r["key"])) for r in final.get("ledger", [])}
    values: dict[str, dict[str, Any]] = {}
    acked: Counter[str] = Counter()
    lost: Counter[str] = Counter()
    evidence: list[dict[str, Any]] = []
    for o in operations(ops):
        if o.f not in JUDGED or not o.ok or o.workflow is None:
            continue
        wf = o.workflow
        if o.f == "append":
            key, want = o.got("key"), o.invoke.get("value")
        else:
            key, want = o.invoke.get("key"), o.got("value")
        if key is None:
            continue
        key = str(key)
        acked[o.f] += 1
        held = values.setdefault(wf, _final_values(final, wf))
        why = ""
        if key not in held:
            why = f"acknowledged, but {key!r} is not in the final state"
        elif canon(held[key]) != canon(want):
            why = f"acknowledged as {canon(want)}, but the final state holds {canon(held[key])}"
        elif o.f == "transact" and o.got("won") and (wf, key) not in ledger:
            why = f"transact of {key!r} acknowledged as won, but its ledger row is gone"
        if why:
            lost[o.f] += 1
            evidence.append(o.brief(why))
    counts = {
        "acknowledged": sum(acked.values()),
        "lost": sum(lost.values()),
        **{f"acknowledged_{f}": n for f, n in sorted(acked.items())},
        **{f"lost_{f}": n for f, n in sorted(lost.items())},
    }
    if evidence:
        return Verdict(
            "durability",
            False,
            f"{counts['lost']} of {counts['acknowledged']} acknowledged writes lost",
            evidence,
            counts,
        )
    return Verdict("durability", True, f"0 of {counts['acknowledged']} acknowledged writes lost", [], counts)
