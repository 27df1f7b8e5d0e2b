"""The nemesis: runs the fault schedule against the workload, and heals everything at the end.

Faults: ``stall`` (SIGSTOP a worker that is inside a step's effect, SIGCONT after the duration),
``kill`` (arm a failpoint; the first worker to reach it SIGKILLs itself and the runner restarts it),
``partition`` (a toxiproxy fault on the proxy between one worker and the store), ``restart`` (the
store server is SIGKILLed and started again on the same data), ``wall-step`` (the wall clock a
process-clock store reads moves by so many seconds in every process, through ``WALL_OFFSET``),
``clock-step`` (the store's own clock steps: see ``clockstep``). Each
writes a ``fault`` line with
``phase`` start and stop (kill: armed by the nemesis, start by the dying worker, stop when the
runner has restarted it) into the controller's history.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import clockstep, failover
from .history import HistoryWriter
from .stores import WALL_OFFSET

TARGET_WAIT = 6.0
"""How long a stall waits for a worker to be inside an effect before giving up on that event."""


@dataclass
class _Active:
    ends: float
    event: dict[str, Any]
    undo: Callable[[], None]


class Nemesis:
    """Executes ``events`` (from ``scenario.plan``) as ``tick`` is called with the elapsed time."""

    def __init__(
        self,
        events: list[dict[str, Any]],
        hist: HistoryWriter,
        run_dir: Path,
        *,
        pids: Callable[[], dict[str, int]],
        busy: Callable[[str], set[str]],
        seed: int,
        toxi: Any = None,
        proxies: dict[str, str] | None = None,
        server: Any = None,
    ) -> None:
        self.pending = sorted(events, key=lambda e: float(e["at"]))
        self.hist = hist
        self.armed = run_dir / "armed"
        self.run_dir = run_dir
        self.wall_offset = 0.0
        self.clock_offset = 0.0  # a server clock's, which clockstep moves
        self.clock_steps = 0
        (self.armed / "taken").mkdir(parents=True, exist_ok=True)
        self.pids = pids
        self.busy = busy
        self.rng = random.Random(f"{seed}:targets")
        self.toxi = toxi
        self.proxies = proxies or {}
        self.server = server
        self.active: list[_Active] = []
        self.count = 0
        self.skipped = 0
        self.stalled: set[str] = set()
        self.cut: set[str] = set()

    def tick(self, elapsed: float) -> None:
        """Start what is due, stop what has run its course."""
        now = time.monotonic()
        for act in [a for a in self.active if a.ends <= now]:
            self.active.remove(act)
            act.undo()
        still = []
        for ev in self.pending:
            if float(ev["at"]) > elapsed or not self._start(ev, elapsed):
                still.append(ev)
        self.pending = still

    def _line(self, ev: dict[str, Any], phase: str, **more: Any) -> None:
        self.hist.event(
            "fault",
            fault=ev["fault"],
            phase=phase,
            id=ev["id"],
            **{k: v for k, v in ev.items() if k not in ("fault", "id")},
            **more,
        )

    def _start(self, ev: dict[str, Any], elapsed: float) -> bool:
        ev = {**ev, "id": f"{ev['fault']}-{self.count}"}
        kind = ev["fault"]
        if kind == "stall":
            candidates = sorted(self.busy(ev.get("inside", "step")) - self.stalled)
            if not candidates:
                if elapsed - float(ev["at"]) > TARGET_WAIT:
                    self.skipped += 1
                    self.count += 1
                    self._line(ev, "skipped", why="no worker was inside an effect")
                    return True
                return False
            name = ev["target"] if ev["target"] in candidates else self.rng.choice(candidates)
            pid = self.pids()[name]
            os.kill(pid, signal.SIGSTOP)
            self.stalled.add(name)
            self._line({**ev, "target": name}, "start", target_pid=pid)

            def cont(name: str = name, pid: int = pid, ev: dict[str, Any] = ev) -> None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
                self.stalled.discard(name)
                self._line({**ev, "target": name}, "stop", target_pid=pid)

            self.active.append(_Active(time.monotonic() + float(ev["duration"]), ev, cont))
        elif kind == "kill":
            (self.armed / f"{ev['failpoint']}.{ev['id']}").touch()
            self._line(ev, "armed")
        elif kind == "partition":
            # like a stall, a cut proves most when it lands on a worker mid-pass
            busy = sorted(self.busy("step") - self.stalled - self.cut)
            if not busy and elapsed - float(ev["at"]) <= TARGET_WAIT:
                return False
            name = ev["target"] if ev["target"] in busy or not busy else self.rng.choice(busy)
            ppid = self.pids().get(name)
            self.toxi.cut(self.proxies[name], ev["mode"])
            self.cut.add(name)
            self._line({**ev, "target": name}, "start", target_pid=ppid)

            def heal(name: str = name, pid: int | None = ppid, ev: dict[str, Any] = ev) -> None:
                self.toxi.heal(self.proxies[name])
                self.cut.discard(name)
                self._line({**ev, "target": name}, "stop", target_pid=pid)

            self.active.append(_Active(time.monotonic() + float(ev["duration"]), ev, heal))
        elif kind == "wall-step":
            # a step proves most when it lands on a pass mid-step, whose lease it must not lapse
            if not self.busy("step") - self.stalled and elapsed - float(ev["at"]) <= TARGET_WAIT:
                return False
            if self.server is not None:
                self._line(
                    ev, "skipped", why="the store decides by its server's clock, which a run cannot step"
                )
            else:
                self.wall_offset += float(ev["seconds"])
                # written aside and renamed, so no process reads a half-written offset
                aside = self.run_dir / f"{WALL_OFFSET}.new"
                aside.write_text(repr(self.wall_offset))
                aside.replace(self.run_dir / WALL_OFFSET)
                self._line(ev, "start", offset=self.wall_offset)
        elif kind == "failover":
            failover.start(self, ev)
        elif kind == clockstep.KIND:
            if not clockstep.start(self, ev, elapsed, TARGET_WAIT):
                return False
        elif kind == "restart":
            self._line(ev, "start", target_pid=self.server.pid)
            self.server.restart(kill=True)
            self._line(ev, "stop", target_pid=self.server.pid)
        self.count += 1
        return True

    def heal(self) -> None:
        """The final heal: end every active fault, disarm failpoints, drop pending events."""
        for act in self.active:
            act.undo()
        self.active.clear()
        for name in self.pending:
            self.hist.event(
                "fault",
                fault=name["fault"],
                phase="skipped",
                at=name["at"],
                why="after the end of the workload phase",
            )
        self.pending.clear()
        for left in self.armed.glob("*.*"):
            if left.is_file():
                left.unlink(missing_ok=True)
                self.hist.event("fault", fault="kill", phase="disarmed", id=left.name)
        if self.toxi is not None:
            self.toxi.heal_all()
        clockstep.heal(self)
        self.hist.event("fault", fault="heal", phase="start")
