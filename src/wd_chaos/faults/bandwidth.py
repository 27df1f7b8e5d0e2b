"""The ``bandwidth`` fault: toxiproxy's ``bandwidth`` toxic (``kb_per_s`` each way) on one worker's
connections for ``duration`` seconds: every reply trickles, a load of a long history most. Its bite
(``bandwidth-slowed``): a call of that worker, made while the toxic was on, that took ``SLOWER``
times the slowest of the same calls made outside every network fault."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

from ..checks.core import Operation, Verdict, bite_check
from ..rundir import FinalState
from .base import EventSpec, FaultKind, FaultSpec
from .toxics import Seconds, Window, judge, network_bite, pid_of, requires, seconds, services, start_toxics

if TYPE_CHECKING:
    from ..history import Op
    from .nemesis import Nemesis

Rate = Annotated[int, Field(ge=1, le=1 << 30, description="kilobytes a second")]

SLOWER = 3.0
FLOOR = 0.1
"""A slowed call took ``SLOWER`` times the usual (its kind's median outside the toxic) and at least
``FLOOR`` seconds: a trickle, not the machine's noise (at 1 KB/s even an empty take's
~150 bytes each way take 0.15 s)."""


class BandwidthFault(FaultSpec):
    """Limit one worker's connections to ``kb_per_s`` each way for ``duration`` seconds."""

    kind: Literal["bandwidth"]
    kb_per_s: Rate = 1
    duration: Seconds = 3.0


class BandwidthEvent(EventSpec):
    """A scheduled bandwidth limit: the rate, and for how long."""

    NEEDS = ("duration", "kb_per_s")
    fault: Literal["bandwidth"]
    duration: Seconds | None = None
    kb_per_s: Rate | None = None


def plan(fault: BandwidthFault, scenario: Any) -> dict[str, object]:
    """The rate and the fault's length."""
    return {"duration": fault.duration, "kb_per_s": fault.kb_per_s}


def start(nemesis: Nemesis, ev: dict[str, Any], elapsed: float) -> bool:
    """Limit both directions of a busy worker's proxy."""
    attributes = {"rate": int(ev["kb_per_s"])}
    toxics = [("bandwidth", stream, attributes) for stream in ("upstream", "downstream")]
    return start_toxics(nemesis, ev, elapsed, toxics)


@network_bite("bandwidth", "bandwidth-slowed", "call(s) slowed by the bandwidth limit")
def slowed(ops: list[Operation], found: list[Window], fields: dict[str, Any]) -> list[dict[str, Any]]:
    """Calls of the limited worker in flight inside a window that took ``SLOWER`` times their kind's
    median outside every window (and at least ``FLOOR`` s)."""
    inside = [(b, e, p) for b, e, p in found]
    usual: dict[str, list[float]] = {}
    for o in ops:
        if o.ok and not any(b <= o.start < e for b, e, _ in inside):
            usual.setdefault(o.f, []).append(seconds(o))
    medians = {f: sorted(v)[len(v) // 2] for f, v in usual.items()}
    hits = []
    for begin, end, pid in found:
        for o in ops:
            took = seconds(o)
            median = medians.get(o.f)
            if (
                pid_of(o) == pid
                and o.start < end
                and o.end > begin
                and o.complete is not None
                and median is not None
                and took >= max(FLOOR, SLOWER * median)
            ):
                hits.append(o.brief(f"took {took:.2f}s against a usual {median:.3f}s, under the limit"))
                break
    return hits


@bite_check("bandwidth-slowed")
def bandwidth_slowed(ops: list[Op], final: FinalState) -> Verdict:
    return judge(ops, "bandwidth")


BANDWIDTH = FaultKind(
    "bandwidth",
    BandwidthFault,
    BandwidthEvent,
    plan,
    start,
    requires=requires,
    services=services,
    color="#edc948",
    window=True,
    detail=("kb_per_s", "duration"),
)
