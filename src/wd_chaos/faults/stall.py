"""The ``stall`` fault: SIGSTOP a worker that is inside a step's (or a transact's) effect, for
``duration`` seconds (or ``over`` the lease: alive or budget plus ``margin``), then SIGCONT. A
stalled pass that outlived its lease must be refused on waking (``stall-fenced``); one stalled
past its budget while it kept renewing, once the budget ran out (``budget-fenced``)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections import defaultdict
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from without_durability.testing.kit import Capability

from ..checks.bitten import bit, injections, refused_after
from ..checks.core import FENCED_WRITES, Operation, Verdict, bite_check, operations
from ..checks.coverage import window
from ..history import Op
from ..rundir import FinalState
from .base import TARGET_WAIT, EventSpec, FaultKind, FaultSpec, SimulatedForm
from .nemesis import Active, KindState, Nemesis

Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False, description="a number of seconds > 0")]


class StallFault(FaultSpec):
    """SIGSTOP a worker that is inside a step's effect, for ``duration`` seconds (or ``over`` the
    lease: alive or budget plus ``margin``), then SIGCONT."""

    kind: Literal["stall"]
    inside: Literal["step", "transact"] = "step"
    """Which effect the stalled worker must be inside: a step's, or a transact's (Postgres)."""
    duration: Seconds | None = None
    over: Literal["alive", "budget"] | None = None
    margin: Seconds = 1.5

    @model_validator(mode="after")
    def _one_length(self) -> StallFault:
        if (self.duration is None) == (self.over is None):
            raise ValueError("give exactly one of duration (seconds) or over ('alive' | 'budget')")
        return self


class StallEvent(EventSpec):
    """A scheduled stall: its length in seconds, and the effect its worker must be inside."""

    NEEDS = ("duration",)
    fault: Literal["stall"]
    inside: Literal["step", "transact"] | None = None
    duration: Annotated[float | None, Field(gt=0, le=3600, allow_inf_nan=False)] = None
    over: Literal["alive", "budget"] | None = None


def plan(fault: StallFault, scenario: Any) -> dict[str, object]:
    """The event's length: ``duration``, or the lease's alive or budget plus ``margin``."""
    event: dict[str, object] = {"inside": fault.inside}
    if fault.duration is not None:
        event["duration"] = fault.duration
    else:
        base = scenario.lease.alive if fault.over == "alive" else scenario.lease.budget
        event["duration"] = round(base + fault.margin, 3)
        event["over"] = fault.over
    return event


class Stalled(KindState):
    """A run's stalls: the workers stopped now (SIGSTOP), which other faults leave alone."""

    def __init__(self) -> None:
        self.workers: set[str] = set()

    def stopped(self) -> set[str]:
        return set(self.workers)


def setup(nemesis: Nemesis) -> Stalled:
    """The run's stall state: none stopped yet."""
    return Stalled()


def in_effect(nemesis: Nemesis, ev: dict[str, Any], elapsed: float) -> str | bool:
    """The worker event ``ev`` stops: one inside an effect (``ev["inside"]``, a step's by default)
    that no fault holds stopped or spares, the event's target if it is one. When there is none:
    False (wait), or, ``TARGET_WAIT`` seconds past the event's time, True (the event is done: it
    is logged as skipped and counted)."""
    candidates = sorted(nemesis.busy(ev.get("inside") or "step") - nemesis.stopped - nemesis.spared)
    if not candidates:
        if elapsed - float(ev["at"]) > TARGET_WAIT:
            nemesis.skipped += 1
            nemesis.line(ev, "skipped", why="no worker was inside an effect")
            return True
        return False
    return str(ev["target"]) if ev["target"] in candidates else nemesis.rng.choice(candidates)


def start(nemesis: Nemesis, ev: dict[str, Any], elapsed: float) -> bool:
    """Stop a worker inside an effect (the event's target if it is one); skip the event when none
    has been for ``TARGET_WAIT`` seconds past its time."""
    stalled = nemesis.state("stall", setup)
    name = in_effect(nemesis, ev, elapsed)
    if isinstance(name, bool):
        return name
    pid = nemesis.pids()[name]
    os.kill(pid, signal.SIGSTOP)
    stalled.workers.add(name)
    nemesis.line({**ev, "target": name}, "start", target_pid=pid)

    def cont(name: str = name, pid: int = pid, ev: dict[str, Any] = ev) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        stalled.workers.discard(name)
        nemesis.line({**ev, "target": name}, "stop", target_pid=pid)

    nemesis.active.append(Active(time.monotonic() + float(ev["duration"]), ev, cont))
    return True


def requires(fault: StallFault) -> frozenset[Capability]:
    """A stall inside ``transact`` needs a store that can pause inside an open transaction."""
    return frozenset({"transact-pause"}) if fault.inside == "transact" else frozenset()


@bite_check("stall-fenced")
def stall_fenced(ops: list[Op], final: FinalState) -> Verdict:
    """The stall bit: a stalled pass that lost its workflow to a newer claim was refused on
    waking, or (a broken store) wrote on waking all the same, which ``fencing`` fails. Neither:
    unknown, the stall touched nothing (it caught a worker between passes, or none outlived it)."""
    all_ops = operations(ops)
    windows = injections(ops, "stall")
    hits = refused_after(all_ops, windows, None, "stalled {duration}s, refused on waking")
    verdict = bit("stall-fenced", hits, len(windows), "stalled pass(es) refused on waking")
    if not hits:
        woke = [
            o
            for start, stop in windows
            if stop is not None
            for o in all_ops
            if int(o.invoke["pid"]) == int(start["target_pid"])
            and o.landed
            and o.f in FENCED_WRITES
            and o.start > start["mono"]
            and (o.token or 0)
            < max(
                (c.token or 0)
                for c in all_ops
                if c.f == "claim" and c.ok and c.workflow == o.workflow and c.end < o.start
            )
        ]
        if woke:
            # the stall did bite: it left a pass behind a newer claim; that the store took its
            # write rather than refuse it is fencing's verdict, not this one's
            verdict.valid = True
            verdict.summary = (
                f"{len(woke)} stalled pass(es) wrote on waking and none was refused (see fencing)"
            )
            verdict.evidence = [o.brief("stale write accepted on waking") for o in woke]
            verdict.counts["bit"] = len(woke)
    return verdict


@bite_check("budget-fenced")
def budget_fenced(ops: list[Op], final: FinalState) -> Verdict:
    all_ops = operations(ops)
    passes: dict[tuple[str, int], list[Operation]] = defaultdict(list)
    for o in all_ops:
        if o.workflow is not None and o.token is not None:
            passes[(o.workflow, o.token)].append(o)
    hits = []
    tried = 0
    for o in all_ops:
        if o.f != "claim" or not o.ok or o.invoke.get("budget") is None:
            continue
        mine = passes.get((str(o.workflow), int(o.token or 0)), [])
        deadline = o.end + float(o.invoke["budget"]) * 1e9
        renewed = [x for x in mine if x.f == "renew" and x.ok]
        if len(renewed) < 2 or max(x.end for x in renewed) < o.end + 0.5 * (deadline - o.end):
            continue  # not a pass that kept renewing into its budget
        tried += 1
        refused = [x for x in mine if x.outcome == "fenced" and x.start > deadline]
        if refused:
            hits.append(refused[0].brief("renewed, but refused once its budget ran out"))
    return bit("budget-fenced", hits, tried, "renewing pass(es) refused after their budget")


async def simulate(sim: Any, n: int) -> None:
    """In ``wd-chaos sim``: hold a live worker past its lease (``over: alive``) or its budget."""
    rng = sim.rng
    target = rng.choice(sorted(sim.workers))
    over = "alive" if rng.random() < 0.6 else "budget"
    base = sim.lease.alive if over == "alive" else sim.lease.budget
    duration = round(base + rng.uniform(0.5, 2.0), 3)
    if sim.world.permits(f"{STALL.name}-{n}"):
        sim.hold(STALL.name, target, n, duration, over)


STALL = FaultKind(
    "stall",
    StallFault,
    StallEvent,
    plan,
    start,
    requires=requires,
    color="#e4572e",
    window=True,
    detail=("duration", "over"),
    simulated="the nemesis holds a worker past its lease or its budget",
    form=SimulatedForm(order=2, share=0.40, inject=simulate, applies=lambda sim: bool(sim.workers)),
)


@window("takeover-during-stall")
def takeover_during_stall(ops: list[Operation], lines: list[Op]) -> int:
    """Another process claimed while a worker was stopped (SIGSTOP): a takeover under a live pass."""
    hits = 0
    for start, stop in injections(lines, "stall"):
        begin, end = int(start["mono"]), float(stop["mono"]) if stop is not None else float("inf")
        stalled = int(start.get("target_pid") or 0)
        hits += sum(
            1
            for o in ops
            if o.f in ("claim", "take_and_claim")
            and o.ok
            and int(o.invoke.get("pid") or 0) != stalled
            and begin < o.end < end
        )
    return hits
