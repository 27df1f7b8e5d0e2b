"""The ``kill`` fault: arm a failpoint in one worker; the worker SIGKILLs itself there (between a
step's effect and its record, inside a transact, or just after a claim) and the harness restarts
it. It bit when a worker died between an effect and its record (``kill-between``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from ..checks.bitten import bit
from ..checks.core import Verdict, bite_check
from ..history import Op
from ..rundir import FinalState
from .base import EventSpec, FaultKind, FaultSpec, Marker, SimulatedForm
from .nemesis import Nemesis

Failpoint = Literal["after-effect-before-record", "inside-transact", "after-claim"]


class KillFault(FaultSpec):
    """Arm a failpoint in one worker: the worker SIGKILLs itself there; the harness restarts it."""

    kind: Literal["kill"]
    failpoint: Failpoint


class KillEvent(EventSpec):
    """A scheduled kill: the failpoint armed."""

    NEEDS = ("failpoint",)
    fault: Literal["kill"]
    failpoint: Failpoint | None = None


def plan(fault: KillFault, scenario: Any) -> dict[str, object]:
    """The failpoint to arm."""
    return {"failpoint": fault.failpoint}


def setup(nemesis: Nemesis) -> Path:
    """The run's failpoint folder (``armed/``, with ``taken/`` for the worker that takes one),
    which the workers' ``testflow.Failpoints`` look in."""
    armed = nemesis.run_dir / "armed"
    (armed / "taken").mkdir(parents=True, exist_ok=True)
    return armed


def start(nemesis: Nemesis, ev: dict[str, Any], elapsed: float) -> bool:
    """Arm the failpoint: a file the workers look for, taken by the first to reach it."""
    (nemesis.state("kill", setup) / f"{ev['failpoint']}.{ev['id']}").touch()
    # the plan drew a worker, but a failpoint is taken by whichever worker reaches it first (its
    # own "start" line names it): naming the drawn one here would blame a worker that was not killed
    nemesis.line({**ev, "target": "the first worker to reach it"}, "armed")
    return True


def heal(nemesis: Nemesis) -> None:
    """Disarm every failpoint no worker reached."""
    for left in nemesis.state("kill", setup).glob("*.*"):
        if left.is_file():
            left.unlink(missing_ok=True)
            nemesis.hist.event("fault", fault="kill", phase="disarmed", id=left.name)


@bite_check("kill-between")
def kill_between(ops: list[Op], final: FinalState) -> Verdict:
    hits = []
    points = [
        line
        for line in ops
        if line["type"] == "fault" and line.get("fault") == "kill" and line.get("phase") == "start"
    ]
    for p in points:
        if p.get("failpoint") not in ("after-effect-before-record", "inside-transact"):
            continue
        pid = int(p["pid"])
        before = [
            line
            for line in ops
            if line["type"] == "effect"
            and int(line["pid"]) == pid
            and line["mono"] < p["mono"]
            and line.get("key") == p.get("key")
        ]
        if p["failpoint"] == "inside-transact" or before:
            hits.append({**p, "why": "killed between the effect and its record"})
    return bit("kill-between", hits, len(points), "kill(s) landed between effect and record")


async def simulate(sim: Any, n: int) -> None:
    """In ``wd-chaos sim``: crash a live worker at whatever await it is (restarted later)."""
    target = sim.rng.choice(sorted(sim.workers))
    if sim.world.permits(f"{KILL.name}-{n}"):
        sim.crash(KILL.name, target, n)


KILL = FaultKind(
    "kill",
    KillFault,
    KillEvent,
    plan,
    start,
    heal=heal,
    color="#222222",
    markers=(Marker("start"),),
    detail=("failpoint",),
    simulated="the nemesis crashes a worker at any await and restarts it",
    form=SimulatedForm(order=1, share=0.30, inject=simulate, applies=lambda sim: bool(sim.workers)),
)
