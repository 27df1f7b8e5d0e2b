"""The ``wall-step`` fault: step the wall clock a process-clock store (SQLite) reads, in every
process of the run, by ``seconds`` (negative: back), as NTP or a resumed VM would, through the
``WALL_OFFSET`` file every store process reads. The harness's own clock, which the history is
stamped by, does not move, so the checkers judge the store by real time. Skipped for a server's
store, whose clock a run cannot step (``clock-step`` does that)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from without_durability.testing.kit import WALL_OFFSET

from .base import TARGET_WAIT, EventSpec, FaultKind, FaultSpec, SimulatedForm
from .nemesis import Active, KindState, Nemesis

SPARE_SECONDS = 2.0
"""How long an ``after_write`` step keeps stalls off the workers whose next write it awaits (a
step's effect, then its record)."""


class WallStepFault(FaultSpec):
    """Step the wall clock a process-clock store (SQLite) reads, in every process of the run, by
    ``seconds`` (negative: back), as NTP or a resumed VM would; the harness's own clock, which the
    history is stamped by, does not move, so the checkers judge the store by real time. Skipped for a
    server's store, whose clock a run cannot step."""

    kind: Literal["wall-step"]
    seconds: float
    after_write: bool = False
    """Wait (up to ``TARGET_WAIT`` s) for a pass mid-step whose workflow took a write since the
    previous step, acknowledged less than ``|seconds|`` s ago, so that workflow's next record lands
    across this step: a step back then certainly comes between two writes of one workflow."""


class WallStepEvent(EventSpec):
    """A scheduled step: by how many seconds."""

    NEEDS = ("seconds",)
    fault: Literal["wall-step"]
    seconds: Annotated[float | None, Field(allow_inf_nan=False)] = None
    after_write: bool | None = None


def plan(fault: WallStepFault, scenario: Any) -> dict[str, object]:
    """The step, on the store."""
    if fault.after_write:
        return {"seconds": fault.seconds, "target": "store", "after_write": True}
    return {"seconds": fault.seconds, "target": "store"}


class WallOffset:
    """The offset of the wall clock a process-clock store reads (the ``WALL_OFFSET`` file in the
    run folder), which a ``wall-step`` and a ``clock-step`` on a file store both move: the two add up."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / WALL_OFFSET
        self.seconds = 0.0

    def move(self, seconds: float) -> float:
        """Move it by ``seconds``; the new offset. Written aside and renamed, so no process reads a
        half-written offset."""
        self.seconds += seconds
        aside = self.path.with_name(f"{WALL_OFFSET}.new")
        aside.write_text(repr(self.seconds))
        aside.replace(self.path)
        return self.seconds


def wall_offset(nemesis: Nemesis) -> WallOffset:
    """The run's wall-clock offset (shared by the kinds that move it)."""
    return nemesis.state("wall-offset", lambda n: WallOffset(n.run_dir))


class WallSteps(KindState):
    """A run's wall steps: when the last was in place, the workflows whose next write it was
    placed before, and the workers no stall may stop while that write is to come."""

    def __init__(self) -> None:
        self.stepped_ns = 0
        """When the last step was in place (monotonic ns; 0: none yet)."""
        self.awaited: set[str] = set()
        """Workflows whose next write the last step was placed before (``after_write``)."""
        self.spared_workers: set[str] = set()
        """Workers about to make the write a step waits on: a stall now would fence it."""

    def spared(self) -> set[str]:
        return set(self.spared_workers)


def setup(nemesis: Nemesis) -> WallSteps:
    """The run's wall-step state: no step yet."""
    return WallSteps()


def start(nemesis: Nemesis, ev: dict[str, Any], elapsed: float) -> bool:
    """Move the offset (once a pass is mid-step, or ``TARGET_WAIT`` seconds late)."""
    steps = nemesis.state("wall-step", setup)
    if nemesis.services.get("server") is not None:
        nemesis.line(ev, "skipped", why="the store decides by its server's clock, which a run cannot step")
        return True
    waited_out = elapsed - float(ev["at"]) > TARGET_WAIT
    writes = nemesis.writes
    awaited = steps.awaited
    # steps keep their order: a step forward overtaking a step back still waiting for its target
    # would leave the step back nothing to land between
    if not waited_out and any(
        e["fault"] == "wall-step" and float(e["at"]) < float(ev["at"]) for e in nemesis.pending
    ):
        return False
    # the last step was placed before a write: no other step until that write has read the clock
    pending = awaited and writes and not any(writes.written_since(w, steps.stepped_ns) for w in awaited)
    if pending and not waited_out:
        return False
    # a step proves most when it lands on a pass mid-step, whose lease it must not lapse
    targets: dict[str, str] = {}
    if ev.get("after_write") and writes is not None:
        # minus a second: the step's own record must still come within the step's size
        targets = writes.busy_after_write(steps.stepped_ns, max(0.5, abs(float(ev["seconds"])) - 1.0))
        ready = set(targets)
    else:
        ready = nemesis.busy("step")
    if not ready - nemesis.stopped and not waited_out:
        return False
    offset = wall_offset(nemesis).move(float(ev["seconds"]))
    steps.stepped_ns = time.monotonic_ns()  # a write invoked after this reads the new offset
    stopped = nemesis.stopped
    chosen = {name: wf for name, wf in targets.items() if name not in stopped}
    steps.awaited = set(chosen.values())
    if chosen:  # a stall now would fence the very write this step was placed before
        names = set(chosen)
        steps.spared_workers |= names

        def unspare(names: set[str] = names) -> None:
            steps.spared_workers -= names

        nemesis.active.append(Active(time.monotonic() + SPARE_SECONDS, ev, unspare))
    # store_clock_step: the queue's clock moved too (wd_chaos.checks.queue_calls.queue_steps)
    nemesis.line(ev, "start", offset=offset, store_clock_step=True)
    return True


async def simulate(sim: Any, n: int) -> None:
    """In ``wd-chaos sim``: step the store's virtual wall clock forward or back."""
    seconds = sim.rng.choice((30.0, -3.0, 10.0, -1.0))
    if sim.world.permits(f"{WALL_STEP.name}-{n}"):
        sim.step_wall(WALL_STEP.name, n, seconds)


WALL_STEP = FaultKind(
    "wall-step",
    WallStepFault,
    WallStepEvent,
    plan,
    start,
    detail=("seconds", "offset"),
    simulated="the nemesis steps the store's virtual wall clock forward or back",
    form=SimulatedForm(order=3, share=0.25, inject=simulate),
)
