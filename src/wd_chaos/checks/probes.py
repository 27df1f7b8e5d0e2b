"""Checkers for the lifecycle guarantees the storm's probes exercise (see ``probes``): tokens rise
across discards, a refused write renews nobody, a cancel sticks, an answer acts only on its own
receipt, and ``answer_and_take`` never hands back what it answered.

Each judges only what clients observed, and each holds for any history of a correct store, not
just the probe's: a rule says which operations would prove a breach, and operations that might
explain one (an indeterminate write, a concurrent schedule) excuse it.
"""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from typing import Any

from ..history import Op
from ..rundir import FinalState
from .core import SLACK_NS, UNKNOWN, Operation, Verdict, checker, operations

RENEWING = ("claim", "renew", "record", "transact")
"""Calls that may set a pass's liveness (a claim grants it; the rest renew it when they land)."""
REOPENING = ("schedule", "append", "supply", "arrive", "deliver")
"""Calls that may queue a workflow afresh (a wakeup), which a cancel or a take does not undo."""


def _by_workflow(ops: list[Operation], *names: str) -> dict[str, list[Operation]]:
    out: dict[str, list[Operation]] = defaultdict(list)
    for o in ops:
        if o.f in names and o.workflow is not None:
            out[o.workflow].append(o)
    return out


def _verdict(name: str, bad: list[dict[str, Any]], what: str, ok: str, counts: dict[str, int]) -> Verdict:
    if bad:
        return Verdict(name, False, what, bad, counts)
    return Verdict(name, True, ok, [], counts)


@checker("tokens-rise")
def tokens_rise(ops: list[Op], final: FinalState) -> Verdict:
    """A granted claim's token exceeds every token granted for its workflow by a claim that
    completed before it was invoked, discards of the workflow in between notwithstanding (a
    discard raises the fence; it never lets a token be minted again)."""
    del final
    claims = _by_workflow([o for o in operations(ops) if o.ok and o.token is not None], "claim")
    bad: list[dict[str, Any]] = []
    count = 0
    for group in claims.values():
        group.sort(key=lambda o: o.end)
        ends = [o.end for o in group]
        highest: list[tuple[int, Operation]] = []  # running maximum of tokens, by completion
        for o in group:
            best = highest[-1] if highest else None
            highest.append(best if best is not None and best[0] >= (o.token or 0) else (o.token or 0, o))
        for b in group:
            count += 1
            i = bisect.bisect_left(ends, b.start)  # claims completed before b was invoked
            if i and highest[i - 1][0] >= (b.token or 0):
                a = highest[i - 1][1]
                bad += [a.brief("granted this token"), b.brief("granted a token no higher, later")]
    return _verdict(
        "tokens-rise", bad, f"{len(bad) // 2} token(s) minted again", f"{count} claims, tokens rising", {"claims": count}
    )


@checker("lease-lapses")
def lease_lapses(ops: list[Op], final: FinalState) -> Verdict:
    """A claim refused as Contended had a pass that may still have been alive: some claim, renew,
    record or transact of the workflow that landed (or may have) within its pass's ``alive`` of the
    refused claim's start. A refusal past every such window means something else renewed the
    holder (a refused write, say). Claims lacking ``alive`` in the history are not judged."""
    del final
    all_ops = operations(ops)
    alive: dict[tuple[str, int], float] = {}
    for o in all_ops:
        if o.f == "claim" and o.ok and o.token is not None and o.workflow and o.invoke.get("alive") is not None:
            alive[(o.workflow, o.token)] = float(o.invoke["alive"]) * 1e9
    grants = _by_workflow([o for o in all_ops if o.outcome in ("ok", "unknown")], *RENEWING)
    bad: list[dict[str, Any]] = []
    judged = 0
    for c in all_ops:
        if c.f != "claim" or c.outcome != "contended" or c.workflow is None:
            continue
        until = -1.0
        last: Operation | None = None
        unknown = False
        for g in grants.get(c.workflow, []):
            if g.start >= c.end:
                continue
            span = float(g.invoke["alive"]) * 1e9 if g.f == "claim" and "alive" in g.invoke else None
            if span is None and g.token is not None:
                span = alive.get((c.workflow, g.token))
            if span is None:
                unknown = True  # a pass whose liveness the history does not say
                break
            if g.end + span > until:
                until, last = g.end + span, g
        if unknown:
            continue
        judged += 1
        if last is not None and c.start > until + SLACK_NS:
            lapsed = (c.start - until) / 1e9
            bad += [
                c.brief(f"refused as Contended {lapsed:.3f}s after every pass's liveness had run out"),
                last.brief("the last call that could have kept a pass alive"),
            ]
    return _verdict(
        "lease-lapses",
        bad,
        f"{len(bad) // 2} claim(s) refused with no pass alive",
        f"{judged} refused claims, each with a pass that may have been alive",
        {"contended": judged},
    )


@checker("cancel-sticks")
def cancel_sticks(ops: list[Op], final: FinalState) -> Verdict:
    """No take hands out a workflow whose cancel completed before the take was invoked, unless a
    wakeup (schedule, deliver, arrive) of it was invoked after the cancel was: an answer from a
    delivery taken before the cancel must not reinstate it."""
    del final
    all_ops = operations(ops)
    cancels = _by_workflow([o for o in all_ops if o.ok], "cancel")
    reopens = _by_workflow([o for o in all_ops if o.outcome != "failed"], *REOPENING)
    bad: list[dict[str, Any]] = []
    takes = 0
    for t in all_ops:
        wf = t.got("workflow")
        if t.f != "take" or not t.ok or not wf or str(wf) not in cancels:
            continue
        wf = str(wf)
        after = [c for c in cancels[wf] if c.end < t.start]
        takes += bool(after)
        for c in after:
            if not any(r.end > c.start for r in reopens.get(wf, [])):
                bad += [c.brief("cancelled"), t.brief("handed out afterwards, with no wakeup since")]
                break
    total = sum(map(len, cancels.values()))
    return _verdict(
        "cancel-sticks",
        bad,
        f"{len(bad) // 2} cancelled workflow(s) handed out again",
        f"{total} cancels; {takes} takes after a cancel, each after a wakeup since",
        {"cancels": total, "takes_after_cancel": takes},
    )


@checker("own-receipt")
def own_receipt(ops: list[Op], final: FinalState) -> Verdict:
    """An answer acts only on its own receipt: a workflow taken (its receipt in the history) is not
    handed out again within 80% of that take's visibility unless a wakeup or an answer carrying
    that very receipt was invoked since. Takes and answers that record no receipt are not judged
    (an answer without one excuses, as it may have been the current one)."""
    del final
    all_ops = operations(ops)
    takes: dict[str, list[Operation]] = defaultdict(list)
    for o in all_ops:
        if o.f == "take" and o.ok and o.got("workflow") and o.got("receipt") is not None:
            takes[str(o.got("workflow"))].append(o)
    answers = _by_workflow([o for o in all_ops if o.outcome != "failed"], "wake_at")
    reopens = _by_workflow([o for o in all_ops if o.outcome != "failed"], *REOPENING)
    bad: list[dict[str, Any]] = []
    count = 0
    for wf, group in takes.items():
        group.sort(key=lambda o: o.end)
        count += len(group)
        for a, b in itertools.pairwise(group):
            hidden = 0.8 * float(a.invoke.get("visibility", 0)) * 1e9
            if b.start - a.end >= hidden:
                continue
            between = [o for o in reopens.get(wf, []) if o.end > a.start and o.start < b.end]
            between += [
                o for o in answers.get(wf, [])
                if o.end > a.start and o.start < b.end and o.invoke.get("receipt") in (None, a.got("receipt"))
            ]  # fmt: skip
            if not between:
                bad += [a.brief("took it"), b.brief("took it again while hidden, with only stale answers since")]
    return _verdict(
        "own-receipt", bad, f"{len(bad) // 2} double deliveries", f"{count} takes with receipts, none doubled",
        {"takes": count},
    )  # fmt: skip


@checker("answer-then-take")
def answer_then_take(ops: list[Op], final: FinalState) -> Verdict:
    """``answer_and_take`` never hands back the workflow it answered (a workflow answered as due now
    is left for the next take). No call to judge is valid only when no probe ran its answer
    sequence (the scheduler does not offer ``answer_and_take``); a probe that did, yet recorded no
    completed call, leaves the verdict unknown rather than vacuously valid."""
    del final
    bad: list[dict[str, Any]] = []
    count = 0
    all_ops = operations(ops)
    tried = sum(1 for o in all_ops if o.f == "take" and o.invoke.get("via") == "answer_and_take")
    sequences = {o.workflow for o in all_ops if (o.workflow or "").startswith("probe/")
                 and (o.workflow or "").endswith("/answer")}  # fmt: skip
    if not tried:
        if sequences:
            return Verdict(
                "answer-then-take", UNKNOWN,
                f"{len(sequences)} answer sequence(s) ran, yet no answer_and_take call was recorded",
                [], {"answer_and_take": 0},
            )  # fmt: skip
        return Verdict(
            "answer-then-take", True,
            "nothing to judge: no probe ran answer sequences (the scheduler offers no answer_and_take)",
            [], {"answer_and_take": 0},
        )  # fmt: skip
    for o in all_ops:
        if o.f != "take" or o.invoke.get("via") != "answer_and_take" or not o.ok:
            continue
        count += 1
        if o.got("workflow") is not None and o.got("workflow") == o.invoke.get("answered"):
            bad.append(o.brief("answer_and_take handed back the workflow it answered"))
    return _verdict(
        "answer-then-take", bad, f"{len(bad)} answered workflow(s) handed back",
        f"{count} answer_and_take calls, none handed back its own workflow", {"answer_and_take": count},
    )  # fmt: skip

