"""The ``power-loss`` fault: the store's data lives on a LazyFS mount (``wd_chaos.control.lazyfs``,
mounted by the controller and handed down as a ``Mount``) that holds every write until its file is
fsynced; at the fault the store's processes are SIGKILLed (the server,
or every process that has a SQLite file open), every unsynced write is dropped, and the store is
started again on what was synced. A SIGKILL alone keeps the page cache, so only this fault can show
a store that acknowledges a write before it is on the disk.

The kill is set off from inside the file system, at the next write any process makes under the
mount (within ``wait`` seconds): the power goes while that write is unsynced, the moment a store
that fsyncs before it acknowledges must survive and one that does not cannot. It bit when it dropped
bytes (``power-loss-dropped``): a drop of nothing proves nothing.
"""

from __future__ import annotations

import contextlib
import html
import os
import time
from typing import TYPE_CHECKING, Annotated, Any, Literal, Protocol

from pydantic import Field

from without_durability.testing.kit import Capability

from ..checks.bitten import bit
from ..checks.core import Verdict, bite_check
from ..rundir import FinalState
from .base import TARGET_WAIT, EventSpec, FaultKind, FaultSpec, Marker

if TYPE_CHECKING:
    from ..history import Op
    from .nemesis import Nemesis

DEATH_WAIT = 10.0
"""Seconds the fault waits for the killed processes to be gone before it drops anything."""


OTHERS_WAIT = 15.0
"""Seconds a power loss waits past its time for the store to take writes (one acknowledged in the
last 2 s), and under a file store (no server) for the run's processes
other than workers (which the run would not restart) to finish, before it goes ahead (or, with
such processes still running, is skipped)."""


class PowerLossFault(FaultSpec):
    """Cut the power under the store: kill its processes, drop every unsynced write, restart it."""

    kind: Literal["power-loss"]
    relaxed: bool = False
    """Run the store in its relaxed durability setting (SQLite ``synchronous=NORMAL``, Postgres
    ``synchronous_commit=off``, Redis ``appendfsync everysec``): acknowledged writes may be lost."""
    wait: Annotated[float, Field(gt=0, le=60)] = TARGET_WAIT
    """The most seconds the cut waits for a write to land on (then it cuts anyway)."""


class PowerLossEvent(EventSpec):
    """A scheduled power loss under the store."""

    fault: Literal["power-loss"]
    relaxed: bool | None = None
    wait: float | None = None


def plan(fault: PowerLossFault, scenario: Any) -> dict[str, object]:
    """The store is the target; the durability setting and the wait go with the event."""
    return {"target": "store", "relaxed": fault.relaxed, "wait": fault.wait}


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (a zombie has closed its files)."""
    import psutil

    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def _group_alive(groups: set[int]) -> list[int]:
    import psutil

    found = []
    for proc in psutil.process_iter(["status"]):
        with contextlib.suppress(OSError, psutil.Error):
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) in groups:
                found.append(proc.pid)
    return found


def wait_dead(pids: list[int], timeout: float = DEATH_WAIT) -> list[int]:
    """Wait until ``pids`` and every member of their process groups are gone (a zombie has closed
    its files); returns those still alive after ``timeout``."""
    groups = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            groups.add(os.getpgid(pid))
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in pids if alive(p)] + _group_alive(groups)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.02)


class Amount(Protocol):
    """What a drop would lose or did: ``bytes`` written since each file's last sync and the
    ``files`` holding them."""

    @property
    def bytes(self) -> int: ...

    @property
    def files(self) -> int: ...


class Mount(Protocol):
    """What this fault needs of the file system the store's data lives on: the controller mounts
    it (``wd_chaos.control.lazyfs.LazyFS``) and hands it down as the run's ``lazyfs`` service."""

    def pending(self) -> Amount: ...

    def cut_power(self, pids: list[int], timeout: float) -> bool: ...

    def drop(self) -> Amount: ...


class PowerLosses:
    """A run's power losses: the LazyFS the store's data lives on, the store's server (None: a
    file store), and when the last power loss ended (monotonic ns; the next waits for writes
    after it)."""

    def __init__(self, lazyfs: Mount | None, server: Any) -> None:
        self.lazyfs = lazyfs
        self.server = server
        self.last_cut = 0


def setup(nemesis: Nemesis) -> PowerLosses:
    """The run's power-loss state, from its ``lazyfs`` and ``server`` services."""
    return PowerLosses(nemesis.services.get("lazyfs"), nemesis.services.get("server"))


def _writing(nemesis: Nemesis, within: float = 2.0) -> bool:
    """Whether the store acknowledged a write in the last ``within`` seconds, and since the last
    power loss (the run's watch's ``last_write``: workflow -> (invoked, acknowledged) monotonic
    ns); True when there is no watch."""
    last = getattr(nemesis.writes, "last_write", None)
    if last is None:
        return True
    now, since = time.monotonic_ns(), nemesis.state("power-loss", setup).last_cut
    return any(acked > since and now - acked < within * 1e9 for _invoked, acked in list(last.values()))


def _victims(nemesis: Nemesis) -> list[int]:
    """The processes holding the store's files: the server and its children, or (no server: a
    SQLite file) every live process of the run."""
    import psutil

    server = nemesis.state("power-loss", setup).server
    if server is None:
        return sorted(pid for pid in nemesis.pids().values() if alive(pid))
    pids = [int(server.pid)]
    with contextlib.suppress(psutil.Error):
        pids += [c.pid for c in psutil.Process(server.pid).children(recursive=True)]
    return pids


def start(nemesis: Nemesis, ev: dict[str, Any], elapsed: float) -> bool:
    """Kill the store's processes at a write, drop what was not synced, start the server again
    (the run's supervisor restarts killed workers), logging both ends."""
    state = nemesis.state("power-loss", setup)
    lazy = state.lazyfs
    if lazy is None:  # services() mounts it for every run with this kind; a harness bug otherwise
        raise RuntimeError("a power-loss event in a run whose store is not on a LazyFS mount")
    late = elapsed >= float(ev["at"]) + OTHERS_WAIT
    if not _writing(nemesis) and not late:
        return False  # the store is not taking writes yet (workers still starting): nothing at stake
    if state.server is None:
        # every process with the file open dies with the power, and the run restarts only its
        # workers: the cut waits for the others (the outside writers) to finish their work
        others = [n for n, pid in nemesis.pids().items() if not n.startswith("worker") and alive(pid)]
        if others and not late:
            return False
        if others:
            nemesis.line(
                ev, "skipped", why=f"{', '.join(sorted(others))} still running {OTHERS_WAIT:g} s past the cut"
            )
            return True
    pending = lazy.pending()
    if ev.get("relaxed") and pending.bytes == 0 and not late:
        # a relaxed store loses what it acknowledged since its last fsync: a cut just after one
        # (nothing pending) can lose only the write that sets it off, never acknowledged, and the
        # run would show no loss to count; wait for a write to sit unsynced
        return False
    victims = _victims(nemesis)
    nemesis.line(ev, "start", target_pids=victims, pending_bytes=pending.bytes, ends_sessions=True)
    on_write = lazy.cut_power(victims, float(ev.get("wait") or TARGET_WAIT))
    left = wait_dead(victims)
    if left:
        raise RuntimeError(f"power-loss: processes {left} outlived SIGKILL for {DEATH_WAIT:g} s")
    dropped = lazy.drop()
    more: dict[str, Any] = {}
    if state.server is not None:
        state.server.restart(kill=True)
        more["restarted_pid"] = state.server.pid
    state.last_cut = time.monotonic_ns()
    nemesis.line(
        ev, "stop", dropped_bytes=dropped.bytes, dropped_files=dropped.files, on_write=on_write, **more
    )
    return True


def requires(fault: PowerLossFault) -> frozenset[Capability]:
    """A store whose data can be put on the mount, with a relaxed setting."""
    return frozenset({"power-loss"})


def services(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The store's data on a LazyFS mount, relaxed when any event says so."""
    return {"power_loss": {"relaxed": any(bool(e.get("relaxed")) for e in events)}}


@bite_check("power-loss-dropped")
def power_loss_dropped(ops: list[Op], final: FinalState) -> Verdict:
    cuts = [
        line
        for line in ops
        if line["type"] == "fault" and line.get("fault") == "power-loss" and line.get("phase") == "stop"
    ]
    hits = [
        {**c, "why": f"dropped {c['dropped_bytes']} unsynced bytes in {c.get('dropped_files', 0)} file(s)"}
        for c in cuts
        if int(c.get("dropped_bytes") or 0) > 0
    ]
    return bit("power-loss-dropped", hits, len(cuts), "power loss(es) dropped unsynced writes")


def describe(ops: list[Op]) -> str:
    """The bytes each power loss dropped, for the report."""
    cuts = [
        line
        for line in ops
        if line["type"] == "fault" and line.get("fault") == "power-loss" and line.get("phase") == "stop"
    ]
    if not cuts:
        return ""
    total = sum(int(c.get("dropped_bytes") or 0) for c in cuts)
    each = ", ".join(f"{int(c.get('dropped_bytes') or 0):,}" for c in cuts)
    return html.escape(f"{len(cuts)} power loss(es) dropped {total:,} unsynced bytes in all ({each}).")


POWER_LOSS = FaultKind(
    "power-loss",
    PowerLossFault,
    PowerLossEvent,
    plan,
    start,
    requires=requires,
    services=services,
    color="#e85d04",
    window=True,
    markers=(Marker("stop", width=1.2, style="-"),),
    describe=describe,
    detail=("dropped_bytes", "dropped_files", "on_write"),
)
