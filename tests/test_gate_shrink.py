"""The mutant gate's shrink check: which killing run it shrinks per store, and that a failed shrink
check fails the gate. The shrinking itself runs in CI's mutant gate (``--shrink-seconds``) against
real stores; these judge the choice and the verdict from run folders alone."""

from __future__ import annotations

import json
from pathlib import Path

from wd_chaos.mutants import catalogue
from wd_chaos.mutants.gate_shrink import RUN_DIR, ShrinkCheck, pick
from wd_chaos.mutants.runner import GateReport


def _run(tmp_path: Path, name: str, store: str, faults: int, wall: float = 20.0) -> dict[str, str]:
    folder = tmp_path / name
    folder.mkdir()
    schedule = [{"fault": "stall", "at": float(i), "target": "worker-0", "duration": 1.0} for i in range(faults)]
    (folder / "run.json").write_text(json.dumps({"store": store, "schedule": schedule}))
    (folder / "summary.json").write_text(json.dumps({"wall_seconds": wall}))
    return {"fencing": "invalid", RUN_DIR: str(folder)}


def test_one_pick_per_store_the_killing_run_cheapest_to_shrink_of_two_faults_or_more(tmp_path: Path) -> None:
    mutants = catalogue()
    names = [m.name for m in mutants if m.store == "sqlite"][:5]
    pg = next(m.name for m in mutants if m.store == "postgres")
    killed_by = {
        names[0]: ["chaos:lease-stall:fencing"],
        names[1]: ["test_something", "chaos:lease-stall:fencing"],
        names[2]: ["chaos:long-wait:attempt-limit"],  # one fault: nothing to shrink
        names[3]: ["test_only_a_unit_test"],  # not killed by a run at all
        names[4]: ["chaos:long-wait:attempt-limit"],  # few faults, but a slow run
        pg: ["chaos:lease-stall:fencing"],
    }
    runs = {
        ("lease-stall", names[0]): _run(tmp_path, "a", "sqlite", 8),
        ("lease-stall", names[1]): _run(tmp_path, "b", "sqlite", 5),
        ("long-wait", names[2]): _run(tmp_path, "c", "sqlite", 1),
        ("lease-stall", names[3]): _run(tmp_path, "d", "sqlite", 2),
        ("long-wait", names[4]): _run(tmp_path, "f", "sqlite", 2, wall=60.0),
        ("lease-stall", pg): _run(tmp_path, "e", "postgres", 4),
    }
    picks = pick(mutants, killed_by, runs)
    assert [(p.store, p.mutant, p.faults) for p in picks] == [("postgres", pg, 4), ("sqlite", names[1], 5)]
    assert picks[1].run_dir == str(tmp_path / "b") and picks[1].scenario == "lease-stall"
    only = pick(mutants, killed_by, runs, stores=["postgres"])
    assert [p.store for p in only] == ["postgres"]


def test_a_run_folder_that_is_gone_is_not_picked(tmp_path: Path) -> None:
    mutants = catalogue()
    name = next(m.name for m in mutants if m.store == "sqlite")
    runs = {("lease-stall", name): {"fencing": "invalid", RUN_DIR: str(tmp_path / "gone")}}
    assert pick(mutants, {name: ["chaos:lease-stall:fencing"]}, runs) == []


def test_a_failed_shrink_check_fails_the_gate() -> None:
    def report(passed: bool) -> GateReport:
        check = ShrinkCheck("m", "sqlite", "lease-stall", "run", ["fencing"], 3, 1, 4, [], passed, 1.0)
        return GateReport([], [], 1.0, shrinks=[check])

    assert report(True).passed
    assert not report(False).passed
