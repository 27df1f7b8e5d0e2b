"""The ``restart`` fault: restart the store server (SIGKILL, then start it on the same data).
Operations fail across it and writes succeed after it (``restart-survived``).

A restart with ``after = "takeover"`` is a second fault timed from the history: it waits for a
worker killed at a failpoint (its ``kill`` line) and then for another worker's first call on the
dead worker's workflow (the takeover under way), and restarts the store then, so recovery meets a
store that goes away under it. The window ``restart-during-takeover`` counts restarts that began
after a kill and before another process had taken its workflow over and let it go."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from without_durability.testing.kit import Capability

from ..checks.bitten import bit, injections
from ..checks.core import WRITES, Operation, Verdict, bite_check, operations
from ..checks.coverage import window
from ..history import Op, Tail
from ..rundir import FinalState
from .base import TARGET_WAIT, EventSpec, FaultKind, FaultSpec
from .nemesis import Nemesis


class RestartFault(FaultSpec):
    """Restart the store server (SIGKILL, then start it on the same data)."""

    kind: Literal["restart"]
    after: Literal["takeover"] | None = None
    """``"takeover"``: wait (from ``at``, up to ``TAKEOVER_WAIT``) for a worker killed at a
    failpoint and another worker's first call on its workflow, and restart then."""
    delay: Annotated[float, Field(ge=0, le=10)] = 0.0
    """With ``after``: seconds from the takeover's first call to the restart."""
    down: Annotated[float, Field(ge=0, le=30)] = 0.0
    """Seconds the server stays down before it is started again (0: at once)."""


class RestartEvent(EventSpec):
    """A scheduled restart of the store server."""

    fault: Literal["restart"]
    after: Literal["takeover"] | None = None
    delay: float | None = None
    down: float | None = None


TAKEOVER_WAIT = 15.0
"""How long past its time a restart ``after = "takeover"`` waits for a takeover before it
restarts anyway (its ``restart-during-takeover`` window then stays unreached)."""


def plan(fault: RestartFault, scenario: Any) -> dict[str, object]:
    """The store is the target; a restart timed from a takeover says so."""
    more: dict[str, object] = {"after": fault.after, "delay": fault.delay} if fault.after else {}
    return {"target": "store", **more, **({"down": fault.down} if fault.down else {})}


@dataclass
class Takeovers:
    """What the restart kind reads of the workers' histories while the run goes: each worker
    killed at a failpoint (workflow, when, which process), and the takeovers that began since."""

    folder: Path
    tails: dict[Path, Tail] = field(default_factory=dict)
    kills: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Workflow -> (mono ns, pid) of the last kill at a failpoint that named it."""
    begun: dict[str, tuple[int, str]] = field(default_factory=dict)
    """Workflow -> (mono ns of the first call, the kill's id) of a takeover not yet restarted on."""
    used: set[str] = field(default_factory=set)
    """Kill ids a restart was already timed from."""

    def poll(self) -> None:
        for path in self.folder.glob("worker-*.jsonl"):
            for line in self.tails.setdefault(path, Tail(path)).read():
                wf = line.get("workflow")
                if wf is None:
                    continue
                wf, mono, pid = str(wf), int(line["mono"]), int(line.get("pid") or 0)
                if line["type"] == "fault" and line.get("fault") == "kill" and line.get("phase") == "start":
                    self.kills[wf] = (mono, pid)
                    self.begun.pop(wf, None)
                elif line["type"] == "invoke" and wf in self.kills and wf not in self.begun:
                    killed_at, killed = self.kills[wf]
                    kill_id = f"{wf}@{killed_at}"
                    if pid != killed and mono > killed_at and kill_id not in self.used:
                        self.begun[wf] = (mono, kill_id)

    def due(self, delay: float) -> tuple[str, str] | None:
        """A takeover begun at least ``delay`` s ago (workflow, kill id), marked used; else None."""
        now = time.monotonic_ns()
        for wf, (began, kill_id) in sorted(self.begun.items(), key=lambda kv: kv[1][0]):
            if now - began >= delay * 1e9:
                self.used.add(kill_id)
                del self.begun[wf]
                return wf, kill_id
        return None


def setup(nemesis: Nemesis) -> Takeovers:
    """The run's workers' histories, read as they grow."""
    return Takeovers(nemesis.run_dir / "procs")


def start(nemesis: Nemesis, ev: dict[str, Any], elapsed: float) -> bool:
    """SIGKILL the server and start it again on its data, logging both ends: once a worker is
    inside a step (up to ``TARGET_WAIT`` past its time), since a restart that lands while the
    workers are still starting (seconds of imports on a loaded machine) interrupts no call; with
    ``after = "takeover"``, once a takeover of a killed worker's workflow is under way (up to
    ``TAKEOVER_WAIT`` past its time, then anyway)."""
    more: dict[str, object] = {}
    if ev.get("after") == "takeover":
        takeovers = nemesis.state("restart", setup)
        takeovers.poll()
        found = takeovers.due(float(ev.get("delay") or 0.0))
        if found is None and elapsed < float(ev["at"]) + TAKEOVER_WAIT:
            return False
        more = {"workflow": found[0], "kill": found[1]} if found else {"why": "no takeover came"}
    elif not nemesis.busy("step") and elapsed < float(ev["at"]) + TARGET_WAIT:
        return False
    server = nemesis.services["server"]
    nemesis.line(ev, "start", target_pid=server.pid, ends_sessions=True, **more)
    down = float(ev.get("down") or 0.0)
    server.restart(kill=True, **({"down": down} if down else {}))
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
    windows = injections(ops, "restart")
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
    return bit("restart-survived", hits, len(windows), "restart(s) interrupted operations")


@window("restart-during-takeover")
def restart_during_takeover(ops: list[Operation], lines: list[Op]) -> int:
    """A store restart begun after a worker was killed at a failpoint and before another process had taken its workflow over and released it."""
    kills = [
        (int(k["mono"]), int(k.get("pid") or 0), str(k["workflow"]))
        for k in lines
        if k["type"] == "fault"
        and k.get("fault") == "kill"
        and k.get("phase") == "start"
        and k.get("workflow")
    ]
    releases: dict[str, list[Operation]] = {}
    for o in ops:
        if o.f == "release" and o.ok and o.workflow is not None:
            releases.setdefault(o.workflow, []).append(o)
    hits = 0
    for begin, _ in injections(lines, "restart"):
        at = int(begin["mono"])
        for killed_at, pid, wf in kills:
            done = min(
                (
                    r.end
                    for r in releases.get(wf, [])
                    if r.start > killed_at and int(r.invoke.get("pid") or 0) != pid
                ),
                default=float("inf"),
            )
            if killed_at < at <= done:
                hits += 1
                break
    return hits


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
    detail=("after", "down", "workflow"),
)
