"""Judge a stored run: re-run its scenario's checkers on the run folder's history and final state,
and rewrite its ``summary.json`` and ``report.html`` (Jepsen's ``analyze``: a run is judged from
what it stored, never by re-running it). ``run`` calls ``analyze`` on the folder it just wrote;
``wd-chaos analyze`` calls it on any folder; ``analyze_partial`` judges an interrupted run.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from . import checks, rundir, wallclock
from .checks.coverage import hits_of
from .checks.queue_calls import final_queue
from .history import Op
from .report import write_report
from .rundir import DamagedRun, FinalState, FinalUnread
from .scenario import Scenario

__all__ = [
    "EXPECTED",
    "DamagedRun",
    "FinalUnread",
    "Outcome",
    "analyze",
    "analyze_partial",
    "expected_loss",
    "expected_text",
    "read_parts",
    "verdict_name",
]

EXPECTED = "expected"
"""The verdict of a run whose scenario loses acknowledged writes by design (``expect =
"lost-writes"``) and that lost them, counted by ``durability``: what a correct harness shows, exit 0."""


def verdict_name(valid: checks.Valid, expected: object = None) -> str:
    """``valid``, ``invalid``, ``unknown``, or ``expected`` (an invalid run whose loss its scenario
    expects): the one word every view of a run shows (CLI, ``--json``, JUnit, serve, the report)."""
    if expected:
        return EXPECTED
    return "valid" if valid is True else "invalid" if valid is False else "unknown"


def expected_loss(expect: str, verdicts: list[checks.Verdict], valid: checks.Valid) -> dict[str, Any] | None:
    """For a scenario with ``expect = "lost-writes"``: when the run is invalid because
    ``durability`` counted acknowledged writes lost, and every bite check bit, the loss as
    ``{"expect", "lost", "acknowledged", "summary", "consequences"}`` (``consequences``: the other
    checkers that failed, as a lost write makes them: a token or a record forgotten). Else None:
    a run of a scenario expected valid, a valid run (it lost nothing), or a run that failed
    without the loss it exists to show."""
    if expect != "lost-writes" or valid is not False:
        return None
    durability = next((v for v in verdicts if v.name == "durability"), None)
    bites_ok = all(v.valid is True for v in verdicts if v.name.startswith("bite"))
    if durability is None or durability.valid is not False or not bites_ok:
        return None
    lost = int(durability.counts.get("lost", 0))
    if lost <= 0:
        return None
    return {
        "expect": expect,
        "lost": lost,
        "acknowledged": int(durability.counts.get("acknowledged", 0)),
        "summary": durability.summary,
        "consequences": [v.name for v in verdicts if v.valid is False and v.name != "durability"],
    }


@dataclass
class Outcome:
    """A finished run: where it is stored and its verdicts. ``expected`` is the loss its scenario
    expects (``expected_loss``), when the run showed it: the verdict is then ``expected``, exit 0."""

    run_dir: Path
    verdicts: list[checks.Verdict]
    valid: checks.Valid
    summary: dict[str, Any] = field(default_factory=dict)
    expected: dict[str, Any] | None = None

    @property
    def verdict(self) -> str:
        """``valid``, ``invalid``, ``unknown`` or ``expected`` (see ``verdict_name``)."""
        return verdict_name(self.valid, self.expected)

    @property
    def exit_code(self) -> int:
        """0 valid or expected, 1 invalid, 2 unknown."""
        return 0 if self.expected else checks.exit_code(self.valid)


def expected_text(expected: dict[str, Any]) -> str:
    """One line saying the loss was expected, with its figure."""
    also = expected.get("consequences") or []
    then = f"; {', '.join(also)} fail as its consequence" if also else ""
    return (
        f"EXPECTED: {expected['lost']} of {expected['acknowledged']} acknowledged writes lost, as this "
        f'scenario expects (expect = "{expected["expect"]}": the store\'s relaxed durability setting '
        f"loses them by design){then}"
    )


def read_parts(run_dir: Path, *names: str) -> tuple[Scenario, list[dict[str, Any]]]:
    """A run folder's ``scenario.json`` and the named JSON files, each of which must hold an
    object; anything missing or malformed raises ``DamagedRun`` naming the folder."""
    try:
        scenario = Scenario.model_validate_json((run_dir / "scenario.json").read_text())
    except (OSError, ValueError) as exc:
        raise DamagedRun(f"{run_dir}: not a finished run's folder: {exc}") from exc
    return scenario, rundir.read_objects(run_dir, *names)


def _read_run(run_dir: Path) -> tuple[Scenario, dict[str, Any], list[Op], FinalState]:
    """Everything ``analyze`` judges, read and verified before anything in the folder is written."""
    rundir.check_finished(run_dir)
    scenario, (meta, final) = read_parts(run_dir, "run.json", "final.json")
    ops = rundir.finished_history(run_dir)
    return scenario, meta, ops, FinalState.from_json(final)


def analyze(run_dir: Path) -> Outcome:
    """Re-run the checkers on a stored run (history.jsonl, final.json, scenario.json) and rewrite
    its summary.json and report.html. A folder that is not a finished run's, or whose history
    fails its end line's check, raises ``DamagedRun`` and is left as it was."""
    scenario, meta, ops, final = _read_run(run_dir)
    steps = wallclock.steps(ops)
    verdicts = checks.check(ops, final.with_steps(steps), scenario.checks, scenario.bite, scenario.coverage)
    valid = checks.overall(verdicts)
    expected = expected_loss(scenario.expect, verdicts, valid)
    counts = Counter(f"{o['f']}:{o['outcome']}" for o in ops if o["type"] == "complete")
    summary = {
        **meta,
        "valid": valid,
        "verdict": verdict_name(valid, expected),
        "expected": expected,
        "exit_code": 0 if expected else checks.exit_code(valid),
        "verdicts": [v.as_dict() for v in verdicts],
        "coverage": hits_of(verdicts),
        "counts": dict(sorted(counts.items())),
        "faults": [o for o in ops if o["type"] == "fault"],
        # entries per workflow in the store's final queue, where its kit reads it (queue-bounded)
        "queue": final_queue(final),
        # due deliveries judged and their pickup figures in ms (the pickup checker's counts)
        "pickup": pickup_of(verdicts),
        "store_clock": final.get("store_clock", "unrecorded"),
        "lease_clock": final.get("lease_clock", "unrecorded"),
        "wall_clock_steps": steps,
        "analyzed_at": datetime.now(UTC).isoformat(),
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    write_report(run_dir, summary, ops, final)
    return Outcome(run_dir, verdicts, valid, summary, expected)


def pickup_of(verdicts: list[checks.Verdict]) -> dict[str, int]:
    """The ``pickup`` verdict's counts among ``verdicts`` (judged, not judged, p50/p90/p99/max and
    bound in ms), or {} where it did not run."""
    return next((dict(v.counts) for v in verdicts if v.name == "pickup"), {})


def _read_partial(run_dir: Path) -> tuple[Scenario, dict[str, Any], list[Op]]:
    """An interrupted run's scenario, what its controller recorded about the run, and every
    complete line its processes wrote (a torn last line, cut by the kill, skipped)."""
    try:
        scenario = Scenario.model_validate_json((run_dir / "scenario.json").read_text())
    except (OSError, ValueError) as exc:
        raise DamagedRun(f"{run_dir}: not a run's folder: {exc}") from exc
    meta, ops = rundir.partial_history(run_dir)
    return scenario, meta, ops


def analyze_partial(run_dir: Path) -> Outcome:
    """Judge what an interrupted run recorded: its per-process histories, never merged, and no
    final state (the run stopped before reading it). Checkers that need the final state are
    unknown; the others judge the history as far as it goes. The outcome is never valid (a run
    cut short proves nothing whole): invalid on a violation found, else unknown. Writes
    ``summary.json`` with ``"partial": true`` (the folder stays ``INTERRUPTED``); a finished run's
    folder is analyzed as ``analyze`` does."""
    if not rundir.is_partial(run_dir):
        return analyze(run_dir)
    scenario, meta, ops = _read_partial(run_dir)
    steps = wallclock.steps(ops)
    judged = checks.check(
        ops, FinalState.unread_with(steps), scenario.checks, scenario.bite, scenario.coverage
    )
    verdicts = []
    for v in judged:
        if v.valid == checks.UNKNOWN and "FinalUnread" in str(v.evidence[:1]):
            v = checks.Verdict(v.name, checks.UNKNOWN, "not judged: it needs the store's final state, which "
                               "the interrupted run never read")  # fmt: skip
        verdicts.append(v)
    valid: checks.Valid = False if checks.overall(verdicts) is False else checks.UNKNOWN
    why = rundir.interrupted_why(run_dir)
    counts = Counter(f"{o['f']}:{o['outcome']}" for o in ops if o.get("type") == "complete")
    summary = {
        **meta,
        "partial": True,
        "interrupted": why,
        "valid": valid,
        "verdict": verdict_name(valid),
        "exit_code": checks.exit_code(valid),
        "verdicts": [v.as_dict() for v in verdicts],
        "coverage": hits_of(verdicts),
        "pickup": pickup_of(verdicts),
        "counts": dict(sorted(counts.items())),
        "faults": [o for o in ops if o.get("type") == "fault"],
        "wall_clock_steps": steps,
        "analyzed_at": datetime.now(UTC).isoformat(),
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return Outcome(run_dir, verdicts, valid, summary)
