"""The ``wall-step`` fault's ``after_write``: a step back waits for a pass mid-step whose workflow
took a write since the step before, so that workflow's next record lands across it (lease-stall's
step back; without it the step back fired in the same tick as the step forward and no write sat
between them)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from wd_chaos.faults import Nemesis
from wd_chaos.history import HistoryWriter
from wd_chaos.runner import Watch
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
    assert watch.busy_after_write(0, 2.0) == {"worker-0"}
    assert watch.busy_after_write(time.monotonic_ns(), 2.0) == set(), "written before the step"
    time.sleep(0.05)
    assert watch.busy_after_write(0, 0.01) == set(), "written too long ago for the step's size"


def _steps(tmp_path: Path, written: Any) -> tuple[Nemesis, list[float]]:
    events = [e for e in plan(find("lease-stall"), 1, 4, 8.0) if e["fault"] == "wall-step"]
    assert [(e["seconds"], e.get("after_write")) for e in events] == [(30.0, None), (-3.0, True), (30.0, None)]
    hist = HistoryWriter(tmp_path / "controller.jsonl", "controller")
    nemesis = Nemesis(events, hist, tmp_path, pids=dict, busy=lambda _: {"worker-0"}, written=written, seed=1)
    offsets = []
    for elapsed in (2.6, 4.1, 4.2):
        nemesis.tick(elapsed)
        offsets.append(float((tmp_path / WALL_OFFSET).read_text()))
    return nemesis, offsets


def test_the_step_back_waits_for_a_write_since_the_step_forward(tmp_path: Path) -> None:
    asked: list[tuple[int, float]] = []
    ready: set[str] = set()

    def written(since_ns: int, within: float) -> set[str]:
        asked.append((since_ns, within))
        return set(ready)

    events = [e for e in plan(find("lease-stall"), 1, 4, 8.0) if e["fault"] == "wall-step"]
    nemesis = Nemesis(
        events,
        HistoryWriter(tmp_path / "controller.jsonl", "controller"),
        tmp_path,
        pids=dict,
        busy=lambda _: {"worker-0"},
        written=written,
        seed=1,
    )
    nemesis.tick(2.6)
    forward = nemesis.wall_stepped_ns
    assert forward > 0 and float((tmp_path / WALL_OFFSET).read_text()) == 30.0
    nemesis.tick(4.1)
    assert float((tmp_path / WALL_OFFSET).read_text()) == 30.0, "stepped back with no write to land across"
    assert asked == [(forward, 2.0)]
    ready.add("worker-0")
    nemesis.tick(4.2)
    assert float((tmp_path / WALL_OFFSET).read_text()) == 27.0
    assert nemesis.wall_stepped_ns > forward


def test_without_a_watch_of_writes_a_step_back_takes_any_pass_mid_step(tmp_path: Path) -> None:
    _, offsets = _steps(tmp_path, None)
    assert offsets == [30.0, 27.0, 27.0]
