"""The mutant gate's chaos share: a chaos killer's run that missed is run again on other seeds,
bounded (``attempts``), and the gate says which killer killed each mutant after how many runs
(``chaos_share``). Judged on made-up runs: no wd-chaos run, no server."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from wd_chaos.mutants import Mutant
from wd_chaos.mutants.command import CHAOS_RETRIES, attempts
from wd_chaos.mutants.runner import RUNS, chaos_share, judge, run_chaos_killers

KILLER = "chaos:lease-stall:fencing"


def runs_of(*valid: object, stepped: int | None = None) -> tuple[list[int | None], Any]:
    """A fake ``run(seed)``: the n-th run comes out ``valid[n]`` (the last repeats); the run at
    index ``stepped`` saw this machine's wall clock step. Seeds asked for are kept in order."""
    asked: list[int | None] = []

    def run(seed: int | None) -> tuple[str, dict[str, Any]]:
        n = len(asked)
        asked.append(seed)
        summary: dict[str, Any] = {
            "valid": valid[min(n, len(valid) - 1)],
            "seed": 7 if seed is None else seed,
        }
        if n == stepped:
            summary["wall_clock_steps"] = 1
        return f"run-{n}", summary

    return asked, run


def test_a_mutant_run_that_missed_is_run_again_on_the_next_seeds_until_one_kills() -> None:
    asked, run = runs_of(True, True, False)
    tried = attempts(run, "some-mutant")
    assert asked == [None, 8, 9], f"seeds asked for: {asked}"
    assert [a.summary["valid"] for a in tried] == [True, True, False]
    assert [a.why_again for a in tried] == ["valid (the mutant was not caught)"] * 2 + [""]


def test_the_retries_are_bounded_and_each_on_a_seed_of_its_own() -> None:
    asked, run = runs_of(True)
    tried = attempts(run, "some-mutant")
    assert len(tried) == 1 + CHAOS_RETRIES and CHAOS_RETRIES >= 3, len(tried)
    assert asked == [None, 8, 9, 10], f"seeds asked for: {asked}"
    assert tried[-1].why_again == "", "the last run is the verdict"
    asked, run = runs_of("unknown")
    assert len(attempts(run, "some-mutant", retries=1)) == 2


def test_a_real_store_is_run_again_only_when_its_fault_did_not_bite() -> None:
    for outcomes, runs in (((True,), 1), ((False,), 1), (("unknown", True), 2), (("unknown", False), 2)):
        asked, run = runs_of(*outcomes)
        assert len(attempts(run, None)) == runs, f"real store, runs {outcomes}: asked {asked}"
    asked, run = runs_of(False)
    assert len(attempts(run, "some-mutant")) == 1, "a kill is final"


def test_a_run_unknown_across_a_wall_clock_step_is_made_again_on_its_seed_uncounted() -> None:
    asked, run = runs_of("unknown", True, stepped=0)
    tried = attempts(run, "some-mutant")
    assert asked[:2] == [None, None], f"the stepped run was not made again on its own seed: {asked}"
    assert tried[0].why_again == "unknown across a wall-clock step"
    assert len(tried) == 2 + CHAOS_RETRIES, "the stepped run counted as one of the retries"


def _mutant(name: str, killers: tuple[str, ...], unseen: str = "") -> Mutant:
    return Mutant(name, "sqlite", "fencing", "made up", killers, lambda durable: durable, unseen)


def test_the_share_names_the_killer_of_each_mutant_and_the_runs_it_took(tmp_path: Path) -> None:
    mutants = [
        _mutant("caught-late", (KILLER,)),
        _mutant("missed", ("test_x", KILLER)),
        _mutant("unseen", ("test_x",), unseen="no run reaches it"),
    ]
    outcome = {"caught-late": ("invalid", "3"), "missed": ("valid", "4"), None: ("valid", "1")}

    def chaos(scenario: str, store: str, mutant: str | None, report_dir: Path) -> dict[str, str]:
        verdict, runs = outcome[mutant]
        return {"fencing": verdict, RUNS: runs, "__evidence__": f"{scenario} on {mutant or store}"}

    results = run_chaos_killers(mutants, tmp_path, chaos)
    report = judge(mutants, results, time.monotonic())
    report.timings = {"chaos": 1.0}
    lines = chaos_share(report)
    assert lines[0].startswith("chaos share: 1/3 (33.3%) mutants killed by a wd-chaos run"), lines[0]
    assert f"  by wd-chaos: caught-late: {KILLER} killed after 3 runs" in lines, lines
    assert f"  not by wd-chaos: missed: {KILLER} passed after 4 runs" in lines, lines
    assert "  no chaos killer: unseen: no run reaches it" in lines, lines
    report.timings = {}
    assert chaos_share(report) == ["chaos share: not measured (no chaos runs in this gate)"]
