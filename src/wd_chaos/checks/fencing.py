"""fencing: no stale pass's write lands, tokens grow in real-time order, and no two passes hold
one workflow at once (the exclusive-claim and budget rules)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ..history import Op
from .core import (
    FENCED_WRITES,
    RENEWING,
    SLACK_NS,
    Operation,
    Verdict,
    _Breach,
    _inversions,
    _Prefix,
    _store_steps,
    _unjudged,
    checker,
    operations,
)


@checker("fencing")
def fencing(ops: list[Op], final: dict[str, Any]) -> Verdict:
    """No write (record, transact, renew) by a pass lands once a claim with a higher token has
    completed; claim tokens are unique and grow in real-time order; a write refused as Fenced had a
    newer claim to be refused by (or a discard of its workflow, or a sweep, began before it ended)."""
    operations_ = operations(ops)
    claims: dict[str, list[Operation]] = defaultdict(list)
    maybe_claims: dict[str, list[Operation]] = defaultdict(list)
    for o in operations_:
        if o.f == "claim" and o.workflow is not None:
            if o.ok:
                claims[o.workflow].append(o)
            elif not o.determinate:
                maybe_claims[o.workflow].append(o)
    bad: list[dict[str, Any]] = []
    for _wf, cs in claims.items():
        seen: dict[int, Operation] = {}
        for c in cs:
            t = c.token
            if t is None:
                continue
            if t in seen:
                bad += [
                    seen[t].brief("same token issued twice"),
                    c.brief("same token issued twice"),
                ]
            seen[t] = c
        for a, b in _inversions([(c.token or 0, c) for c in cs]):
            bad += [a.brief("earlier claim"), b.brief("later claim got a token not above it")]
    by_end = {wf: _Prefix([(c.end, c.token or 0, c) for c in cs]) for wf, cs in claims.items()}
    by_start = {wf: _Prefix([(c.start, c.token or 0, c) for c in cs]) for wf, cs in claims.items()}
    first_maybe: dict[str, float] = {wf: min(c.start for c in cs) for wf, cs in maybe_claims.items()}
    # A sweep (of the whole store) or a discard (of one workflow) also raises or removes a fence: a
    # pass whose claim row it forgot is refused as Fenced with no newer claim behind it.
    forgets = [o.start for o in operations_ if o.f == "sweep"]
    first_forget = min(forgets, default=float("inf"))
    for o in operations_:
        if o.f == "discard" and o.workflow is not None:
            first_maybe[o.workflow] = min(first_maybe.get(o.workflow, float("inf")), o.start)
    writes = refused = landed = 0
    for w in operations_:
        if w.f not in FENCED_WRITES or w.workflow is None or w.token is None:
            continue
        writes += 1
        if w.landed:
            landed += 1
            done = by_end[w.workflow].highest_before(w.start) if w.workflow in by_end else None
            if done is not None and done[0] > w.token:
                bad += [
                    w.brief(f"write with superseded token {w.token} was accepted"),
                    done[1].brief(f"claim with token {done[0]} had completed before it"),
                ]
        elif w.outcome == "fenced":
            refused += 1
            began = by_start[w.workflow].highest_before(w.end) if w.workflow in by_start else None
            newer = began is not None and began[0] > w.token
            unsure = min(first_maybe.get(w.workflow, float("inf")), first_forget) < w.end
            if not newer and not unsure:
                bad.append(w.brief("refused as Fenced, but no newer claim was invoked before it"))
    steps = _store_steps(ops, final, leases=True)
    from ..faults.clock_step import lease_steps

    # a step this run made itself, of a known size and moment, on the clock the leases run on:
    # the lapse is the step's doing, and the fence (not the lease) is what safety rests on
    injected = lease_steps(ops, final)
    explained: list[dict[str, Any]] = []
    caused: list[dict[str, Any]] = []
    for breach in _exclusive(operations_, claims) + _budget_ends(operations_, claims, maybe_claims):
        if injected and breach.stepped(injected):
            caused.extend(breach.evidence)
        else:
            (explained if breach.stepped(steps) else bad).extend(breach.evidence)
    counts = {
        "writes": writes,
        "accepted": landed,
        "refused_fenced": refused,
        "claims": sum(len(c) for c in claims.values()),
    }
    if caused:
        counts["lease breaches caused by an injected clock step"] = len(caused) // 2
    if bad:
        return Verdict("fencing", False, f"{len(bad) // 2 or 1} fencing violation(s)", bad, counts)
    if explained:
        return _unjudged("fencing", f"{len(explained) // 2} lease breach(es)", explained, steps, counts)
    stepped = f"; {len(caused) // 2} lease(s) lapsed early by an injected clock step" if caused else ""
    return Verdict("fencing", True, f"{refused} stale write(s) refused, none accepted{stepped}", [], counts)


def _exclusive(all_ops: list[Operation], claims: dict[str, list[Operation]]) -> list[_Breach]:
    """A claim granted while another pass was provably alive: that pass had a write accepted
    (a renewal) late enough that its liveness window, measured from when the write was invoked,
    still covered the moment the new claim completed, within its budget, and no release of it had
    been invoked by then.
    Needs the claim's ``alive`` and ``budget`` in the history; older histories skip this."""
    bad: list[_Breach] = []
    passes: dict[tuple[str, int], list[Operation]] = defaultdict(list)
    for o in all_ops:
        if o.workflow is not None and o.token is not None:
            passes[(o.workflow, o.token)].append(o)
    for wf, cs in claims.items():
        for a in cs:
            alive = a.invoke.get("alive")
            budget = a.invoke.get("budget")
            if alive is None or budget is None or a.token is None:
                continue
            mine = passes.get((wf, a.token), [])
            released = min((o.start for o in mine if o.f == "release"), default=float("inf"))
            held_until = a.start + float(budget) * 1e9
            for b in cs:
                # a claim still in flight when the release was invoked may have been decided
                # after it (SQLite queues writers; Postgres waits on the row): no proof of a breach
                if b.token is None or b.token <= a.token or b.end > released:
                    continue
                for x in mine:
                    if not (x.landed and x.f in RENEWING and x.end <= b.end):
                        continue
                    covered = min(x.start + float(alive) * 1e9, held_until)
                    if b.end + SLACK_NS < covered:
                        evidence = [
                            b.brief(f"claimed while token {a.token} was alive"),
                            x.brief(f"renewed token {a.token}'s liveness ({alive}s) from before this point"),
                        ]
                        budget_end = ((a.start, b.end), held_until - b.end)
                        bad.append(_Breach(evidence, (x.start, b.end), covered - b.end, True, budget_end))
                        break
    return bad


def _budget_ends(
    all_ops: list[Operation],
    claims: dict[str, list[Operation]],
    maybe_claims: dict[str, list[Operation]],
) -> list[_Breach]:
    """A claim refused as Contended although the newest pass's budget had run out before the
    claim began: renewals must never carry a pass past its budget. Needs ``budget`` in the claim's
    history line; a concurrent or indeterminate claim that might be the holder skips it."""
    bad: list[_Breach] = []
    for c in all_ops:
        if c.f != "claim" or c.outcome != "contended" or c.workflow is None:
            continue
        before = [a for a in claims.get(c.workflow, []) if a.end < c.start]
        if not before:
            continue
        holder = max(before, key=lambda a: a.token or 0)
        budget = holder.invoke.get("budget")
        overlapping = [
            b for b in claims.get(c.workflow, []) + maybe_claims.get(c.workflow, [])
            if b is not holder and b.start < c.end and b.end > holder.start
            and (b.token or 0) >= (holder.token or 0)
        ]  # fmt: skip
        if budget is None or overlapping:
            continue
        ends = holder.end + float(budget) * 1e9
        if c.start > ends + SLACK_NS:
            evidence = [
                c.brief(f"refused as Contended {budget}s past token {holder.token}'s budget"),
                holder.brief("the newest claim, whose budget had run out"),
            ]
            bad.append(_Breach(evidence, (holder.start, c.end), c.start - ends, False))
    return bad
