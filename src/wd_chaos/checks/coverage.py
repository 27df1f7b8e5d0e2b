"""Fault coverage: how often a run reached the dangerous windows its scenario means to reach.

A checker that holds says something about the store only if the run went where the store could
have gone wrong. A scenario names those places (``coverage = [...]`` in its file); each is a
*window*, a function of the history that counts how many times the run was inside it (Antithesis
calls these "sometimes" assertions: they must hold at least once). The run's ``coverage`` verdict
lists every count, and ``summary.json`` carries them as ``"coverage": {window: hits}``. A window
reached 0 times makes that verdict unknown (exit 2): the run did not test what the scenario is
for, so it says nothing about the store, exactly as a fault that did not bite.

A window is a function decorated ``@window("NAME")`` in this module, or in a fault kind's module
for a window about that fault; ``windows()`` lists them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ..history import Op
from .core import FENCED_WRITES, UNKNOWN, Operation, Verdict, operations
from .queue_calls import Queue, stale_answers, wakeups_while_held
from .registry import checkers

WindowFn = Callable[[list[Operation], list[Op]], int]

_WINDOWS: dict[str, tuple[WindowFn, str]] = {}


def window(name: str) -> Callable[[WindowFn], WindowFn]:
    """Register ``fn`` as the window ``name``: it counts the times a history entered it. Its
    docstring's first line says what the window is (the report and ``windows()`` show it)."""

    def register(fn: WindowFn) -> WindowFn:
        if name in _WINDOWS:
            raise RuntimeError(f"two coverage windows are named {name!r}")
        _WINDOWS[name] = (fn, (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else "")
        return fn

    return register


def windows() -> dict[str, str]:
    """Every window a scenario may name, with what it is: those of this module and of the fault
    kinds' modules (a window about one kind of fault lives with it, as its bite checks do)."""
    checkers()  # imports every module of the checks and faults packages, so theirs are registered
    return {name: what for name, (_, what) in sorted(_WINDOWS.items())}


@window("stale-write-refused")
def stale_write_refused(ops: list[Operation], lines: list[Op]) -> int:
    """A pass's write (record, transact, renew) refused as Fenced: a superseded pass tried to write."""
    del lines
    return sum(1 for o in ops if o.f in FENCED_WRITES and o.outcome == "fenced")


@window("claim-contended")
def claim_contended(ops: list[Operation], lines: list[Op]) -> int:
    """A claim refused as Contended: two passes reached for one workflow at once."""
    del lines
    return sum(1 for o in ops if o.f == "claim" and o.outcome == "contended")


@window("call-cancelled")
def call_cancelled(ops: list[Operation], lines: list[Op]) -> int:
    """A store call cancelled by its caller while in flight (a timeout, ``Task.cancel()``)."""
    del lines
    return sum(1 for o in ops if o.got("cancelled") or o.got("cancel_swallowed"))


@window("refused-beside-valid")
def refused_beside_valid(ops: list[Operation], lines: list[Op]) -> int:
    """Input the store must refuse, sent at the same moment as valid calls of the same client."""
    del lines
    beside = {str(o.invoke.get("beside")) for o in ops if o.invoke.get("beside")}
    return sum(1 for o in ops if o.invoke.get("refused") and str(o.invoke.get("burst")) in beside)


@window("sweep-fenced-a-pass")
def sweep_fenced_a_pass(ops: list[Operation], lines: list[Op]) -> int:
    """A pass refused as Fenced after a sweep began and no newer claim of its workflow had: the
    sweep forgot the claim of a pass still running."""
    del lines
    sweeps = [o.start for o in ops if o.f == "sweep"]
    if not sweeps:
        return 0
    first_sweep = min(sweeps)
    claims: dict[str, list[Operation]] = {}
    for o in ops:
        if o.f == "claim" and o.ok and o.workflow is not None:
            claims.setdefault(o.workflow, []).append(o)
    hits = 0
    for o in ops:
        if o.f not in FENCED_WRITES or o.outcome != "fenced" or o.workflow is None or first_sweep > o.end:
            continue
        newer = any((c.token or 0) > (o.token or 0) and c.start < o.end for c in claims.get(o.workflow, []))
        hits += not newer
    return hits


@window("claim-ahead-after-retention")
def claim_ahead_after_retention(ops: list[Operation], lines: list[Op]) -> int:
    """A claim made after a quiet spell longer than the retention, while a burst's tokens were still
    ahead of the store's clock: where a store that forgot its claim record would mint one again."""
    del lines
    ends: dict[str, list[tuple[float, float]]] = {}
    for o in ops:
        if o.f == "claim" and o.workflow is not None:
            ends.setdefault(o.workflow, []).append((o.start, o.end))
    hits = 0
    for o in ops:
        if o.f != "claim" or not o.invoke.get("after_burst") or o.workflow is None:
            continue
        if float(o.invoke.get("lead_ms") or 0) <= 0:  # the clock had caught up: nothing to re-mint
            continue
        # quiet since the last claim of the id by anyone (every careless process bursts on it)
        before = [min(end, o.start) for start, end in ends[o.workflow] if start < o.start]
        quiet_ms = (o.start - max(before, default=o.start)) / 1e6
        hits += quiet_ms > float(o.invoke.get("retention_ms") or 0)
    return hits


@window("stale-answer-after-retake")
def stale_answer_after_retake(ops: list[Operation], lines: list[Op]) -> int:
    """An answer made with a receipt that a later take of its workflow had superseded: a stale answer."""
    del lines
    return len(stale_answers(Queue.of(ops)))


@window("wakeup-while-held")
def wakeup_while_held(ops: list[Operation], lines: list[Op]) -> int:
    """A schedule, arrive or deliver that landed while a take held its workflow, and the holder answered after it."""
    del lines
    return len(wakeups_while_held(Queue.of(ops)))


@window("schedule-while-held")
def schedule_while_held(ops: list[Operation], lines: list[Op]) -> int:
    """A plain schedule (due now) of a workflow that landed while a take held it, answered by the holder after it."""
    del lines
    return sum(1 for w, _, _ in wakeups_while_held(Queue.of(ops)) if w.f == "schedule")


def coverage(ops: list[Op], names: Iterable[str]) -> Verdict:
    """The ``coverage`` verdict of a run whose scenario names the windows ``names``: valid when
    each was reached at least once, else unknown (never invalid: it is about the run, not the
    store). ``counts`` maps each window to its hits."""
    all_ops = operations(ops)
    known = windows()
    hits = {name: _WINDOWS[name][0](all_ops, ops) for name in names if name in known}
    missed = [name for name, n in hits.items() if n == 0]
    listed = ", ".join(f"{name} {n}" for name, n in hits.items())
    if missed:
        return Verdict(
            "coverage",
            UNKNOWN,
            f"not tested: {', '.join(missed)} never reached ({listed}); run it again with another --seed",
            [{"window": name, "what": _WINDOWS[name][1], "hits": 0} for name in missed],
            dict(hits),
        )
    return Verdict("coverage", True, f"every window reached: {listed}", [], dict(hits))


def hits_of(verdicts: Iterable[Verdict]) -> dict[str, Any]:
    """The ``coverage`` verdict's counts among ``verdicts`` (empty when the scenario named none)."""
    return next((dict(v.counts) for v in verdicts if v.name == "coverage"), {})
