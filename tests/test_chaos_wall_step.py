"""The ``wall-step`` fault's ``after_write``: a step back waits for a pass mid-step whose workflow
took a write since the step before, so that workflow's next record lands across it (lease-stall's
step back; without it the step back fired in the same tick as the step forward and no write sat
between them)."""

from __future__ import annotations

import time
from pathlib import Path

from wd_chaos.control.runner import Watch
from wd_chaos.faults import Nemesis, wall_step
from wd_chaos.history import HistoryWriter
from wd_chaos.scenario import find, plan
from wd_chaos.stores import WALL_OFFSET


def _write(hist: HistoryWriter, wf: str, won: bool = True, f: str = "record") -> None:
    op = hist.invoke(f, workflow=wf, key="k", token=1)
    hist.complete(op, f, "ok", won=won, value={})


def test_watch_names_a_worker_mid_step_on_a_workflow_written_since(tmp_path: Path) -> None:
    hist = HistoryWriter(tmp_path / "worker-0.jsonl", "worker-0")
    other = HistoryWriter(tmp_path / "worker-1.jsonl", "worker-1")
    _write(hist, "a")
    _write(other, "b", won=False)  # a lost write moved nothing
    hist.invoke("effect", workflow="a", key="seen", token=1)
    other.invoke("effect", workflow="b", key="seen", token=1)
    watch = Watch(tmp_path)
    watch.poll()
    assert watch.busy("step") == {"worker-0", "worker-1"}
    assert watch.busy_after_write(0, 2.0) == {"worker-0": "a"}
    now = time.monotonic_ns()
    assert watch.busy_after_write(now, 2.0) == {}, "written before the step"
    time.sleep(0.05)
    assert watch.busy_after_write(0, 0.01) == {}, "written too long ago for the step's size"
    assert watch.written_since("a", 0) and not watch.written_since("a", now)
    assert not watch.written_since("b", 0), "a lost write is no write"


class _Writes:
    """A watch whose answers the test sets: who is mid-step after a write, and what was written."""

    def __init__(self) -> None:
        self.ready: dict[str, str] = {}
        self.asked: list[tuple[int, float]] = []
        self.written: dict[str, int] = {}

    def busy_after_write(self, since_ns: int, within: float) -> dict[str, str]:
        self.asked.append((since_ns, within))
        return dict(self.ready)

    def written_since(self, workflow: str, since_ns: int) -> bool:
        return self.written.get(workflow, 0) > since_ns


def _nemesis(tmp_path: Path, writes: _Writes | None) -> Nemesis:
    events = [e for e in plan(find("lease-stall"), 1, 4, 8.0) if e["fault"] == "wall-step"]
    assert [(e["seconds"], e.get("after_write")) for e in events] == [(30.0, None), (-3.0, True), (30.0, None)]
    hist = HistoryWriter(tmp_path / "controller.jsonl", "controller")
    return Nemesis(events, hist, tmp_path, pids=dict, busy=lambda _: {"worker-0"}, writes=writes, seed=1)


def _offset(tmp_path: Path) -> float:
    return float((tmp_path / WALL_OFFSET).read_text())


def test_the_step_back_lands_between_two_writes_of_one_workflow(tmp_path: Path) -> None:
    writes = _Writes()
    nemesis = _nemesis(tmp_path, writes)
    nemesis.tick(2.6)
    forward = nemesis.state("wall-step", wall_step.setup).stepped_ns
    assert forward > 0 and _offset(tmp_path) == 30.0
    nemesis.tick(4.1)
    assert _offset(tmp_path) == 30.0, "stepped back with no write to land across"
    assert writes.asked == [(forward, 2.0)]
    nemesis.tick(5.6)
    assert _offset(tmp_path) == 30.0, "the step forward due at 5.5 overtook the step back"
    writes.ready = {"worker-0": "a"}
    nemesis.tick(5.65)
    back = nemesis.state("wall-step", wall_step.setup).stepped_ns
    assert _offset(tmp_path) == 27.0 and back > forward
    assert nemesis.spared == {"worker-0"}, "a stall could fence the write the step back awaits"
    nemesis.tick(5.7)
    assert _offset(tmp_path) == 27.0, "stepped again before the write the step back was placed before"
    writes.written["a"] = time.monotonic_ns()
    nemesis.tick(5.8)
    assert _offset(tmp_path) == 57.0
    nemesis.heal()
    assert nemesis.spared == set()


def test_without_a_watch_of_writes_a_step_back_takes_any_pass_mid_step(tmp_path: Path) -> None:
    nemesis = _nemesis(tmp_path, None)
    offsets = []
    for elapsed in (2.6, 4.1, 5.6):
        nemesis.tick(elapsed)
        offsets.append(_offset(tmp_path))
    assert offsets == [30.0, 27.0, 57.0]


def test_a_stall_leaves_alone_a_worker_whose_write_a_step_awaits(tmp_path: Path) -> None:
    events = [e for e in plan(find("lease-stall"), 1, 4, 8.0) if e["fault"] == "stall"][:1]
    hist = HistoryWriter(tmp_path / "controller.jsonl", "controller")
    nemesis = Nemesis(events, hist, tmp_path, pids=dict, busy=lambda _: {"worker-0"}, seed=1)
    nemesis.state("wall-step", wall_step.setup).spared_workers.add("worker-0")
    nemesis.tick(float(events[0]["at"]) + 0.1)  # pids() is empty: stopping anyone would raise
    assert nemesis.pending == events, "stalled the worker a step back was placed before"


def _phase(tmp_path: Path, waiting: bool) -> float:
    """How long ``_workload``'s fault phase (limit 0.2 s) lasts when the one worker makes its first
    call 0.5 s in and an event is (or is not) still waiting for a worker to act on (it starts at
    0.3 s and runs on)."""
    import threading

    from wd_chaos.control.runner import _workload

    class Cluster:
        restarts = 0

        def start(self, role: str, name: str) -> None:
            pass

        def supervise(self) -> None:
            pass

    class Events:
        def __init__(self) -> None:
            self.count = 0
            self.stopped: set[str] = set()
            self.active: list[object] = []

        def waiting(self, elapsed: float) -> bool:
            return waiting and not self.active

        def tick(self, elapsed: float) -> None:
            if waiting and elapsed > 0.3 and not self.active:
                self.active.append(object())  # a fault begun past the limit, never undone here

    def first_call() -> None:
        time.sleep(0.5)
        HistoryWriter(tmp_path / "worker-0.jsonl", "worker-0").invoke("take", visibility=1.0)

    caller = threading.Thread(target=first_call)
    caller.start()
    began = time.monotonic()
    _workload(["worker-0"], 0, 0, 0.2, Cluster(), Watch(tmp_path), Events(), lambda **_: None)  # type: ignore[arg-type]
    took = time.monotonic() - began
    caller.join()
    return took


def test_a_late_worker_stretches_the_phase_for_faults_still_waiting(tmp_path: Path) -> None:
    """Workers importing for seconds on a loaded machine: a fault waiting for one to act, then
    running, gets as long again past the limit (here 0.2 s + 0.5 s), and no more; nothing
    waiting, no stretch."""
    assert 0.65 <= _phase(tmp_path / "waiting", True) < 1.5
    assert _phase(tmp_path / "idle", False) < 0.45
