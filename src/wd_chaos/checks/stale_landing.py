"""The ``stale-landing`` checker: no superseded pass's write becomes visible after a newer claim.

``fencing`` judges a write invoked after a newer claim had completed. A write already in flight
when the claim commits is concurrent with it, so the clients' real-time order cannot refuse it;
but the contract still says it must not land after that claim, and what readers saw can show that
it did: a load begun after the newer claim completed that does not hold the write's key, while the
write was acknowledged (as won) only later, proves the write committed after the claim. A store
whose fence reads the claim without locking it (from a snapshot) lets exactly that through.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ..history import Op
from ..rundir import FinalState
from .core import Operation, Verdict, checker, operations


@checker("stale-landing")
def stale_landing(ops: list[Op], final: FinalState) -> Verdict:
    """No won record or transact of token t is missing from a load that began after a claim with a
    token above t completed and before the write was acknowledged."""
    all_ops = operations(ops)
    claims: dict[str, list[Operation]] = defaultdict(list)
    loads: dict[str, list[Operation]] = defaultdict(list)
    writes: list[Operation] = []
    for o in all_ops:
        if not o.ok or o.workflow is None:
            continue
        if o.f == "claim" and o.token is not None:
            claims[o.workflow].append(o)
        elif o.f in ("load", "history") and o.got("keys") is not None:
            loads[o.workflow].append(o)
        elif o.f in ("record", "transact") and o.got("won") and o.token is not None:
            writes.append(o)
    bad: list[dict[str, Any]] = []
    judged = 0
    for w in writes:
        wf, token = str(w.workflow), int(w.token or 0)
        newer = [c for c in claims.get(wf, []) if (c.token or 0) > token]
        if not newer:
            continue
        judged += 1
        first = min(newer, key=lambda c: c.end)
        key = str(w.invoke.get("key"))
        for load in loads.get(wf, []):
            if first.end < load.start < w.end and key not in (load.got("keys") or []):
                bad.append(
                    {
                        "workflow": wf,
                        "key": key,
                        "ops": [
                            w.brief(f"write with token {token} acknowledged as won"),
                            first.brief(f"claim with token {first.token} had completed"),
                            load.brief("load begun after that claim, without the write's key"),
                        ],
                        "why": "a superseded pass's write landed after a newer claim had completed",
                    }
                )
                break
    counts = {"writes with a newer claim": judged, "loads": sum(len(v) for v in loads.values())}
    if bad:
        return Verdict("stale-landing", False, f"{len(bad)} write(s) landed after a newer claim", bad, counts)
    return Verdict("stale-landing", True, f"{judged} writes outranked later; none landed after", [], counts)
