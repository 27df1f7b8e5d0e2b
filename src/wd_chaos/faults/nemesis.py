"""The nemesis: runs a concrete fault schedule during a run. Each event is handed, when due, to
its kind's ``start`` (``wd_chaos.faults``, one module per kind); a fault with a duration leaves an
``Active`` whose undo the nemesis runs when it ends; every start, stop or skip writes a ``fault``
line into the controller's history.

The nemesis itself is generic: the schedule, the clock (``tick``), the faults under way, the
history, and what the run offers every kind (its processes, its watch of writes, its servers as
``services``). What a kind remembers between its events lives in the kind, as Jepsen's nemesis
protocol has it: the kind's setup makes a per-run state object the first time the kind asks
``Nemesis.state`` for it, its ``start`` (Jepsen's invoke) and ``heal`` (teardown) use it. Kinds
coordinate through what every state may say (``KindState``): the workers it holds stopped, and
those no fault may stop for now."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

from ..history import HistoryWriter
from .base import kind, kinds


class Writes(Protocol):
    """What the run's watch knows of writes (``runner.Watch`` is one)."""

    def busy_after_write(self, since_ns: int, within: float) -> dict[str, str]:
        """Workers mid-step (with their workflow) whose workflow took a write invoked after
        ``since_ns`` (monotonic ns) and acknowledged less than ``within`` s ago."""
        ...

    def written_since(self, workflow: str, since_ns: int) -> bool:
        """Whether ``workflow`` took an acknowledged write invoked after ``since_ns``."""
        ...


S = TypeVar("S")


class KindState:
    """What any kind's per-run state may tell the other kinds (none by default): the workers it
    holds stopped (a stall), which a fault wanting a running worker leaves alone, and the workers
    no fault may stop for now (a wall step waiting on their next write)."""

    def stopped(self) -> set[str]:
        """Workers this kind holds stopped now."""
        return set()

    def spared(self) -> set[str]:
        """Workers this kind asks every other fault not to stop now."""
        return set()


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
        services: Mapping[str, Any] | None = None,
    ) -> None:
        self.pending = sorted(events, key=lambda e: float(e["at"]))
        self.hist = hist
        self.run_dir = run_dir
        self.pids = pids
        self.busy = busy
        self.writes = writes
        """Who wrote what, for faults that want to land between two writes (``runner.Watch``)."""
        self.services: Mapping[str, Any] = dict(services or {})
        """The run's servers as the kinds use them, by name (``server``: the store's server, None
        for a file store; ``toxi`` and ``proxies``: toxiproxy and each worker's proxy; ``lazyfs``:
        a power-loss run's file system). A kind's setup takes what it needs; absent: not started."""
        self.rng = random.Random(f"{seed}:targets")
        self.active: list[Active] = []
        self.count = 0
        self.skipped = 0
        self.states: dict[str, object] = {}
        """Each kind's per-run state (``state``), by its owner's name."""

    def state(self, owner: str, setup: Callable[[Nemesis], S]) -> S:
        """The per-run state ``owner`` keeps (a kind's name, or a name kinds that share one state
        agree on), made by ``setup`` the first time it is asked for; the same object after that."""
        if owner not in self.states:
            self.states[owner] = setup(self)
        return cast(S, self.states[owner])

    @property
    def stopped(self) -> set[str]:
        """Workers some fault holds stopped now (every state's ``KindState.stopped``)."""
        out: set[str] = set()
        for s in self.states.values():
            if isinstance(s, KindState):
                out |= s.stopped()
        return out

    @property
    def spared(self) -> set[str]:
        """Workers some fault asks the others not to stop now (every state's ``KindState.spared``)."""
        out: set[str] = set()
        for s in self.states.values():
            if isinstance(s, KindState):
                out |= s.spared()
        return out

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

    def line(self, ev: dict[str, Any], phase: str, **more: Any) -> None:
        """Write a ``fault`` line for event ``ev`` (with its ``id``) in ``phase``, with ``more``."""
        self.hist.event(
            "fault",
            fault=ev["fault"],
            phase=phase,
            id=ev["id"],
            **{k: v for k, v in ev.items() if k not in ("fault", "id")},
            **more,
        )

    _line = line
    """The name ``line`` had before it was public (kinds written against it still work)."""

    def _start(self, ev: dict[str, Any], elapsed: float) -> bool:
        ev = {**ev, "id": f"{ev['fault']}-{self.count}"}
        if not kind(ev["fault"]).start(self, ev, elapsed):
            return False
        self.count += 1
        return True

    def heal(self) -> None:
        """The final heal: end every active fault, log the events still pending as skipped, and run
        each kind's own heal (failpoints disarmed, cuts healed, a stepped clock put right). One
        that fails (a fault tool that stopped answering) does not keep the others from theirs:
        the first failure is raised once every one has had its turn."""
        failed: list[BaseException] = []
        for act in self.active:
            try:
                act.undo()
            except Exception as exc:
                failed.append(exc)
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
                try:
                    k.heal(self)
                except Exception as exc:
                    failed.append(exc)
        if failed:
            raise failed[0]
        self.hist.event("fault", fault="heal", phase="start")
