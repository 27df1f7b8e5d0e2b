"""The ``written-at`` checker: every workflow's history is stamped in its own order.

The contract makes history order, load order and ``written_at`` order one order. ``order`` fails a
``written_at`` reversal only between writes ordered in real time, since from the clients' side
either stamp would do for two concurrent writes. But every store stamps a record when it takes its
place in the order (the workflow's turn, its write lock, its script), so a reversal even between
concurrent writes means a stamp taken somewhere else: a transact stamped when its transaction began
(before writes that landed while its effect ran) claims a place it never had. This check fails
any reversal along the final history, concurrent or not, unless this machine's wall clock, which
the store stamps by, stepped during the run (then it is unknown, with the steps as evidence).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from typing import Any

from ..history import Op
from ..rundir import FinalState
from .core import Verdict, _store_steps, _unjudged, checker, operations
from .order import _instant


@checker("written-at")
def written_at(ops: list[Op], final: FinalState) -> Verdict:
    """Along each workflow's final history, ``written_at`` never goes backward; and a transact's
    record is stamped no earlier than the end of the effect it ran (as its worker saw it), where
    the store stamps by this machine's clock."""
    bad: list[dict[str, Any]] = []
    writers: dict[tuple[str, str], Any] = {}
    for o in operations(ops):
        if (
            o.ok
            and o.workflow is not None
            and (o.f == "append" or (o.f in ("record", "supply", "transact") and o.got("won")))
        ):
            key = str(o.got("key") if o.f == "append" else o.invoke.get("key"))
            writers.setdefault((o.workflow, key), o)
    records = 0
    for wf, state in final.get("workflows", {}).items():
        rows = list(state.get("history", []))
        records += len(rows)
        for before, after in itertools.pairwise(rows):
            if _instant(after[2]) >= _instant(before[2]):
                continue
            ops_ = [writers.get((wf, str(r[0]))) for r in (before, after)]
            bad.append(
                {
                    "workflow": wf,
                    "keys": [before[0], after[0]],
                    "written_at": [before[2], after[2]],
                    "ops": [o.brief() for o in ops_ if o is not None],
                    "why": "written_at goes backward along the history: the later record is "
                    "stamped before the one ahead of it",
                }
            )
    late = _stamped_before_effect(ops, final)
    bad += late
    counts = {
        "workflows": len(final.get("workflows", {})),
        "records": records,
        "transacts stamped before their effect ended": len(late),
    }
    if bad:
        steps = _store_steps(ops, final)
        if steps:
            return _unjudged("written-at", f"{len(bad)} written_at reversal(s)", bad, steps, counts)
        return Verdict("written-at", False, f"{len(bad)} written_at violation(s)", bad, counts)
    return Verdict("written-at", True, f"{records} records stamped in history order", [], counts)


SLACK_S = 0.05
"""Allowance between a worker's reading of the clock and the store's (one machine's clock)."""


def _stamped_before_effect(ops: list[Op], final: FinalState) -> list[dict[str, Any]]:
    """Won transacts whose record is stamped before their effect (an ``effect`` the same process
    ran for the same workflow, key and token inside the call) had ended: a record lands with its
    commit, after its effect, so such a stamp was taken when the transaction began. Judged only
    where the store stamps by this machine's clock (``store_clock`` local)."""
    if final.get("store_clock") != "local":
        return []
    all_ops = operations(ops)
    effects: dict[tuple[Any, ...], list[Any]] = defaultdict(list)
    for o in all_ops:
        if o.f == "effect" and o.ok:
            effects[(o.invoke.get("pid"), o.workflow, o.invoke.get("key"), o.token)].append(o)
    out = []
    for o in all_ops:
        if o.f != "transact" or not o.ok or not o.got("won") or o.workflow is None:
            continue
        key = str(o.invoke.get("key"))
        inside = [
            e
            for e in effects.get((o.invoke.get("pid"), o.workflow, key, o.token), [])
            if o.start <= e.start and e.end <= o.end and e.complete is not None
        ]
        stamp = {
            str(r[0]): r[2] for r in final.get("workflows", {}).get(o.workflow, {}).get("history", [])
        }.get(key)
        if not inside or stamp is None:
            continue
        ended = max(_instant(e.complete["wall"]) for e in inside if e.complete is not None)
        if _instant(stamp) < ended - SLACK_S:
            out.append(
                {
                    "workflow": o.workflow,
                    "key": key,
                    "written_at": stamp,
                    "effect_ended": max(str(e.complete["wall"]) for e in inside if e.complete is not None),
                    "ops": [o.brief()],
                    "why": "the transact's record is stamped before its effect ended: stamped when "
                    "its transaction began, not when the record landed",
                }
            )
    return out
