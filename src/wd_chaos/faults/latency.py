"""The ``latency`` fault: toxiproxy's ``latency`` toxic (``ms`` each way, give or take ``spread`` ms)
on one worker's connections for ``duration`` seconds. Long enough, a pass's renewals arrive after
its lease lapsed: another worker takes the workflow over while the slow one still runs, and the
fence must refuse the slow one's writes. Its bite (``latency-lapsed``): a takeover while the
latency was on, of a workflow the slowed worker held when it began."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

from ..checks.core import Operation, Verdict, bite_check
from ..rundir import FinalState
from .base import EventSpec, FaultKind, FaultSpec
from .toxics import Seconds, Window, judge, network_bite, pid_of, requires, services, start_toxics

if TYPE_CHECKING:
    from ..history import Op
    from .nemesis import Nemesis

Millis = Annotated[int, Field(ge=0, le=600_000, description="milliseconds")]


class LatencyFault(FaultSpec):
    """Slow one worker's connections by ``ms`` each way (give or take ``spread``) for ``duration``."""

    kind: Literal["latency"]
    ms: Millis = 1500
    spread: Millis = 300
    """The toxic's jitter (ms); ``jitter`` is the schedule's, as for every kind."""
    duration: Seconds = 4.0


class LatencyEvent(EventSpec):
    """A scheduled latency: how much, and for how long."""

    NEEDS = ("duration", "ms")
    fault: Literal["latency"]
    duration: Seconds | None = None
    ms: Millis | None = None
    spread: Millis | None = None


def plan(fault: LatencyFault, scenario: Any) -> dict[str, object]:
    """The toxic's latency and jitter (``spread`` in the event) and the fault's length."""
    return {"duration": fault.duration, "ms": fault.ms, "spread": fault.spread}


def start(nemesis: Nemesis, ev: dict[str, Any], elapsed: float) -> bool:
    """Slow both directions of the proxy of a worker inside a step (waiting for one however long:
    only a worker holding a claim can lose its lease), for the whole ``duration`` even past the
    workload's end: a takeover waits for the lease and the delivery's visibility to run out."""
    attributes = {"latency": int(ev["ms"]), "jitter": int(ev.get("spread") or 0)}
    toxics = [("latency", stream, attributes) for stream in ("upstream", "downstream")]
    return start_toxics(nemesis, ev, elapsed, toxics, full=True)


@network_bite(
    "latency", "latency-lapsed", "takeover(s) of a slowed worker's workflow while the latency was on"
)
def lapsed(ops: list[Operation], found: list[Window], fields: dict[str, Any]) -> list[dict[str, Any]]:
    """Claims by another process, asked for or granted inside a window, of a workflow whose latest
    claim before the window was the slowed worker's, which had not asked to release it by the time
    the claim was granted: its lease lapsed under the latency.

    A claim asked for inside the window may be granted only after it: on Postgres it waits for the
    row lock of the slowed worker's open transaction, which commits once the toxic is removed."""
    claims = sorted((o for o in ops if o.f in ("claim", "take_and_claim") and o.ok), key=lambda o: o.end)
    releases = [o for o in ops if o.f == "release"]
    hits = []
    for begin, end, pid in found:
        held: dict[str, Operation] = {}
        for c in claims:
            if c.end < begin and c.workflow is not None:
                held[c.workflow] = c
        for c in claims:
            mine = held.get(c.workflow) if c.workflow is not None else None
            if (
                mine is not None
                and pid_of(mine) == pid
                and pid_of(c) != pid
                and (begin < c.end < end or begin < c.start < end)
                and not any(
                    pid_of(r) == pid and r.workflow == c.workflow and mine.start < r.start < c.end
                    for r in releases
                )
            ):
                hits.append(c.brief(f"took over a workflow of pid {pid} while its connections were slowed"))
                break
    return hits


@bite_check("latency-lapsed")
def latency_lapsed(ops: list[Op], final: FinalState) -> Verdict:
    return judge(ops, "latency")


LATENCY = FaultKind(
    "latency",
    LatencyFault,
    LatencyEvent,
    plan,
    start,
    requires=requires,
    services=services,
    color="#b07aa1",
    window=True,
    detail=("ms", "spread", "duration"),
    simulated="the wire delays every store call's request and reply",
)
