"""stale-answer (core): an answer made with a receipt that a later take superseded changes nothing."""

from __future__ import annotations

from typing import Any

from ..history import Op
from ..rundir import FinalState
from .core import Verdict, _Breach, _unjudged, checker, operations
from .queue_calls import (
    Queue,
    final_key,
    hidden_until,
    in_final_queue,
    queue_steps,
    sort_breach,
    stale_answers,
    visibility_ns,
)
from .takeover import Takeovers


@checker("stale-answer")
def stale_answer(ops: list[Op], final: FinalState) -> Verdict:
    """An answer (``wake_at``) whose receipt a later take of its workflow superseded before the
    answer was made acts on nothing. Two ways it shows:

    - *re-queued*: the workflow is handed out again while the newer take still hid it (within 80%
      of its visibility), with no wakeup and no answer carrying the newer receipt since: the stale
      answer made it visible;
    - *removed*: the newer holder's first answer was "retry at a time" (before or after the stale answer;
      either way the workflow must stay queued), yet the workflow was never taken again and is missing from the store's final queue
      (read only where the kit reads its queue; a cancel or discard since excuses): the stale
      answer deleted the delivery the newer take held.

    Answers whose receipt the history does not record are not judged. Where the final state says
    the transport hands a delivery out twice (``redelivers``: the simulator's wire), a take handed
    the newer holder's own receipt is that take's copy, not a re-queue; with fast failover, a take
    after a fault struck the newer holder's process is the takeover it documents (``Takeovers``)."""
    all_ops = operations(ops)
    q = Queue.of(all_ops)
    bad: list[dict[str, Any]] = []
    explained: list[dict[str, Any]] = []  # a step of the queue's clock ended the newer take's visibility
    steps = queue_steps(ops, final)
    copies = bool(final_key(final, "redelivers"))
    # with fast failover, a re-take after a fault struck the newer holder is the design (takeover),
    # not the stale answer's doing
    takeovers = Takeovers.of(ops, final)
    stale = 0
    for a, mine, holder in stale_answers(q):
        wf = str(a.workflow)
        stale += 1
        brief = [
            mine.brief("took it"),
            holder.brief("took it again: the answer below is stale"),
            a.brief("a stale answer: made with the first take's receipt"),
        ]
        # a take handed the newer holder's own receipt again, where the transport hands deliveries
        # out twice (the simulator's wire), is a copy of that take, not one the stale answer allowed
        later = [
            t for t in q.takes.get(wf, [])
            if t.end > holder.end and not (copies and t.got("receipt") == holder.got("receipt"))
        ]  # fmt: skip
        nxt = later[0] if later else None
        if (
            nxt is not None
            and nxt.end > a.start
            and nxt.start < hidden_until(holder)
            and q.reopened(wf, holder, holder.start, nxt.end) is None
            and not takeovers.excuses(holder.invoke.get("pid"), holder.start, nxt.end)
        ):
            evidence = [
                *brief,
                nxt.brief("handed out while the newer take hid it: the stale answer re-queued it"),
            ]
            breach = _Breach(
                evidence, (holder.start, nxt.end), visibility_ns(holder) - (nxt.end - holder.start), True
            )
            where = sort_breach(breach, steps)
            if where != "excused":
                (explained if where == "explained" else bad).extend(evidence)
            continue
        if nxt is not None or in_final_queue(final, wf) is not False:
            continue
        # the current holder's answer, the first with its receipt to land: a retry (a time) keeps
        # the workflow queued. A later answer with the same receipt (a restarted worker answering
        # again what it had answered) finds its delivery already answered, so it decides nothing
        own = [b for b in q.answers.get(wf, []) if b.invoke.get("receipt") == holder.got("receipt")]
        last = next((b for b in own if b.ok), None)
        removed = any(r.end > holder.start for r in q.removals.get(wf, []))
        woken = any(w.end > holder.start for w in q.wakeups.get(wf, []))
        if last is not None and last.ok and last.invoke.get("at") and not removed and not woken:
            bad += [
                *brief,
                last.brief(
                    "the current holder answered 'retry at a time', yet the workflow was never taken again "
                    "and is not in the final queue: the stale answer removed it"
                ),
            ]
    if not bad and explained:
        return _unjudged(
            "stale-answer",
            f"{len(explained) // 4} re-queued deliveries",
            explained,
            steps,
            {"stale_answers": stale},
        )
    return _verdict(bad, stale)


def _verdict(bad: list[dict[str, Any]], stale: int) -> Verdict:
    counts = {"stale_answers": stale}
    if bad:
        acted = sum(1 for e in bad if str(e.get("why", "")).startswith("a stale answer"))
        return Verdict("stale-answer", False, f"{acted} stale answer(s) acted", bad, counts)
    return Verdict("stale-answer", True, f"{stale} stale answers, none acted", [], counts)
