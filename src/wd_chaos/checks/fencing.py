"""fencing: no stale pass's write lands, tokens grow in real-time order, and no two passes hold
one workflow at once (the exclusive-claim and budget rules)."""

from __future__ import annotations

import bisect
from collections import defaultdict
from typing import Any

from ..history import Op
from ..rundir import FinalState
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
from .fault_reads import lease_steps, reboots_by_pid
from .takeover import Takeovers


@checker("fencing")
def fencing(ops: list[Op], final: FinalState) -> Verdict:
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
    # a step this run made itself, of a known size and moment, on the clock the leases run on:
    # the lapse is the step's doing, and the fence (not the lease) is what safety rests on
    injected = lease_steps(ops, final)
    explained: list[dict[str, Any]] = []
    caused: list[dict[str, Any]] = []
    # With fast failover (the store takes a live claim over once the server has ended its holder's
    # session), a claim inside a holder's window is the design when a fault struck the holder's
    # process first (a kill, a partition) or ended the server's sessions inside that window (a
    # restart, a failover, a power cut); one with no such fault is still a breach.
    takeovers = Takeovers.of(ops, final)
    taken_over: list[_Breach] = []
    exclusive: list[_Breach] = []
    # A reboot ends every process and restarts the clock leases run on, so the real-time windows
    # these rules measure say nothing about a pass a reboot ended: its claim row is free at once
    # (the documented rule: written before the restart) or, when the new clock has already run
    # past the row's age on the old one (a second reboot soon after a first), lapses within its
    # alive on the new clock, as a crashed pass's would. Neither a claim taken from such a pass nor
    # a refusal while its row lapses is a breach here; liveness judges that the workflow ran on.
    rebooted = reboots_by_pid(ops)
    ended = 0

    def reboot_ended(window: tuple[float, float], holder_pid: object) -> bool:
        lo, hi = window
        return isinstance(holder_pid, int) and any(lo < at <= hi for at in rebooted.get(holder_pid, ()))

    for breach, holder_pid in _exclusive(operations_, claims):
        if reboot_ended(breach.window, holder_pid):
            ended += 1
            continue
        (taken_over if takeovers.excuses(holder_pid, *breach.window) else exclusive).append(breach)
    budget_ends = []
    for breach in _budget_ends(operations_, claims, maybe_claims):
        if reboot_ended(breach.window, breach.evidence[1].get("pid")):
            ended += 1
        else:
            budget_ends.append(breach)
    for breach in exclusive + budget_ends:
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
    if taken_over:
        counts["live claims taken over from a faulted holder (fast failover)"] = len(taken_over)
    if ended:
        counts["claims taken from, or refused by, passes a reboot ended"] = ended
    if bad:
        return Verdict("fencing", False, f"{len(bad) // 2 or 1} fencing violation(s)", bad, counts)
    if explained:
        return _unjudged("fencing", f"{len(explained) // 2} lease breach(es)", explained, steps, counts)
    stepped = f"; {len(caused) // 2} lease(s) lapsed early by an injected clock step" if caused else ""
    if taken_over:
        stepped += f"; {len(taken_over)} live claim(s) taken over from a faulted holder (fast failover)"
    if ended:
        stepped += f"; {ended} claim(s) taken from, or refused by, a pass a reboot ended"
    return Verdict("fencing", True, f"{refused} stale write(s) refused, none accepted{stepped}", [], counts)


def _exclusive(
    all_ops: list[Operation], claims: dict[str, list[Operation]]
) -> list[tuple[_Breach, int | None]]:
    """A claim granted while another pass was provably alive: that pass had a write accepted
    (a renewal) late enough that its liveness window, measured from when the write was invoked,
    still covered the moment the new claim completed, within its budget, and no release of it had
    been invoked by then. Each with the pid of the process that held the older claim.
    Needs the claim's ``alive`` and ``budget`` in the history; older histories skip this."""
    bad: list[tuple[_Breach, int | None]] = []
    passes: dict[tuple[str, int], list[Operation]] = defaultdict(list)
    for o in all_ops:
        if o.workflow is not None and o.token is not None:
            passes[(o.workflow, o.token)].append(o)
    for wf, cs in claims.items():
        # the claims by completion: a breach needs b to complete inside a renewal's liveness
        # window, so only the claims completing inside the widest such window are looked at (a
        # storm's claims of a microsecond's lease look at none, rather than at every other claim)
        order = sorted(range(len(cs)), key=lambda i: cs[i].end)
        ends = [cs[i].end for i in order]
        for a in cs:
            alive = a.invoke.get("alive")
            budget = a.invoke.get("budget")
            if alive is None or budget is None or a.token is None:
                continue
            mine = passes.get((wf, a.token), [])
            released = min((o.start for o in mine if o.f == "release"), default=float("inf"))
            held_until = a.start + float(budget) * 1e9
            renewals = [x for x in mine if x.landed and x.f in RENEWING]
            if not renewals:
                continue
            widest = max(min(x.start + float(alive) * 1e9, held_until) for x in renewals)
            lo = bisect.bisect_left(ends, min(x.end for x in renewals))
            hi = bisect.bisect_left(ends, widest - SLACK_NS)
            for i in sorted(order[lo:hi]):  # in the history's order, as every pair once was
                b = cs[i]
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
                        pid = a.invoke.get("pid")
                        bad.append(
                            (
                                _Breach(evidence, (x.start, b.end), covered - b.end, True, budget_end),
                                pid if isinstance(pid, int) else None,
                            )
                        )
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
    by_end = {wf: _Prefix([(a.end, a.token or 0, a) for a in cs]) for wf, cs in claims.items()}
    by_start = {wf: _Prefix([(b.start, b.token or 0, b) for b in cs]) for wf, cs in claims.items()}
    for c in all_ops:
        if c.f != "claim" or c.outcome != "contended" or c.workflow is None or c.workflow not in by_end:
            continue
        # the newest claim completed before c began (the first of the highest token, as max() was)
        found = by_end[c.workflow].highest_before(c.start)
        if found is None:
            continue
        holder = found[1]
        budget = holder.invoke.get("budget")
        if budget is None:
            continue
        ends = holder.end + float(budget) * 1e9
        if not c.start > ends + SLACK_NS:
            continue
        if _overlapped(c, holder, claims[c.workflow], maybe_claims.get(c.workflow, []), by_start[c.workflow]):
            continue
        evidence = [
            c.brief(f"refused as Contended {budget}s past token {holder.token}'s budget"),
            holder.brief("the newest claim, whose budget had run out"),
        ]
        bad.append(_Breach(evidence, (holder.start, c.end), c.start - ends, False))
    return bad


def _overlapped(
    c: Operation, holder: Operation, cs: list[Operation], maybes: list[Operation], by_start: _Prefix
) -> bool:
    """Whether a claim other than ``holder``, with a token at least its, was in flight with ``c``
    (began before ``c`` ended, ended after ``holder`` began): then that claim may hold the lease.
    A claim with a higher token than the holder's ended after ``c`` began (the holder has the
    highest token of those ended before), so one that began before ``c`` ended is found by the
    highest token begun by then; only a tie with the holder's token (a token issued twice, which
    fencing reports anyway) or a holder without a token needs the scan of every claim."""
    top = by_start.highest_before(c.end)
    if holder.token is not None and top is not None and top[0] > holder.token:
        return True
    # a claim whose reply was lost has no token we know: in flight with c, it may be the holder
    if any(b.token is None and b.start < c.end and b.end > holder.start for b in maybes):
        return True
    tied = [b for b in cs + maybes if (b.token or 0) == (holder.token or 0)] if holder.token else cs + maybes
    return any(
        b is not holder and b.start < c.end and b.end > holder.start and (b.token or 0) >= (holder.token or 0)
        for b in tied
    )
