"""tokens-unique: a fencing token is handed out once per workflow id, ever, and later hands are higher.

The fence is only as good as its tokens: a pass refused nothing if another pass holds the same
token. A store re-mints one when it forgets what it handed out: a sweep that drops the claim row
of a pass still renewing, a claim hash that expires under a short TTL while the tokens (a clock
of their own) ran ahead, a discard or a failover that loses the counter. The workload's claim
storms, sweeps beside overrunning passes and short retention (``wd_chaos.client.clients``) make those
moments; this checker judges every token any claim (a ``claim`` or the claim a ``take_and_claim``
stands for) returned, whatever happened to the workflow in between.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ..history import Op
from ..rundir import FinalState
from .core import UNKNOWN, Operation, Verdict, _inversions, checker, operations

BETWEEN = ("sweep", "discard", "release", "cancel")
"""Calls worth naming when they fall between two claims that handed out one token."""


def _between(
    ops: list[Operation], lines: list[Op], wf: str, start: float, end: float
) -> list[dict[str, Any]]:
    """What happened to ``wf`` (or to the store) between ``start`` and ``end`` (monotonic ns): the
    sweeps, discards, releases and cancels made then, and the faults, so the evidence says what
    the store forgot across."""
    out: list[dict[str, Any]] = []
    for o in ops:
        if o.f in BETWEEN and start <= o.start <= end and o.workflow in (None, wf):
            out.append({"f": o.f, "op": o.invoke.get("op"), "outcome": o.outcome, "invoke_mono": o.start})
    for line in lines:
        if line["type"] == "fault" and start <= line["mono"] <= end:
            out.append({"fault": line.get("fault"), "phase": line.get("phase"), "mono": line["mono"]})
        elif line["type"] == "info" and line.get("what") == "sweep" and start <= line["mono"] <= end:
            out.append({"f": "sweep", "swept": line.get("swept"), "mono": line["mono"]})
    return out[:8]


@checker("tokens-unique")
def tokens_unique(ops: list[Op], final: FinalState) -> Verdict:
    """No token of a workflow id is handed out twice: no two granted claims of one workflow (a
    ``claim``, or the claim of a ``take_and_claim``) returned the same token, whether they
    overlapped or lay on either side of a sweep, an expiry, a discard or a failover. And a claim
    that returned before another claim of the same id began (real time) got a lower token than it.
    The evidence names both claims and what happened to the workflow between them. Unknown when no
    claim returned a token (nothing to judge)."""
    del final
    all_ops = operations(ops)
    claims: dict[str, list[Operation]] = defaultdict(list)
    for o in all_ops:
        if o.f == "claim" and o.ok and o.token is not None and o.workflow is not None:
            claims[o.workflow].append(o)
    bad: list[dict[str, Any]] = []
    dupes = rising = 0
    for wf, cs in claims.items():
        by_token: dict[int, list[Operation]] = defaultdict(list)
        for c in cs:
            by_token[int(c.token or 0)].append(c)
        for token, same in sorted(by_token.items()):
            if len(same) < 2:
                continue
            dupes += 1
            same.sort(key=lambda c: c.start)
            first, later = same[0], same[1:]
            bad.append(
                {
                    "workflow": wf,
                    "token": token,
                    "why": f"token {token} of this workflow was handed out {len(same)} times",
                    "claims": [c.brief() for c in same[:4]],
                    "between": _between(all_ops, ops, wf, first.end, later[0].start),
                }
            )
        for a, b in _inversions([(int(c.token or 0), c) for c in cs]):
            if a.token == b.token:
                continue  # said above
            rising += 1
            bad.append(
                {
                    "workflow": wf,
                    "why": f"a claim that began after one returned token {a.token} got token {b.token}, not higher",
                    "claims": [a.brief("returned first"), b.brief("began after it, got a token no higher")],
                    "between": _between(all_ops, ops, wf, a.end, b.start),
                }
            )
    counts = {
        "claims": sum(len(c) for c in claims.values()),
        "workflows": len(claims),
        "tokens handed out twice": dupes,
        "tokens not rising": rising,
    }
    if bad:
        return Verdict(
            "tokens-unique", False, f"{dupes} token(s) handed out twice, {rising} not rising", bad, counts
        )
    if not claims:
        return Verdict("tokens-unique", UNKNOWN, "no claim returned a token: nothing judged", [], counts)
    return Verdict(
        "tokens-unique",
        True,
        f"{counts['claims']} tokens handed out on {len(claims)} workflows, each once, rising in real time",
        [],
        counts,
    )
