"""The mutant gate's shrink check: one chaos-killed mutant per store is shrunk (``wd-chaos shrink``)
within a short budget, and the shrunk schedule replayed (``--schedule``) must fail again, so the
shrinker is held to what it promises on every CI run, against real stores and real faults.

A check passes when the failure came back, the shrunk schedule has fewer faults than the run that
killed the mutant, and its replay fails one of the checkers the shrunk schedule failed while
shrinking. Anything else (the failure did not come back, nothing smaller failed within the budget,
the replay passed, a crash) fails the gate, with the reason.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from . import Mutant

HARD_TIMEOUT = 300
"""Seconds past its budget a shrink (whose last candidate runs to its end), or a replay, may take."""

RUN_DIR = "__run_dir__"
"""The key under which a chaos runner's verdicts name the folder of the run they judged."""


@dataclass
class Pick:
    """A run that killed a mutant, to be shrunk: which mutant, store, scenario and run folder."""

    mutant: str
    store: str
    scenario: str
    killer: str
    run_dir: str
    faults: int


@dataclass
class ShrinkCheck:
    """One shrink in the gate: what was shrunk, to how many faults, whether its replay failed again,
    and whether the check passed (with why not)."""

    mutant: str
    store: str
    scenario: str
    run_dir: str
    targets: list[str]
    original_faults: int
    shrunk_faults: int
    candidates: int
    replay_failed: list[str]
    passed: bool
    seconds: float
    folder: str = ""
    replay_dir: str = ""
    evidence: str = ""


def _cost(run_dir: str) -> tuple[str, int, float]:
    """A killing run's chaos store, its number of scheduled faults (``run.json``), and what
    shrinking it may cost: its wall seconds times the candidates delta debugging tries on a schedule
    of that size when one fault suffices (about log2 of it, plus the original)."""
    meta = json.loads((Path(run_dir) / "run.json").read_text())
    summary = json.loads((Path(run_dir) / "summary.json").read_text())
    faults = len(meta.get("schedule") or [])
    return str(meta["store"]), faults, float(summary.get("wall_seconds") or 0.0) * faults.bit_length()


def pick(
    mutants: Sequence[Mutant],
    killed_by: Mapping[str, Sequence[str]],
    runs: Mapping[tuple[str, str], Mapping[str, str]],
    stores: Collection[str] = (),
) -> list[Pick]:
    """Per chaos store (only ``stores``, if given), the chaos-killed mutant whose killing run is the
    cheapest to shrink (``_cost``), among runs of at least two faults (one fault cannot shrink).
    Ties go to the fewer faults, then the name first in order."""
    best: dict[str, tuple[float, int, str, Pick]] = {}
    for m in mutants:
        for killer in killed_by.get(m.name, ()):
            if not killer.startswith("chaos:"):
                continue
            scenario = killer.split(":", 2)[1]
            run_dir = runs.get((scenario, m.name), {}).get(RUN_DIR)
            if not run_dir or not (Path(run_dir) / "summary.json").is_file():
                continue
            store, faults, cost = _cost(run_dir)
            if faults < 2 or (stores and store not in stores):
                continue
            rank = (cost, faults, m.name, Pick(m.name, store, scenario, killer, run_dir, faults))
            if store not in best or rank[:3] < best[store][:3]:
                best[store] = rank
    return [best[s][3] for s in sorted(best)]


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "wd_chaos.cli", *args]


def check(chosen: Pick, report_dir: Path, budget_seconds: float, say: Callable[[str], None]) -> ShrinkCheck:
    """``wd-chaos shrink`` on ``chosen``'s run (one attempt per candidate, no new candidate after
    ``budget_seconds``), then the replay command it printed, each as the command a user runs; judge
    both from what they wrote."""
    started = time.monotonic()
    result = ShrinkCheck(
        chosen.mutant, chosen.store, chosen.scenario, chosen.run_dir, [], chosen.faults, 0, 0, [], False, 0.0
    )
    out = report_dir / f"{chosen.store}-{chosen.mutant}"
    try:
        done = subprocess.run(
            _cli("shrink", chosen.run_dir, "--report-dir", str(out), "--attempts", "1",
                 "--budget-minutes", f"{budget_seconds / 60:.4f}"),
            capture_output=True, text=True, timeout=budget_seconds + HARD_TIMEOUT, check=False,
        )  # fmt: skip
        folders = sorted(out.glob("*-shrink-*"))
        if done.returncode not in (0, 1) or not folders or not (folders[-1] / "shrink.json").is_file():
            result.evidence = (
                f"wd-chaos shrink exited {done.returncode}: {(done.stdout + done.stderr)[-600:]}"
            )
            return result
        data = json.loads((folders[-1] / "shrink.json").read_text())
        original, shrunk = data["original"]["schedule"], data["shrunk"]["schedule"]
        result.targets = list(data["targets"])
        result.folder = str(folders[-1])
        result.candidates = len(data["candidates"])
        result.shrunk_faults = len(shrunk)
        # the checkers the kept (shrunk) schedule failed while shrinking: its replay must fail one
        expected = {
            name
            for c in data["candidates"]
            if c["failed"] and c["schedule"] == shrunk
            for r in c["runs"]
            for name in r["failed"]
        }
        if not data["reproduced"] or done.returncode != 1:
            result.evidence = f"the killing run's failure did not come back (shrink exited {done.returncode})"
        elif not 0 < len(shrunk) < len(original):
            result.evidence = (
                f"nothing smaller than {len(original)} faults failed within {budget_seconds:g} s "
                f"({result.candidates} candidates)"
            )
        else:
            say(
                f"{chosen.store}: {len(original)} faults shrunk to {len(shrunk)}; replaying: {data['replay']}"
            )
            words = shlex.split(data["replay"])
            if words[:2] != ["wd-chaos", "run"]:
                result.evidence = f"the shrink's replay is not a wd-chaos run command: {data['replay']}"
                return result
            replays = folders[-1] / "replay"
            again = subprocess.run(
                _cli(*words[1:], "--report-dir", str(replays)),
                capture_output=True, text=True, timeout=HARD_TIMEOUT, check=False,
            )  # fmt: skip
            ran = sorted(replays.glob(f"*-{chosen.scenario}-*"))
            if not ran or not (ran[-1] / "summary.json").is_file():
                result.evidence = (
                    f"the replay exited {again.returncode}: {(again.stdout + again.stderr)[-600:]}"
                )
                return result
            summary = json.loads((ran[-1] / "summary.json").read_text())
            result.replay_dir = str(ran[-1])
            result.replay_failed = sorted(str(v["name"]) for v in summary["verdicts"] if v["valid"] is False)
            hit = sorted(expected & set(result.replay_failed))
            if hit and again.returncode == 1 and len(summary["schedule"]) == len(shrunk):
                result.passed = True
                result.evidence = f"{len(original)} faults shrunk to {len(shrunk)}; the replay failed {', '.join(hit)} again"
            else:
                result.evidence = (
                    f"the replay of the shrunk schedule (exit {again.returncode}, "
                    f"{len(summary['schedule'])} faults) did not fail {sorted(expected)} again "
                    f"(it failed {result.replay_failed or 'nothing'}): {ran[-1]}"
                )
    except (OSError, ValueError, KeyError, subprocess.TimeoutExpired) as exc:
        result.evidence = f"{type(exc).__name__}: {exc}"  # this check's failure, reported in the gate
    finally:
        result.seconds = round(time.monotonic() - started, 1)
    return result


def check_all(
    picks: Sequence[Pick], report_dir: Path, budget_seconds: float, say: Callable[[str], None], jobs: int = 1
) -> list[ShrinkCheck]:
    """``check`` each pick, ``jobs`` at a time (each shrink is one process running its candidates)."""
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(lambda chosen: check(chosen, report_dir, budget_seconds, say), picks))


def as_json(checks: Sequence[ShrinkCheck]) -> list[dict[str, Any]]:
    """The checks as plain data for ``mutants.json``."""
    return [asdict(c) for c in checks]
