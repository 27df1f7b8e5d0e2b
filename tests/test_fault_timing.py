"""Faults that must interrupt calls wait (a bounded time) for a worker to be at work: on a loaded
machine workers take seconds to import and start, and a fault that lands before their first call
interrupts nothing, so the run is unknown on every seed (as the gate saw for store-restart)."""

from __future__ import annotations

from pathlib import Path

from wd_chaos.faults import TARGET_WAIT, Nemesis
from wd_chaos.faults.restart import start
from wd_chaos.history import HistoryWriter


class _Server:
    """Stands in for the run's private server process: counts restarts (no server is needed to
    judge when the nemesis asks for one)."""

    pid = 4242

    def __init__(self) -> None:
        self.restarts = 0

    def restart(self, kill: bool) -> None:
        assert kill
        self.restarts += 1


def _nemesis(tmp_path: Path, busy: set[str], server: _Server) -> Nemesis:
    hist = HistoryWriter(tmp_path / "controller.jsonl", "controller")
    return Nemesis([], hist, tmp_path, pids=dict, busy=lambda _: busy, seed=1, services={"server": server})


def test_a_restart_waits_for_a_worker_at_work_then_goes_anyway(tmp_path: Path) -> None:
    server, busy = _Server(), set[str]()
    nemesis = _nemesis(tmp_path, busy, server)
    ev = {"fault": "restart", "index": 0, "at": 5.0, "target": "store", "id": 0}
    assert start(nemesis, ev, 5.0) is False and server.restarts == 0, "restarted with no worker at work"
    busy.add("worker-1")
    assert start(nemesis, ev, 5.5) is True and server.restarts == 1
    busy.clear()
    assert start(nemesis, ev, 5.0 + TARGET_WAIT + 0.1) is True and server.restarts == 2, "waited for ever"
