"""The nemesis: runs a concrete fault schedule during a run. Each event is handed, when due, to
its kind's ``start`` (``wd_chaos.faults``, one module per kind); a fault with a duration leaves an
``Active`` whose undo the nemesis runs when it ends; every start, stop or skip writes a ``fault``
line into the controller's history."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from .base import kind, kinds

if TYPE_CHECKING:
    from ..history import HistoryWriter


class Writes(Protocol):
    """What the run's watch knows of writes (``runner.Watch`` is one)."""

    def busy_after_write(self, since_ns: int, within: float) -> dict[str, str]:
        """Workers mid-step (with their workflow) whose workflow took a write invoked after
        ``since_ns`` (monotonic ns) and acknowledged less than ``within`` s ago."""
        ...

    def written_since(self, workflow: str, since_ns: int) -> bool:
        """Whether ``workflow`` took an acknowledged write invoked after ``since_ns``."""
        ...


@dataclass
class Active:
    """A fault under way: ``undo`` runs once the nemesis's clock passes ``ends`` (monotonic s)."""

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
        writes: Writes | None = None,
        toxi: Any = None,
        proxies: dict[str, str] | None = None,
        server: Any = None,
    ) -> None:
        self.pending = sorted(events, key=lambda e: float(e["at"]))
        self.hist = hist
        self.armed = run_dir / "armed"
        self.run_dir = run_dir
        self.wall_offset = 0.0
        self.clock_offset = 0.0  # a server clock's, which the clock-step kind moves
        self.clock_steps = 0
        (self.armed / "taken").mkdir(parents=True, exist_ok=True)
        self.pids = pids
        self.busy = busy
        self.writes = writes
        """Who wrote what, for faults that want to land between two writes (``runner.Watch``)."""
        self.wall_stepped_ns = 0
        """When the last ``wall-step`` was in place (monotonic ns; 0: none yet)."""
        self.wall_awaited: set[str] = set()
        """Workflows whose next write the last ``wall-step`` was placed before (``after_write``)."""
        self.spared: set[str] = set()
        """Workers no stall may stop for now: a ``wall-step`` waits on the write they are about to
        make."""
        self.rng = random.Random(f"{seed}:targets")
        self.toxi = toxi
        self.proxies = proxies or {}
        self.server = server
        self.active: list[Active] = []
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

    def waiting(self, elapsed: float) -> bool:
        """Whether an event already due is still waiting (for a worker inside an effect, say)."""
        return any(float(ev["at"]) <= elapsed for ev in self.pending)

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
        if not kind(ev["fault"]).start(self, ev, elapsed):
            return False
        self.count += 1
        return True

    def heal(self) -> None:
        """The final heal: end every active fault, log the events still pending as skipped, and run
        each kind's own heal (failpoints disarmed, cuts healed, a stepped clock put right)."""
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
        for k in kinds().values():
            if k.heal is not None:
                k.heal(self)
        self.hist.event("fault", fault="heal", phase="start")
