"""The ``half-open`` fault: toxiproxy's ``timeout`` toxic (with no timeout) on one worker's
connections for ``duration`` seconds: they stay open and take what is written, but nothing gets
through either way, and what was sent meanwhile is dropped, so a call on such a connection is
never answered, not even once the toxic is gone. A store must give up on it (a read timeout), drop
the connection and open another: a pool that waits on it for ever hangs its caller for ever
(which ``no-hung-pass`` fails). Its bite (``half-open-replaced``): a call of that worker that hung
at least ``HUNG`` seconds and failed, followed by a call of the same worker that the store answered, on
a fresh connection."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from ..checks.core import UNKNOWN, Operation, Verdict, bite_check, checker, operations
from ..rundir import FinalState
from .base import EventSpec, FaultKind, FaultSpec
from .toxics import (
    Seconds,
    Window,
    judge,
    network_bite,
    pid_of,
    requires,
    seconds,
    services,
    start_toxics,
    windows,
)

if TYPE_CHECKING:
    from ..history import Op
    from .nemesis import Nemesis

HUNG = 1.0
"""Seconds a failed call must have waited to count as hung on a half-open connection (a refused or
reset connection fails at once)."""


GIVE_UP = 6.0
"""Seconds within which a store must give up a call on a half-open connection: the kits open their
stores with a 5 s timeout (Redis's ``socket_timeout``, Postgres's read timeout), plus 1 s for a
loaded machine. A call still waiting when the toxic was removed, after longer than this, was never
going to end by itself (``half-open-gives-up``)."""

REMOVAL_NS = 1_000_000_000
"""A call that ended less than this before the fault's stop line ended at the toxic's removal (the
line is written once toxiproxy has removed it, and closed the connections)."""

NOT_CALLS = ("effect", "body", "pass")
"""History operations that are not a store call (a step's effect, a workflow body, a pass)."""


class HalfOpenFault(FaultSpec):
    """Make one worker's connections half-open for ``duration`` seconds."""

    kind: Literal["half-open"]
    duration: Seconds = 2.0


class HalfOpenEvent(EventSpec):
    """A scheduled half-open: for how long."""

    NEEDS = ("duration",)
    fault: Literal["half-open"]
    duration: Seconds | None = None


def plan(fault: HalfOpenFault, scenario: Any) -> dict[str, object]:
    """The fault's length."""
    return {"duration": fault.duration}


def start(nemesis: Nemesis, ev: dict[str, Any], elapsed: float) -> bool:
    """Hold (and drop) everything on a busy worker's connections, both ways, for the whole
    ``duration`` even past the workload's end: a half-open shorter than a store's timeout cannot
    tell a store that gives up from one that never does (toxiproxy closes the connections when
    the toxic goes, which ends a call that had no timeout of its own)."""
    toxics = [("timeout", stream, {"timeout": 0}) for stream in ("upstream", "downstream")]
    return start_toxics(nemesis, ev, elapsed, toxics, full=True)


@network_bite(
    "half-open", "half-open-replaced", "call(s) that hung on a half-open connection, then one answered"
)
def replaced(ops: list[Operation], found: list[Window], fields: dict[str, Any]) -> list[dict[str, Any]]:
    """Calls of the worker in flight while its connections were half-open, that failed after
    hanging ``HUNG`` s or more, each followed by a call of that worker the store answered (ok, or
    refused: either way a working connection)."""
    hits = []
    for begin, end, pid in found:
        mine = [o for o in ops if pid_of(o) == pid]
        for o in mine:
            if not (
                o.start < end and o.end > begin and o.complete is not None and not o.ok and seconds(o) >= HUNG
            ):
                continue
            after = [x for x in mine if x.determinate and x.start > o.end]
            if after:
                hits.append(
                    o.brief(
                        f"hung {seconds(o):.1f}s on a half-open connection of pid {pid}, failed "
                        f"({o.got('error')}); its next call was answered"
                    )
                )
                break
    return hits


@bite_check("half-open-replaced")
def half_open_replaced(ops: list[Op], final: FinalState) -> Verdict:
    return judge(ops, "half-open")


@checker("half-open-gives-up")
def gives_up(ops: list[Op], final: FinalState) -> Verdict:
    """No store call waits on a half-open connection for ever: no call of a worker, invoked while
    its connections were half-open, waited longer than ``GIVE_UP`` s and ended only when the toxic
    was removed (toxiproxy closes the connections then, which ends a call that had no timeout of its
    own). Unknown when no half-open lasted longer than ``GIVE_UP`` s: nothing was judged."""
    calls = [o for o in operations(ops) if o.f not in NOT_CALLS]
    judged = [
        (b, e, p) for b, e, p in windows(ops, "half-open") if e != float("inf") and (e - b) / 1e9 > GIVE_UP
    ]
    if not judged:
        return Verdict(
            "half-open-gives-up",
            UNKNOWN,
            f"not judged: no half-open lasted longer than {GIVE_UP:g}s",
            [],
            {"judged": 0},
        )
    hung = [
        o.brief(
            f"waited {min(seconds(o), (end - o.start) / 1e9 + 1):.1f}s on a half-open connection, until the toxic went"
        )
        for begin, end, pid in judged
        for o in calls
        if pid_of(o) == pid and begin <= o.start < end and o.end > end - REMOVAL_NS and seconds(o) > GIVE_UP
    ]
    counts = {"judged": len(judged), "hung": len(hung)}
    if hung:
        return Verdict(
            "half-open-gives-up",
            False,
            f"{len(hung)} call(s) waited on a half-open connection past {GIVE_UP:g}s: the store has no timeout",
            hung,
            counts,
        )
    return Verdict(
        "half-open-gives-up",
        True,
        f"every call on a half-open connection gave up within {GIVE_UP:g}s ({len(judged)} half-open(s))",
        [],
        counts,
    )


HALF_OPEN = FaultKind(
    "half-open",
    HalfOpenFault,
    HalfOpenEvent,
    plan,
    start,
    requires=requires,
    services=services,
    color="#76b7b2",
    window=True,
    detail=("duration",),
)
