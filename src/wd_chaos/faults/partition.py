"""The ``partition`` fault: cut one worker from the store through its toxiproxy proxy for
``duration`` seconds. A pass cut past its lease must be refused after the heal
(``partition-refused``)."""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import Field

from without_durability.testing.kit import Capability

from ..checks.bitten import bit, injections, refused_after
from ..checks.core import FENCED_WRITES, Verdict, bite_check, operations
from ..history import Op
from ..rundir import FinalState
from .base import TARGET_WAIT, EventSpec, FaultKind, FaultSpec
from .nemesis import Active, Nemesis
from .toxics import proxies

Mode = Literal["down", "timeout", "latency", "reset_peer"]


class PartitionFault(FaultSpec):
    """Cut one worker from the store through its toxiproxy proxy for ``duration`` seconds."""

    kind: Literal["partition"]
    mode: Mode = "down"
    duration: Annotated[float, Field(gt=0, allow_inf_nan=False, description="a number of seconds > 0")] = 3.0


class PartitionEvent(EventSpec):
    """A scheduled cut: how (toxiproxy's toxic) and for how long."""

    NEEDS = ("duration", "mode")
    fault: Literal["partition"]
    duration: Annotated[float | None, Field(gt=0, le=3600, allow_inf_nan=False)] = None
    mode: Mode | None = None


def plan(fault: PartitionFault, scenario: Any) -> dict[str, object]:
    """The cut's mode and length."""
    return {"mode": fault.mode, "duration": fault.duration}


def start(nemesis: Nemesis, ev: dict[str, Any], elapsed: float) -> bool:
    """Cut a busy worker (the target if busy), or any after ``TARGET_WAIT`` seconds."""
    # like a stall, a cut proves most when it lands on a worker mid-pass
    net = proxies(nemesis)
    busy = sorted(nemesis.busy("step") - nemesis.stopped - net.cut)
    if not busy and elapsed - float(ev["at"]) <= TARGET_WAIT:
        return False
    name = ev["target"] if ev["target"] in busy or not busy else nemesis.rng.choice(busy)
    ppid = nemesis.pids().get(name)
    net.toxi.cut(net.proxies[name], ev["mode"])
    net.cut.add(name)
    nemesis.line({**ev, "target": name}, "start", target_pid=ppid)

    def heal(name: str = name, pid: int | None = ppid, ev: dict[str, Any] = ev) -> None:
        net.toxi.heal(net.proxies[name])
        net.cut.discard(name)
        nemesis.line({**ev, "target": name}, "stop", target_pid=pid)

    nemesis.active.append(Active(time.monotonic() + float(ev["duration"]), ev, heal))
    return True


def heal_all(nemesis: Nemesis) -> None:
    """Heal every proxy."""
    net = proxies(nemesis)
    if net.toxi is not None:
        net.toxi.heal_all()


def requires(fault: PartitionFault) -> frozenset[Capability]:
    """A store reached at one network address, which a proxy can stand in front of."""
    return frozenset({"proxy"})


def services(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Toxiproxy between the workers and the store."""
    return {"partition": True}


@bite_check("partition-refused")
def partition_refused(ops: list[Op], final: FinalState) -> Verdict:
    all_ops = operations(ops)
    windows = injections(ops, "partition")
    hits = refused_after(
        all_ops, windows, FENCED_WRITES, "partitioned past its lease, refused after the heal"
    )
    return bit("partition-refused", hits, len(windows), "write(s) refused after the heal")


PARTITION = FaultKind(
    "partition",
    PartitionFault,
    PartitionEvent,
    plan,
    start,
    requires=requires,
    services=services,
    heal=heal_all,
    color="#f3a712",
    window=True,
    detail=("mode", "duration"),
)
