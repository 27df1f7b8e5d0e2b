"""The ``replace-stuck`` fault (``identity-reuse``): a stuck worker's replacement starts beside it under
its name. The nemesis's half stops a real process and asks for the replacement; the bite says yes
only when the replacement took work while its predecessor was stopped."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from wd_chaos.checks import core
from wd_chaos.faults import Active, replace
from wd_chaos.fleet import DEPLOYED, REPLACE_MARKER
from wd_chaos.history import Op
from wd_chaos.scenario import ScenarioError, find, parse


class _Nemesis:
    """What the replace fault uses of the nemesis."""

    def __init__(self, run_dir: Path, pids: dict[str, int]) -> None:
        self.run_dir = run_dir
        self.procs = pids
        self.stopped: set[str] = set()
        self.spared: set[str] = set()
        self.skipped = 0
        self.active: list[Active] = []
        self.lines: list[tuple[str, dict[str, Any]]] = []
        self.states: dict[str, Any] = {}
        self.rng = __import__("random").Random(1)

    def pids(self) -> dict[str, int]:
        return dict(self.procs)

    def busy(self, kind: str) -> set[str]:
        return set(self.procs)

    def state(self, owner: str, setup: Any) -> Any:
        return self.states.setdefault(owner, setup(self))

    def line(self, ev: dict[str, Any], phase: str, **more: Any) -> None:
        self.lines.append((phase, {**ev, **more}))


def _state(pid: int, want: str = "", within: float = 2.0) -> str:
    """The process's state letter (``/proc``), waited for up to ``within`` s to become ``want``:
    a signal is delivered a moment after ``kill`` returns."""
    deadline = time.monotonic() + within
    while True:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if not want or state in want or time.monotonic() > deadline:
            return state
        time.sleep(0.01)


@pytest.mark.parametrize("then", ["kill", "resume"])
def test_a_replace_stops_the_worker_asks_for_its_replacement_and_ends_as_told(tmp_path: Path, then: str) -> None:
    proc = subprocess.Popen(["sleep", "30"])
    try:
        nemesis = _Nemesis(tmp_path, {"worker-0": proc.pid})
        ev = {"fault": "replace-stuck", "id": "replace-stuck-0", "at": 0.0, "target": "worker-0", "duration": 1.0, "then": then}
        assert replace.start(nemesis, ev, 0.0)  # type: ignore[arg-type]
        assert _state(proc.pid, "T") == "T", "the worker is not stopped"
        marker = tmp_path / DEPLOYED / f"worker-0{REPLACE_MARKER}"
        assert marker.read_text() == "replace-stuck", "no marker asks the cluster for a replacement"
        assert nemesis.spared == set() and nemesis.states["replace-stuck"].spared() == {"worker-0"}
        (act,) = nemesis.active
        act.undo()
        if then == "kill":
            assert proc.wait(timeout=5) == -signal.SIGKILL
        else:
            assert _state(proc.pid, "SR") in ("S", "R"), "the stopped worker was not woken"
        assert [phase for phase, _ in nemesis.lines] == ["start", "stop"]
        assert nemesis.states["replace-stuck"].spared() == set()
    finally:
        proc.kill()
        proc.wait()


def _line(t: int, **fields: Any) -> Op:
    return {"mono": t, "wall": "x", **fields}


def _history(took_while_stopped: bool) -> list[Op]:
    s = 1_000_000_000
    at = 2 * s if took_while_stopped else 5 * s
    return [
        _line(0, type="fault", fault="replace-stuck", phase="start", id="replace-stuck-0", target="worker-0", target_pid=10, process="controller", pid=1),
        _line(s // 10, type="fault", fault="replace-stuck", phase="replaced", target="worker-0", target_pid=10, restarted_pid=20, process="controller", pid=1),
        _line(at, type="invoke", op="worker-0:20:1", f="take", process="worker-0", pid=20, visibility=1.5),
        _line(at + 1, type="complete", op="worker-0:20:1", f="take", outcome="ok", process="worker-0", pid=20, workflow="wf"),
        _line(3 * s, type="fault", fault="replace-stuck", phase="stop", id="replace-stuck-0", target="worker-0", target_pid=10, process="controller", pid=1),
    ]  # fmt: skip


def test_the_replaced_bite_needs_the_replacement_to_take_work_while_its_predecessor_is_stopped() -> None:
    final = core.FinalState.from_json({})
    assert replace.replaced_bite(_history(True), final).valid is True
    assert replace.replaced_bite(_history(False), final).valid == core.UNKNOWN


def test_identity_reuse_names_its_workers_by_process_and_checks_its_fields() -> None:
    scenario = find("identity-reuse")
    assert scenario.workload.identity == "name" and scenario.bite == "replaced"
    assert {f.then for f in scenario.faults if f.kind == "replace-stuck"} == {"kill", "resume"}  # type: ignore[attr-defined]
    with pytest.raises(ScenarioError, match="then"):
        parse('name = "x"\n[[faults]]\nkind = "replace-stuck"\nat = 1.0\nthen = "pause"\n', "x.toml")
    with pytest.raises(ScenarioError, match="identity"):
        parse('name = "x"\n[workload]\nidentity = "pid"\n', "x.toml")
