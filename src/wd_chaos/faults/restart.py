"""The ``restart`` fault: restart the store server (SIGKILL, then start it on the same data).
Operations fail across it and writes succeed after it (``restart-survived``)."""

from __future__ import annotations

from typing import Any, Literal

from without_durability.testing.kit import Capability

from ..checks.core import WRITES, Verdict, _bit, _windows, bite_check, operations
from ..history import Op
from ..rundir import FinalState
from .base import TARGET_WAIT, EventSpec, FaultKind, FaultSpec
from .nemesis import Nemesis


class RestartFault(FaultSpec):
    """Restart the store server (SIGKILL, then start it on the same data)."""

    kind: Literal["restart"]


class RestartEvent(EventSpec):
    """A scheduled restart of the store server."""

    fault: Literal["restart"]


def plan(fault: RestartFault, scenario: Any) -> dict[str, object]:
    """The store is the target."""
    return {"target": "store"}


def start(nemesis: Nemesis, ev: dict[str, Any], elapsed: float) -> bool:
    """SIGKILL the server and start it again on its data, logging both ends: once a worker is
    inside a step (up to ``TARGET_WAIT`` past its time), since a restart that lands while the
    workers are still starting (seconds of imports on a loaded machine) interrupts no call."""
    if not nemesis.busy("step") and elapsed < float(ev["at"]) + TARGET_WAIT:
        return False
    server = nemesis.services["server"]
    nemesis.line(ev, "start", target_pid=server.pid, ends_sessions=True)
    server.restart(kill=True)
    nemesis.line(ev, "stop", target_pid=server.pid)
    return True


def requires(fault: RestartFault) -> frozenset[Capability]:
    """A server the run starts itself, so it can restart it."""
    return frozenset({"restart"})


def services(events: list[dict[str, Any]]) -> dict[str, Any]:
    """A restartable private server."""
    return {"restart": True}


@bite_check("restart-survived")
def restart_survived(ops: list[Op], final: FinalState) -> Verdict:
    all_ops = operations(ops)
    hits = []
    windows = _windows(ops, "restart")
    for start, stop in windows:
        if stop is None:
            continue
        broken = [
            o
            for o in all_ops
            if o.outcome in ("failed", "unknown") and o.start <= stop["mono"] and o.end >= start["mono"]
        ]
        after = [o for o in all_ops if o.ok and o.f in WRITES and o.start > stop["mono"]]
        if broken and after:
            hits.append(broken[0].brief(f"failed across the restart; {len(after)} writes succeeded after it"))
    return _bit("restart-survived", hits, len(windows), "restart(s) interrupted operations")


RESTART = FaultKind(
    "restart",
    RestartFault,
    RestartEvent,
    plan,
    start,
    requires=requires,
    services=services,
    color="#7b2cbf",
    window=True,
)
