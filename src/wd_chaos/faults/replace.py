"""The ``replace-stuck`` fault: a worker's replacement starts while the worker is stalled. The nemesis
SIGSTOPs a worker inside a step's effect (as a stall does) and asks the run to start a new process
under the same name beside it, as an orchestrator does once a health check gives up on a stuck
instance that still holds its connections. Where the scenario's ``[workload] identity = "name"``
the new process also takes its predecessor's identity (a Redis stream consumer name), so two live
processes share one. After ``duration`` the predecessor is SIGKILLed (``then = "kill"``: nothing it
held may stay stranded) or SIGCONTed (``then = "resume"``: it wakes beside its replacement, behind
newer takes and claims, and must change nothing).

The cluster does the start (``cluster.Cluster.supervise`` reads the marker this kind leaves in the
run's ``deployed/`` folder): the predecessor stays in its process table under another name
(``stalled-worker-N-PID``), which no fault targets and nothing restarts, and is stopped with the
rest at the end. The bite, ``replaced``, counts replacements that took work (a take or a claim)
while their predecessor was stopped."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Annotated, Any, Literal

from pydantic import Field

from ..checks.bitten import bit, injections
from ..checks.core import Verdict, bite_check, operations
from ..fleet import DEPLOYED, REPLACE_MARKER
from ..history import Op
from ..rundir import FinalState
from .base import EventSpec, FaultKind, FaultSpec, Marker
from .nemesis import Active, KindState, Nemesis
from .stall import in_effect

NAME = "replace-stuck"

Seconds = Annotated[float, Field(gt=0, le=3600, allow_inf_nan=False, description="a number of seconds > 0")]


class ReplaceFault(FaultSpec):
    """Stall a worker inside a step's effect and start its replacement beside it; after
    ``duration``, SIGKILL the stalled one (``then = "kill"``) or SIGCONT it (``"resume"``)."""

    kind: Literal["replace-stuck"]
    duration: Seconds = 3.0
    then: Literal["kill", "resume"] = "kill"


class ReplaceEvent(EventSpec):
    """A scheduled replacement: how long the predecessor stays stopped beside it, and its end."""

    fault: Literal["replace-stuck"]
    duration: Seconds | None = None
    then: Literal["kill", "resume"] | None = None


def plan(fault: ReplaceFault, scenario: Any) -> dict[str, object]:
    """The event's length and what becomes of the stalled predecessor."""
    return {"duration": fault.duration, "then": fault.then}


class Replaced(KindState):
    """A run's replacements under way: the names whose predecessor is stopped now. The
    replacement runs under that name, so no other fault is told it is stopped."""

    def __init__(self) -> None:
        self.workers: set[str] = set()

    def spared(self) -> set[str]:
        return set(self.workers)  # a second replacement of a name waits for the first to end


def setup(nemesis: Nemesis) -> Replaced:
    return Replaced()


def start(nemesis: Nemesis, ev: dict[str, Any], elapsed: float) -> bool:
    """SIGSTOP a worker inside a step's effect and leave the marker that has the cluster start its
    replacement; skip the event when no worker has been inside one for ``TARGET_WAIT`` seconds
    (``stall.in_effect``)."""
    replaced = nemesis.state(NAME, setup)
    name = in_effect(nemesis, ev, elapsed)
    if isinstance(name, bool):
        return name
    pid = nemesis.pids()[name]
    os.kill(pid, signal.SIGSTOP)
    replaced.workers.add(name)
    folder = nemesis.run_dir / DEPLOYED
    folder.mkdir(exist_ok=True)
    (folder / f"{name}{REPLACE_MARKER}").write_text(NAME)  # the cluster's line names the kind
    nemesis.line({**ev, "target": name}, "start", target_pid=pid)

    def end(name: str = name, pid: int = pid, ev: dict[str, Any] = ev) -> None:
        with contextlib.suppress(ProcessLookupError):
            if ev.get("then") == "resume":
                os.kill(pid, signal.SIGCONT)
            else:
                os.kill(pid, signal.SIGKILL)
                os.kill(pid, signal.SIGCONT)  # a stopped process dies only once it runs
        replaced.workers.discard(name)
        nemesis.line({**ev, "target": name}, "stop", target_pid=pid)

    nemesis.active.append(Active(time.monotonic() + float(ev["duration"]), ev, end))
    return True


@bite_check("replaced")
def replaced_bite(ops: list[Op], final: FinalState) -> Verdict:
    """Bit when a replacement (the process the cluster started under a stopped worker's name)
    took or claimed work while its predecessor was stopped: two processes of one name held work
    at once. A replacement that did nothing before its predecessor's end tested nothing."""
    started = {
        int(line["target_pid"]): int(line["restarted_pid"])
        for line in ops
        if line["type"] == "fault" and line.get("fault") == NAME and line.get("phase") == "replaced"
    }
    all_ops = operations(ops)
    windows = injections(ops, NAME)
    hits = []
    for begin, stop in windows:
        new = started.get(int(begin.get("target_pid") or 0))
        if new is None:
            continue
        lo, hi = int(begin["mono"]), float(stop["mono"]) if stop is not None else float("inf")
        took = [
            o
            for o in all_ops
            if o.f in ("take", "claim", "take_and_claim")
            and o.ok
            and int(o.invoke.get("pid") or 0) == new
            and lo < o.start < hi
        ]
        if took:
            hits.append(took[0].brief("the replacement took work while its predecessor was stopped"))
    return bit("replaced", hits, len(windows), "replacement(s) took work beside a stopped predecessor")


REPLACE = FaultKind(
    NAME,
    ReplaceFault,
    ReplaceEvent,
    plan,
    start,
    color="#8e44ad",
    window=True,
    markers=(Marker("replaced"),),
    detail=("duration", "then"),
)
