"""What the scheduler checkers share: a history's takes, answers and wakeups per workflow, with the
receipts that tie an answer to the take that handed it out (``Recorder`` records a receipt's
``receipt_text`` on the take's complete line and on the answer's invoke line).

A take *holds* its workflow from its completion until its visibility runs out (judged, as
``take-exclusive`` always has, at 80% of it from the take's completion, for the slack between a
client's clock and the store's), until an answer carrying its receipt, or until a wakeup (a
schedule, arrive or deliver) makes the workflow visible again. A take's receipt is *current* until
another take of the workflow completes; an answer made after that is *stale*.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from ..history import Op
from ..rundir import FinalState
from .core import SLACK_NS, Operation, _Breach, _store_steps

HIDDEN_SHARE = 0.8
"""The share of a take's visibility during which a second take of its workflow is judged a breach."""
WAKEUPS = ("schedule", "append", "supply", "arrive", "deliver")
"""Calls that may make a workflow visible at once (a plain append or supply only excuses: it
schedules nothing, but a store may do so alongside)."""
PROBE = "probe/"
"""The prefix of the lifecycle probes' workflows, which live in a queue (namespace) of their own."""


def is_wakeup(o: Operation) -> bool:
    """A call that made (or may have made) its workflow visible now: a ``schedule`` without a later
    ``at``, an ``arrive`` (recorded as ``supply`` via ``arrive``) or a ``deliver`` (``append`` via
    ``deliver``). Failed calls (refused input) are not."""
    if o.outcome == "failed" or o.workflow is None:
        return False
    if o.f == "schedule":
        return o.invoke.get("at") is None
    via = o.invoke.get("via")
    return (
        (o.f == "supply" and via == "arrive")
        or (o.f == "append" and via == "deliver")
        or o.f in ("arrive", "deliver")
    )


def visibility_ns(take: Operation) -> float:
    """The visibility a take asked for, in ns (0 when the history does not say)."""
    return float(take.invoke.get("visibility") or 0) * 1e9


def hidden_until(take: Operation) -> float:
    """Until when (monotonic ns) ``take`` surely still hid its workflow, were nothing to reopen it."""
    return take.end + HIDDEN_SHARE * visibility_ns(take)


@dataclass
class Queue:
    """One history's queue calls, per workflow, each list sorted by completion (answers and wakeups
    by invocation)."""

    takes: dict[str, list[Operation]] = field(default_factory=lambda: defaultdict(list))
    """Takes that completed ok and handed out a workflow."""
    answers: dict[str, list[Operation]] = field(default_factory=lambda: defaultdict(list))
    """``wake_at`` calls that may have acted (ok, or unknown)."""
    wakeups: dict[str, list[Operation]] = field(default_factory=lambda: defaultdict(list))
    """Every call that may queue the workflow afresh (``WAKEUPS``), failed ones excepted."""
    removals: dict[str, list[Operation]] = field(default_factory=lambda: defaultdict(list))
    """``cancel`` and ``discard`` calls that may have acted."""
    empty_takes: list[Operation] = field(default_factory=list)
    """Takes that completed ok with nothing due, outside the probes' queues."""
    blind_takes: list[Operation] = field(default_factory=list)
    """Takes whose outcome is unknown (a reply lost after the store may have applied them): each
    may have handed out, and hidden for its visibility, a workflow no client saw taken."""

    def blindly_hidden(self, after: float, at: float) -> Operation | None:
        """A blind take that may have hidden a workflow made due at ``after`` through ``at``: it
        ended after ``after`` and began before ``at``, within its visibility (and the slack)."""
        for b in self.blind_takes:
            hidden_ns = float(b.invoke.get("visibility") or 0.0) * 1e9
            if b.end > after and b.start < at < b.end + hidden_ns + SLACK_NS:
                return b
        return None

    @classmethod
    def of(cls, ops: list[Operation]) -> Queue:
        """Sort ``ops`` into a ``Queue``."""
        q = cls()
        for o in ops:
            if o.f == "take" and o.ok:
                wf = o.got("workflow")
                if wf:
                    q.takes[str(wf)].append(o)
                elif not o.invoke.get("probe"):
                    q.empty_takes.append(o)
            elif o.f == "take" and o.complete is not None and o.outcome == "unknown" and not o.invoke.get("probe"):
                q.blind_takes.append(o)
            elif o.workflow is None or o.outcome in ("failed", "fenced", "contended"):
                continue
            elif o.f == "wake_at":
                q.answers[o.workflow].append(o)
            elif o.f in WAKEUPS:
                q.wakeups[o.workflow].append(o)
            elif o.f in ("cancel", "discard"):
                q.removals[o.workflow].append(o)
        for table in (q.takes,):
            for group in table.values():
                group.sort(key=lambda o: o.end)
        for table in (q.answers, q.wakeups, q.removals):
            for group in table.values():
                group.sort(key=lambda o: o.start)
        q.empty_takes.sort(key=lambda o: o.start)
        return q

    def reopened(self, wf: str, take: Operation, lo: float, hi: float) -> Operation | None:
        """A call that may have made ``wf`` visible again inside (``lo``, ``hi``) while ``take``
        held it: a wakeup, or an answer with ``take``'s own receipt (or with none recorded, which
        may have been it). A stale answer (another receipt) reopens nothing."""
        for w in self.wakeups.get(wf, []):
            if w.end > lo and w.start < hi:
                return w
        mine = take.got("receipt")
        for a in self.answers.get(wf, []):
            if a.end > lo and a.start < hi and (mine is None or a.invoke.get("receipt") in (None, mine)):
                return a
        return None

    def take_of(self, wf: str, receipt: object, before: float) -> Operation | None:
        """The latest take of ``wf`` that handed out ``receipt`` and completed before ``before``."""
        found = None
        for t in self.takes.get(wf, []):
            if t.end < before and t.got("receipt") == receipt:
                found = t
        return found

    def current(self, wf: str, before: float) -> Operation | None:
        """The latest take of ``wf`` that completed before ``before`` (whose receipt is current then)."""
        found = None
        for t in self.takes.get(wf, []):
            if t.end < before:
                found = t
        return found


def final_key(final: FinalState, key: str) -> object:
    """``final[key]``, or None where the run did not record it or its store was never read."""
    try:
        return final.get(key)
    except LookupError:  # a partial analysis (FinalUnread)
        return None


def final_queue(final: FinalState) -> dict[str, int] | None:
    """The store's final queue as entries per workflow (``final["queue"]``), or None where the
    kit does not read its queue (``Opened.read_queue``) or the store was never read."""
    got = final_key(final, "queue")
    if not isinstance(got, dict):
        return None
    return {str(k): int(v) for k, v in got.items()}


def in_final_queue(final: FinalState, workflow: str) -> bool | None:
    """Whether ``workflow`` is in the store's final queue; None where that cannot be told: the
    queue was not read, or the workflow is not one the run started (a probe's or a careless
    client's, queued in a namespace of its own that the final read does not cover)."""
    queue = final_queue(final)
    expected = final_key(final, "expected_workflows")
    if queue is None or (isinstance(expected, list) and workflow not in expected):
        return None
    return workflow in queue


def stale_answers(q: Queue) -> list[tuple[Operation, Operation, Operation]]:
    """Every stale answer with its take and the take that superseded it, as (answer, its take, the
    newer take): an answer whose receipt a later take of its workflow replaced before the answer
    was invoked. Answers that record no receipt are left out."""
    out = []
    for wf, answers in q.answers.items():
        for a in answers:
            receipt = a.invoke.get("receipt")
            if receipt is None:
                continue
            mine = q.take_of(wf, receipt, a.start)
            holder = q.current(wf, a.start)
            if mine is None or holder is None or holder is mine or holder.got("receipt") == receipt:
                continue
            out.append((a, mine, holder))
    return out


def wakeups_while_held(q: Queue) -> list[tuple[Operation, Operation, Operation]]:
    """Every wakeup that landed while a take held its workflow, as (wakeup, the take, the holder's
    answer): the wakeup began after the take completed and completed before the holder's answer with
    that take's receipt was invoked, and that answer completed ok."""
    out = []
    for wf, wakeups in q.wakeups.items():
        for w in wakeups:
            if not w.ok or not is_wakeup(w):
                continue
            holder = q.current(wf, w.start)
            if holder is None or holder.got("receipt") is None:
                continue
            answer = next(
                (
                    a
                    for a in q.answers.get(wf, [])
                    if a.start > w.end and a.invoke.get("receipt") == holder.got("receipt")
                ),
                None,
            )
            if answer is not None and answer.ok:
                out.append((w, holder, answer))
    return out


def queue_steps(ops: list[Op], final: FinalState) -> list[dict[str, Any]]:
    """The steps of the clock the store's queue runs on, in ``wallclock.steps``' form: this
    machine's wall-clock steps where the store decides by it, plus every step a fault made of the
    store's own clock (its fault line says ``store_clock_step``, with ``seconds`` and, where known,
    ``before_mono``): a queue times visibility by the store's clock, so a step ahead ends every
    hidden delivery's visibility at once, and the harness's own stamps never see it."""
    out = list(_store_steps(ops, final))
    for line in ops:
        if line.get("type") != "fault" or not line.get("store_clock_step") or line.get("seconds") is None:
            continue
        mono = int(line["mono"])  # the clock moved just before its line was written
        lo = int(line.get("before_mono") or mono - SLACK_NS)
        out.append({"seconds": float(line["seconds"]), "wall": line.get("wall"), "between": [lo, mono], "injected": True})
    return out


def sort_breach(breach: _Breach, steps: list[dict[str, Any]]) -> str:
    """Where a time-bound breach of the queue belongs: ``"excused"`` when a step the scenario made
    on purpose (``injected``: a clock-step or wall-step fault) accounts for it, since a queue timed
    by the store's clock rightly ends a visibility its clock jumped past; ``"explained"`` when only a
    step of this machine's clock does (the run cannot judge it); else ``"bad"``."""
    if breach.stepped([s for s in steps if s.get("injected")]):
        return "excused"
    return "explained" if breach.stepped(steps) else "bad"
