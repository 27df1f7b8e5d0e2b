"""order: a workflow's history is in the order its records were written, and its stamps agree."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

from ..history import Op
from ..rundir import FinalState
from .core import (
    WRITES,
    Operation,
    Verdict,
    _Breach,
    _final_values,
    _inversions,
    _store_steps,
    _unjudged,
    canon,
    checker,
    operations,
)


@checker("order")
def order(ops: list[Op], final: FinalState) -> Verdict:
    """Load order equals history order and follows written_at; appends got distinct keys that sort
    in real-time append order, and every acknowledged append is in the final state with its value;
    a write acknowledged before another began sits before it in load order."""
    bad: list[dict[str, Any]] = []
    steps = _store_steps(ops, final)
    explained: list[dict[str, Any]] = []
    all_ops = operations(ops)
    firsts: dict[tuple[str, str], Operation] = {}
    for o in all_ops:
        if o.ok and o.workflow is not None and ((o.f in WRITES and o.got("won")) or o.f == "append"):
            key = str(o.got("key") if o.f == "append" else o.invoke.get("key"))
            firsts.setdefault((o.workflow, key), o)
    writers = _from_earliest_attempt(firsts, all_ops)
    concurrent_inversions = 0
    for wf, state in final.get("workflows", {}).items():
        hist_keys = [r[0] for r in state.get("history", [])]
        load_keys = list(state.get("load_keys", hist_keys))
        if load_keys != hist_keys:
            bad.append(
                {
                    "workflow": wf,
                    "load": load_keys,
                    "history": hist_keys,
                    "why": "load order and history order differ",
                }
            )
        stamps = [r[2] for r in state.get("history", [])]
        who = [writers.get((wf, k)) for k in hist_keys]
        for j in range(1, len(stamps)):
            # only a write that completed before the later one began proves an order in real
            # time; concurrent writes may be stamped either way round (counted, not failed)
            for i in range(max(0, j - 64), j):
                if stamps[j] >= stamps[i]:
                    continue
                a, b = who[i], who[j]
                if a is not None and b is not None and a.end < b.start:
                    reversal = {
                        "workflow": wf,
                        "keys": [hist_keys[i], hist_keys[j]],
                        "written_at": [stamps[i], stamps[j]],
                        "ops": [a.brief(), b.brief()],
                        "why": "written_at goes backward along the load order between writes "
                        "ordered in real time",
                    }
                    back_ns = (_instant(stamps[i]) - _instant(stamps[j])) * 1e9
                    breach = _Breach([reversal], (a.start, b.end), back_ns, ahead=False)
                    (explained if breach.stepped(steps) else bad).append(reversal)
                else:
                    concurrent_inversions += 1
        inbox = [k for k in hist_keys if k.startswith("inbox/")]
        if inbox != sorted(inbox):
            bad.append({"workflow": wf, "inbox": inbox, "why": "inbox keys out of order in load"})
    appends: dict[str, list[Operation]] = defaultdict(list)
    for o in all_ops:
        if o.f == "append" and o.ok and o.workflow is not None:
            appends[o.workflow].append(o)
    total = 0
    for wf, group in appends.items():
        total += len(group)
        values = _final_values(final, wf)
        owners: dict[str, Operation] = {}
        for o in group:
            key = str(o.got("key"))
            if key in owners:
                bad += [
                    owners[key].brief("append key handed out twice"),
                    o.brief("append key handed out twice"),
                ]
            owners[key] = o
            if key not in values:
                bad.append(o.brief("acknowledged append missing from the final state"))
            elif canon(values[key]) != canon(o.invoke.get("value")):
                bad.append(o.brief(f"final state holds {values[key]!r} under this append's key"))
        for a, b in _inversions([(str(o.got("key")), o) for o in group]):
            bad += [a.brief("appended first"), b.brief("appended later, got a key not above")]
    # real-time order of winning writes against load position
    position = {
        wf: {r[0]: i for i, r in enumerate(s.get("history", []))}
        for wf, s in final.get("workflows", {}).items()
    }
    by_wf: dict[str, list[tuple[str, Any]]] = defaultdict(list)
    for (wf, key), o in writers.items():
        by_wf[wf].append((key, o))
    for wf, items in by_wf.items():
        pos = position.get(wf, {})
        ranked = [(pos[k], o) for k, o in items if k in pos]
        for a, b in _inversions(ranked):
            bad += [
                a.brief("acknowledged first"),
                b.brief("began after it was acknowledged, but loads before it"),
            ]
    counts = {
        "workflows": len(final.get("workflows", {})),
        "appends": total,
        "written_at inversions between concurrent writes": concurrent_inversions,
    }
    if bad:
        return Verdict("order", False, f"{len(bad)} order violation(s)", bad, counts)
    if explained:
        return _unjudged("order", f"{len(explained)} written_at reversal(s)", explained, steps, counts)
    return Verdict("order", True, f"{total} appends and every load in order", [], counts)


class _Landed:
    """A winning write seen from its earliest attempt: a call whose outcome was unknown (a lost
    connection, a server restarting) may have landed the very value a later, acknowledged retry
    then found already stored, so the write could have landed as early as that attempt began.
    Judging the retry's own start instead would call a write ordered after one it preceded."""

    def __init__(self, won: Operation, start: int) -> None:
        self.won = won
        self.start = start
        self.end = won.end

    def brief(self, why: str = "") -> dict[str, Any]:
        out = self.won.brief(why)
        out["earliest attempt"] = self.start
        return out


def _from_earliest_attempt(
    firsts: dict[tuple[str, str], Operation], ops: list[Operation]
) -> dict[tuple[str, str], Any]:
    """``firsts`` with each write whose same key and value an earlier call of unknown outcome tried
    replaced by a ``_Landed`` starting at that call's start."""
    earliest: dict[tuple[str, str], int] = {}
    for o in ops:
        if o.determinate or o.f not in WRITES or o.workflow is None:
            continue
        key = (o.workflow, str(o.invoke.get("key")))
        won = firsts.get(key)
        if won is None or o.f == "append" or o.start >= won.start:
            continue
        if canon(o.invoke.get("value")) != canon(won.invoke.get("value")):
            continue
        earliest[key] = min(o.start, earliest.get(key, o.start))
    return {k: (_Landed(o, earliest[k]) if k in earliest else o) for k, o in firsts.items()}


def _instant(stamp: object) -> float:
    """A stored ``written_at`` (ISO text) as seconds since the epoch."""
    return datetime.fromisoformat(str(stamp)).timestamp()
