"""wakeup-stands (core): a wakeup that landed while a delivery was held survives the holder's answer."""

from __future__ import annotations

from typing import Any

from ..history import Op
from ..rundir import FinalState
from .core import SLACK_NS, UNKNOWN, Verdict, checker, operations
from .queue_calls import PROBE, Queue, final_queue, in_final_queue, queue_steps, wakeups_while_held


@checker("wakeup-stands")
def wakeup_stands(ops: list[Op], final: FinalState) -> Verdict:
    """A wakeup (``schedule`` due now, ``arrive``, ``deliver``) of a workflow that completed while a
    take held it (after that take completed, before its holder's answer with that take's receipt
    was made) survives the answer, whatever the answer was (done, retry later, retry now): the
    workflow is taken again afterwards, or is still in the store's final queue; and it is visible
    from the answer on, so a take of the queue that found nothing due after the answer (and after
    the wakeup), before the workflow was taken again, shows the wakeup lost even where a later call
    brought the workflow back. A cancel or discard
    since excuses it, and so does a take whose reply was lost (outcome unknown) in time to have taken
    the wakeup: it may hold the workflow, unseen, for its visibility. Where the kit does not read its queue, a wakeup with no later take counts as
    lost only when a take of the same queue found nothing due after the answer."""
    all_ops = operations(ops)
    q = Queue.of(all_ops)
    bad: list[dict[str, Any]] = []
    held = 0
    unsure = 0
    for w, holder, answer in wakeups_while_held(q):
        wf = str(w.workflow)
        held += 1
        later = [t for t in q.takes.get(wf, []) if t.end > w.start]
        if later:
            # taken again; but if a take of the queue found nothing due after the answer and
            # before that take began, the workflow was not visible then: the wakeup was lost, and
            # only a later call (another wakeup, a lapse) brought the workflow back
            since = max(answer.end, w.end) + SLACK_NS
            empty = next(
                (
                    t
                    for t in q.empty_takes
                    if t.start > since and t.end < later[0].start and q.blindly_hidden(w.start, t.start) is None
                ),
                None,
            )  # a take whose reply was lost may have taken the wakeup and hidden it: not lost
            removed = any(r.end > w.start and r.start < later[0].start for r in q.removals.get(wf, []))
            if empty is None or removed or wf.startswith(PROBE) or queue_steps(ops, final):
                continue  # taken again: the wakeup stood
            bad += [
                holder.brief("took it"),
                w.brief("a wakeup while it was held"),
                answer.brief("the holder answered; the wakeup must stand"),
                empty.brief("found nothing due afterwards: the wakeup was lost"),
                later[0].brief("taken again only after this, by a later call's doing"),
            ]
            continue
        if any(r.end > w.start for r in q.removals.get(wf, [])):
            continue
        queued = in_final_queue(final, wf)
        if queued:
            continue
        if queued is None:
            # without the final queue, only a take of the run's own queue that found nothing due tells
            other = wf.startswith(PROBE) or final_queue(final) is not None  # another namespace's
            empty = next(
                (
                    t
                    for t in q.empty_takes
                    if t.start > answer.end and not other and q.blindly_hidden(w.start, t.start) is None
                ),
                None,
            )
            if empty is None or queue_steps(ops, final):
                unsure += 1
                continue
            bad += [
                holder.brief("took it"),
                w.brief("a wakeup while it was held"),
                answer.brief("the holder answered; the wakeup must stand"),
                empty.brief("found nothing due afterwards: the wakeup was lost"),
            ]
            continue
        bad += [
            holder.brief("took it"),
            w.brief("a wakeup while it was held"),
            answer.brief("the holder answered; the wakeup must stand"),
            {"final_queue": f"{wf!r} was never taken again and is not in the store's final queue"},
        ]
    counts = {"wakeups_while_held": held, "unjudged": unsure}
    if bad:
        lost = sum(1 for e in bad if e.get("why") == "a wakeup while it was held")
        return Verdict(
            "wakeup-stands", False, f"{lost} wakeup(s) while held lost by the holder's answer", bad, counts
        )
    if unsure:
        return Verdict(
            "wakeup-stands",
            UNKNOWN if held == unsure else True,
            f"{held} wakeups while held; {unsure} never taken again where the queue was not read "
            "(the run may have ended first)",
            [],
            counts,
        )
    return Verdict("wakeup-stands", True, f"{held} wakeups while held, each taken again", [], counts)
