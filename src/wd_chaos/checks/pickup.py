"""pickup (core): how long a due workflow waited before a take handed it out, and that no take
finds nothing while a workflow is due and nobody holds it.

A *due delivery* is a moment from which the store must hand a workflow out:

- a wakeup (``schedule`` with no ``at``, ``arrive``, ``deliver``) that completed ok: due at its
  completion. If a take held the workflow then (``queue_calls``: from the take's completion until
  an answer with its receipt, or until its visibility ran out), the wakeup stands and the workflow
  is due once the holder's answer completes (``wakeup-stands``' rule), or once the holder's
  visibility ran out when it never answered;
- where the store decides by this machine's wall clock (``store_clock`` ``local``): a ``schedule``
  at a time (due at that time, or at its completion if the time had passed) of a workflow nobody
  held, and a current holder's "retry at a time" answer (due at that time, or at its completion).

Its *pickup* is the time from when it became due to the invocation of the first take that handed
the workflow out after it. Wakeups of one workflow picked up by the same take count once, from the
earliest.

What fails, on evidence that cannot be capacity: a take that completed ok with nothing due
(outside the probes' queues), invoked more than ``IDLE_SLACK_NS`` after a delivery became due and
completed before any take of that workflow began: the queue hid a visible delivery (a lost wakeup),
whatever the timing. A take that ran beside the pickup take found nothing rightly (the other took
it first), as did one beside another wakeup of the workflow (that write held its queue entry). A pickup later than the bound (poll interval plus ``MARGIN_S``) is named as late when it
comes with such evidence; without it (no worker polled throughout the wait, or it would have found
nothing in it: the fleet was busy, or had no worker yet) it is not judged, so the judged figures
are those of pickups within the bound.

A delivery is not judged when, between its wakeup and its pickup, a fault was active (a fault's
start to its stop; one without a stop until the next heal), a clock the queue runs on stepped, a
cancel or discard or another answer of its workflow was made, or a take of unknown outcome (which
may have hidden it) ran; nor when it was never taken and no take found nothing after it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..history import Op
from ..rundir import FinalState
from .core import SLACK_NS, Operation, Verdict, checker, operations
from .queue_calls import PROBE, Queue, final_key, is_wakeup, queue_steps, visibility_ns

MARGIN_S = 0.5
"""Seconds added to the poll interval for the pickup bound. An idle worker takes again one poll
interval after a take that found nothing; on a loaded two-core CI machine its sleep overruns and
a store call takes a few hundred ms at worst, so half a second covers both with room to spare."""
DEFAULT_POLL_S = 0.05
"""The poll interval assumed where the final state does not record one (the scenario default)."""
IDLE_SLACK_NS = SLACK_NS
"""How long after a delivery became due a take that found nothing counts against it (100 ms): the
gap between a client's clock reading and the store's decision."""
UNKNOWN_TAKE_NS = 10_000_000_000
"""How long after its invocation a take of unknown outcome (its caller died or lost the reply) may
still have taken effect on the server."""


@dataclass(frozen=True)
class Due:
    """A due delivery: ``source`` (the wakeup or answer that made it due), its workflow, when it
    became due (``due``, monotonic ns), the time after which a completed take of the workflow
    counts as handing it out (``after``), how it became due, and the holder's answer that released
    it (``own``, for a wakeup that landed while held)."""

    source: Operation
    workflow: str
    due: float
    after: float
    how: str
    own: Operation | None = None


@dataclass
class Pickups:
    """Every due delivery of one run, sorted into judged (with its pickup in ms), lost (the
    evidence against it) and not judged (by reason)."""

    bound_ms: float
    judged: list[tuple[Due, float]] = field(default_factory=list)
    """Judged deliveries with their pickup in ms."""
    lost: list[list[dict[str, Any]]] = field(default_factory=list)
    """One evidence list per delivery that a take found nothing beside."""
    missed: list[tuple[Due, float]] = field(default_factory=list)
    """The lost deliveries with their wait in ms (to the pickup, or to the last take that found
    nothing when never taken)."""
    late: int = 0
    """How many of the lost deliveries were also picked up later than the bound."""
    unjudged: dict[str, int] = field(default_factory=dict)
    """Deliveries not judged, by reason."""

    def skip(self, why: str) -> None:
        self.unjudged[why] = self.unjudged.get(why, 0) + 1

    def figures(self) -> dict[str, int]:
        """p50, p90, p99 and max pickup of the judged deliveries, in whole ms (empty when none)."""
        ms = sorted(p for _, p in self.judged)
        if not ms:
            return {}
        pick = {q: ms[min(len(ms) - 1, max(0, math.ceil(q / 100 * len(ms)) - 1))] for q in (50, 90, 99)}
        return {
            "p50_ms": round(pick[50]),
            "p90_ms": round(pick[90]),
            "p99_ms": round(pick[99]),
            "max_ms": round(ms[-1]),
        }


def poll_interval_s(final: FinalState) -> float:
    """The longest poll interval any worker of the run had (``final["poll_interval"]``), else
    ``DEFAULT_POLL_S``."""
    got = final_key(final, "poll_interval")
    return float(got) if isinstance(got, int | float) and got > 0 else DEFAULT_POLL_S


def fault_windows(ops: list[Op]) -> list[tuple[float, float]]:
    """Each fault's window in monotonic ns: its start line to its stop line (matched by ``id``); a
    start with no stop lasts until the next heal (or the end of the run); a heal, and any fault line
    with no phase, is a window of its own lines."""
    lines = sorted((o for o in ops if o.get("type") == "fault"), key=lambda o: float(o["mono"]))
    out: list[tuple[float, float]] = []
    started: dict[str, tuple[float, Op]] = {}
    for n, line in enumerate(lines):
        mono, phase = float(line["mono"]), line.get("phase")
        key = str(line.get("id") or n)
        if line.get("fault") == "heal":
            out += [(t, mono) for t, _ in started.values()]
            started.clear()
            out.append((mono - SLACK_NS, mono + SLACK_NS))
        elif phase == "start":
            started.setdefault(key, (mono, line))
        elif phase == "stop" and (key := _started(started, line, key)) in started:
            out.append((started.pop(key)[0], mono))
        else:
            out.append((mono - SLACK_NS, mono + SLACK_NS))
    out += [(t, math.inf) for t, _ in started.values()]
    return sorted(out)


def _started(started: dict[str, tuple[float, Op]], stop: Op, key: str) -> str:
    """The open start a stop line ends: the one with its ``id``, else (a restart after a worker
    killed itself at a failpoint says only its ``target``) the first of the same fault whose
    process or target is the stop's target."""
    if key in started or stop.get("id"):
        return key
    return next(
        (
            k
            for k, (_, s) in started.items()
            if s.get("fault") == stop.get("fault")
            and stop.get("target") in (s.get("process"), s.get("target"))
        ),
        key,
    )


def _mono_of(line: Op | None, at: object) -> float | None:
    """The monotonic time of the wall-clock time ``at`` (ISO), by the wall and mono of ``line``."""
    if line is None or not isinstance(at, str) or not isinstance(line.get("wall"), str):
        return None
    try:
        ahead = (datetime.fromisoformat(at) - datetime.fromisoformat(str(line["wall"]))).total_seconds()
    except ValueError:
        return None
    return float(line["mono"]) + max(ahead, 0.0) * 1e9


def held_at(q: Queue, wf: str, w: Operation) -> tuple[str, float, Operation | None]:
    """Whether a take held ``wf`` when wakeup ``w`` landed: ``("free", w.end, None)``, ``("held",
    due, answer)`` (due at the holder's answer, or when its visibility ran out), or ``("unsure",
    0, None)`` (its holder's answer ran beside the wakeup, or was of unknown outcome)."""
    holder = q.current(wf, w.start)
    if holder is None:
        return "free", w.end, None
    mine = holder.got("receipt")
    own = [
        a for a in q.answers.get(wf, []) if a.start > holder.start and a.invoke.get("receipt") in (None, mine)
    ]
    if any(a.end < w.start and a.ok for a in own):
        return "free", w.end, None
    if any(a.end >= w.start and a.start <= w.end for a in own) or any(a.end < w.start for a in own):
        return "unsure", 0.0, None  # beside the wakeup, or answered before it with an unknown outcome
    runs_out = holder.end + visibility_ns(holder)
    if w.start > runs_out + SLACK_NS:
        return "free", w.end, None
    answer = next((a for a in own if a.start > w.end), None)
    if answer is None:
        return "held", max(w.end, runs_out), None
    return ("held", answer.end, answer) if answer.ok else ("unsure", 0.0, None)


def _dues(q: Queue, pk: Pickups, local: bool, expected: object) -> list[Due]:
    """Every due delivery of the run's own queue (see the module docstring)."""
    out: list[Due] = []
    for wf, wakeups in q.wakeups.items():
        if wf.startswith(PROBE) or (isinstance(expected, list) and wf not in expected):
            continue
        for w in wakeups:
            if not w.ok or w.complete is None:
                continue
            at = w.invoke.get("at") if w.f == "schedule" else None
            if at is None and not is_wakeup(w):
                continue  # a plain append or supply schedules nothing
            state, due, own = held_at(q, wf, w)
            if at is not None:
                at_mono = _mono_of(w.complete, at) if local else None
                if at_mono is None or state != "free":
                    pk.skip("a schedule at a time the run cannot place, or of a held workflow")
                    continue
                out.append(Due(w, wf, max(w.end, at_mono), w.start, "scheduled at a time"))
            elif state == "unsure":
                pk.skip("its holder's answer ran beside the wakeup")
            else:
                how = "a wakeup" if state == "free" else "a wakeup while held, due once the holder let go"
                out.append(Due(w, wf, due, w.start, how, own))
    if not local:
        return out
    for wf, answers in q.answers.items():
        if wf.startswith(PROBE) or (isinstance(expected, list) and wf not in expected):
            continue
        for a in answers:
            receipt, at = a.invoke.get("receipt"), a.invoke.get("at")
            if not a.ok or receipt is None or at is None:
                continue
            holder = q.current(wf, a.start)
            if holder is None or holder.got("receipt") != receipt:
                continue  # stale, or a take the history does not show
            if any(b is not a and b.invoke.get("receipt") == receipt and b.end < a.start for b in answers):
                # an earlier answer with this receipt decided (two callers held one delivery: the
                # simulator's wire hands one out twice; a restarted worker answers again): this one
                # found the delivery already answered, so its time is not when the workflow is due
                pk.skip("an earlier answer with its receipt decided")
                continue
            at_mono = _mono_of(a.complete, at)
            if at_mono is not None:
                out.append(Due(a, wf, max(a.end, at_mono), a.start, "the holder's 'retry at a time'"))
    return out


def _overlaps(windows: list[tuple[float, float]], lo: float, hi: float) -> bool:
    return any(s <= hi and e >= lo for s, e in windows)


def measure(ops: list[Op], final: FinalState) -> Pickups:
    """Every due delivery of a run, judged or not (what ``pickup`` and the run report show)."""
    all_ops = operations(ops)
    q = Queue.of(all_ops)
    pk = Pickups(bound_ms=(poll_interval_s(final) + MARGIN_S) * 1e3)
    local = final_key(final, "store_clock") == "local"
    windows = fault_windows(ops) + [
        (float(s["between"][0]) - SLACK_NS, float(s["between"][1]) + SLACK_NS)
        for s in queue_steps(ops, final)
        if isinstance(s.get("between"), list | tuple)
    ]
    end = max((float(o["mono"]) for o in ops if "mono" in o), default=0.0)
    unsure_takes = [
        (float(t.start), min(t.end, t.start + UNKNOWN_TAKE_NS) + visibility_ns(t))
        for t in all_ops
        if t.f == "take" and not t.ok and not t.invoke.get("probe")
    ]
    first: dict[tuple[str, int], Due] = {}  # the earliest due delivery each take (or none) picked up
    takes_of: dict[tuple[str, int], Operation | None] = {}
    for d in _dues(q, pk, local, final_key(final, "expected_workflows")):
        taker = next((t for t in q.takes.get(d.workflow, []) if t.end > d.after), None)
        key = (d.workflow, id(taker) if taker is not None else 0)
        if key in first and first[key].due <= d.due:
            continue
        first[key], takes_of[key] = d, taker
    for key, d in sorted(first.items(), key=lambda kv: kv[1].due):
        _judge(pk, q, d, takes_of[key], windows, unsure_takes, end)
    return pk


def _judge(
    pk: Pickups,
    q: Queue,
    d: Due,
    taker: Operation | None,
    windows: list[tuple[float, float]],
    unsure_takes: list[tuple[float, float]],
    end: float,
) -> None:
    hi = taker.start if taker is not None else end
    lo = d.source.start
    if _overlaps(windows, lo, taker.end if taker is not None else end):
        pk.skip("a fault or clock step while it waited")
        return
    if any(r.end > lo and r.start < hi for r in q.removals.get(d.workflow, [])) or any(
        a.end > lo and a.start < hi and a is not d.source and a is not d.own
        for a in q.answers.get(d.workflow, [])
    ):
        pk.skip("a cancel, discard or another answer of it while it waited")
        return
    if _overlaps(unsure_takes, lo, hi):
        pk.skip("a take of unknown outcome while it waited")
        return
    wait_ms = max(0.0, hi - d.due) / 1e6
    # a take that found nothing while it was due, and ended before the pickup began (one running
    # beside the pickup found nothing rightly: the other may have taken it first)
    # nor one that ran beside another wakeup of the workflow: that write holds the workflow's queue
    # entry until it commits, and a take that skips locked entries (Postgres's SKIP LOCKED) rightly
    # passes it by; the wakeup then wakes a worker for it
    beside = [w for w in q.wakeups.get(d.workflow, []) if w is not d.source]
    blind = [
        e
        for e in q.empty_takes
        if e.start >= d.due + IDLE_SLACK_NS
        and e.end < hi
        and not any(w.start < e.end and w.end > e.start for w in beside)
    ]
    if blind:
        late = taker is not None and wait_ms > pk.bound_ms
        pk.late += late
        pk.missed.append((d, wait_ms if taker is not None else (blind[-1].end - d.due) / 1e6))
        why = (
            f"picked up {wait_ms:.0f} ms after it was due, past the bound of {pk.bound_ms:.0f} ms"
            if late
            else f"picked up {wait_ms:.0f} ms after it was due"
        )
        pk.lost.append(
            [
                d.source.brief(f"{d.how}: due at {_ms(d.due, d.source)} ms after this call began"),
                *([d.own.brief("the holder's answer: the wakeup was due from here")] if d.own else []),
                *(
                    e.brief(
                        f"found nothing while {d.workflow!r} had been due and unheld for {(e.start - d.due) / 1e6:.0f} ms"
                    )
                    for e in blind[:3]
                ),
                taker.brief(why)
                if taker is not None
                else {"workflow": d.workflow, "why": "never taken again"},
            ]
        )
        return
    if taker is None:
        pk.skip("never taken (the run ended first)")
    elif wait_ms <= pk.bound_ms:
        pk.judged.append((d, wait_ms))
    else:  # no worker polled throughout the wait (none found nothing in it): capacity, not the queue
        pk.skip("late with no idle worker (a busy fleet)")


def _ms(due: float, source: Operation) -> str:
    return f"{(due - source.start) / 1e6:.0f}"


@checker("pickup")
def pickup(ops: list[Op], final: FinalState) -> Verdict:
    """Every due delivery (a wakeup, a schedule at a time, a retry at a time; see the module
    docstring) is picked up, and no take finds nothing while one is due and unheld (by more than
    ``IDLE_SLACK_NS``): invalid with the wakeup, the takes that found nothing and the pickup take
    (named late past the poll interval plus ``MARGIN_S``). Deliveries it cannot judge soundly (a
    fault or clock step in the wait, a busy fleet, the run's end) are counted, not judged; a run
    with none judged is valid with a summary that says so. ``counts`` carries ``judged``, each
    reason not judged, and ``p50_ms``, ``p90_ms``, ``p99_ms``, ``max_ms`` and ``bound_ms``."""
    pk = measure(ops, final)
    figures = pk.figures()
    not_judged = sum(pk.unjudged.values())
    counts = {
        "judged": len(pk.judged),
        "lost": len(pk.lost),
        "not judged": not_judged,
        **{f"not judged: {why}": n for why, n in sorted(pk.unjudged.items())},
        **figures,
        "bound_ms": round(pk.bound_ms),
    }
    if pk.lost:
        late = f", {pk.late} of them picked up late" if pk.late else ""
        return Verdict(
            "pickup",
            False,
            f"{len(pk.lost)} due deliveries hidden from a take that found nothing{late}",
            [e for group in pk.lost for e in group],
            counts,
        )
    if not pk.judged:
        return Verdict(
            "pickup",
            True,
            f"not judged: none of {not_judged} due deliveries could be judged soundly",
            [],
            counts,
        )
    shown = ", ".join(f"{k.removesuffix('_ms')} {v} ms" for k, v in figures.items())
    return Verdict(
        "pickup",
        True,
        f"{len(pk.judged)} due deliveries judged, each picked up ({shown}); {not_judged} not judged",
        [],
        counts,
    )
