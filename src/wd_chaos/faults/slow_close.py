"""The ``slow-close`` fault: toxiproxy's ``limit_data`` and ``slow_close`` toxics on one worker's
connections for ``duration`` seconds: each connection carries ``bytes`` more bytes from the store,
then is closed, and the close reaches the worker only ``delay_ms`` later. Meanwhile a call on it
has a truncated reply and waits: the store must not take the truncated reply for an answer, and
must give the connection up when the close (or its own timeout) arrives. Its bite
(``slow-close-waited``): a call of that worker that waited at least about half the delay on it."""

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

Millis = Annotated[int, Field(ge=1, le=600_000, description="milliseconds")]
Bytes = Annotated[int, Field(ge=1, le=1 << 30, description="bytes")]


class SlowCloseFault(FaultSpec):
    """Close one worker's connections after ``bytes`` from the store, ``delay_ms`` late."""

    kind: Literal["slow-close"]
    delay_ms: Millis = 1500
    bytes: Bytes = 16
    duration: Seconds = 2.0


class SlowCloseEvent(EventSpec):
    """A scheduled slow close: the delay, the bytes let through, and for how long."""

    NEEDS = ("duration", "delay_ms", "bytes")
    fault: Literal["slow-close"]
    duration: Seconds | None = None
    delay_ms: Millis | None = None
    bytes: Bytes | None = None


def plan(fault: SlowCloseFault, scenario: Any) -> dict[str, object]:
    """The close's delay, the bytes let through, and the fault's length."""
    return {"duration": fault.duration, "delay_ms": fault.delay_ms, "bytes": fault.bytes}


def start(nemesis: Nemesis, ev: dict[str, Any], elapsed: float) -> bool:
    """Cut a busy worker's replies after ``bytes``, then delay the close (added in that order, so
    the close ``limit_data`` makes goes through ``slow_close``)."""
    toxics = [
        ("limit_data", "downstream", {"bytes": int(ev["bytes"])}),
        ("slow_close", "downstream", {"delay": int(ev["delay_ms"])}),
    ]
    return start_toxics(nemesis, ev, elapsed, toxics)


@network_bite(
    "slow-close", "slow-close-waited", "call(s) that waited on a cut-short, slowly closed connection"
)
def waited(ops: list[Operation], found: list[Window], fields: dict[str, Any]) -> list[dict[str, Any]]:
    """Calls of the worker in flight while the toxics were on (the toxics land between a call's
    invoke and the start line as often as not), that waited ``WAITED`` s or more: on
    a reply cut short until its connection's late close (they fail), or for a fresh connection
    (they may then succeed, once the toxics are gone)."""
    hits = []
    for begin, end, pid in found:
        for o in ops:
            if (
                pid_of(o) == pid
                and o.start < end
                and o.end > begin
                and o.complete is not None
                and seconds(o) >= WAITED
            ):
                hits.append(
                    o.brief(
                        f"waited {seconds(o):.1f}s on pid {pid}'s cut-short, slowly closed connection ({o.outcome})"
                    )
                )
                break
    return hits


WAITED = 0.7
"""Seconds a call must have waited to count as one that met the slow close (about half the default
delay; a reset or refused connection fails at once, an unhindered call takes milliseconds)."""


@bite_check("slow-close-waited")
def slow_close_waited(ops: list[Op], final: FinalState) -> Verdict:
    return judge(ops, "slow-close")


SLOW_CLOSE = FaultKind(
    "slow-close",
    SlowCloseFault,
    SlowCloseEvent,
    plan,
    start,
    requires=requires,
    services=services,
    color="#ff9da7",
    window=True,
    detail=("delay_ms", "bytes", "duration"),
)
