"""The ``reset`` fault: toxiproxy's ``reset_peer`` toxic on one worker's connections for
``duration`` seconds: every connection of that worker, those in the middle of a call included, is
reset (TCP RST) ``after_ms`` after the toxic lands or the data arrives. A write whose connection is
reset after it was sent may or may not have committed: its outcome is unknown, and the checkers
must allow either. Its bite (``reset-unknown``): a call of the reset worker whose outcome became
unknown while the toxic was on."""

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

GRACE_NS = 1_000_000_000
"""How long after the toxic's removal a call's failure still counts as the reset's (the client
notices a reset connection on its next read)."""


class ResetFault(FaultSpec):
    """Reset one worker's connections (``after_ms`` after data, 0: at once) for ``duration`` s."""

    kind: Literal["reset"]
    after_ms: Millis = 0
    duration: Seconds = 2.0


class ResetEvent(EventSpec):
    """A scheduled reset: after how long, and for how long."""

    NEEDS = ("duration", "after_ms")
    fault: Literal["reset"]
    duration: Seconds | None = None
    after_ms: Millis | None = None


def plan(fault: ResetFault, scenario: Any) -> dict[str, object]:
    """The toxic's delay and the fault's length."""
    return {"duration": fault.duration, "after_ms": fault.after_ms}


def start(nemesis: Nemesis, ev: dict[str, Any], elapsed: float) -> bool:
    """Reset a busy worker's connections, both ways."""
    attributes = {"timeout": int(ev["after_ms"])}
    toxics = [("reset_peer", stream, attributes) for stream in ("upstream", "downstream")]
    return start_toxics(nemesis, ev, elapsed, toxics)


@network_bite("reset", "reset-unknown", "call(s) whose outcome became unknown at a reset")
def unknown_at_reset(
    ops: list[Operation], found: list[Window], fields: dict[str, Any]
) -> list[dict[str, Any]]:
    """Calls of the reset worker, in flight while the toxic was on, that completed as unknown."""
    hits = []
    for begin, end, pid in found:
        for o in ops:
            if (
                pid_of(o) == pid
                and o.complete is not None
                and o.outcome == "unknown"
                and o.start < end
                and begin <= o.end <= end + GRACE_NS
            ):
                hits.append(o.brief(f"in flight at a reset of pid {pid}'s connections: {o.got('error')}"))
    return hits


@bite_check("reset-unknown")
def reset_unknown(ops: list[Op], final: FinalState) -> Verdict:
    return judge(ops, "reset")


RESET = FaultKind(
    "reset",
    ResetFault,
    ResetEvent,
    plan,
    start,
    requires=requires,
    services=services,
    color="#9c755f",
    window=True,
    detail=("after_ms", "duration"),
)
