"""``wd-chaos shrink``: the smallest fault schedule that still fails a run the way it failed.

A failing run records its exact schedule (``run.json``). Shrinking re-runs the same scenario,
store, seed, workload and mutant with smaller schedules (delta debugging: drop halves from the end,
then single faults; then shorten durations and move faults earlier) and keeps a candidate when the
checker that failed the original fails again in any of ``attempts`` runs: real processes do not
repeat themselves, so one clean run does not prove a candidate harmless. Each candidate's workload
phase ends a few seconds after its last fault, so a small schedule is also a short run.

``ddmin`` and ``simplify`` are pure (the oracle is a function); ``shrink`` drives real runs.
"""

from __future__ import annotations

import json
import shlex
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .analyze import read_parts
from .control.runner import Options, run

# shrink_command lived here before wd_chaos.rundir; cli and gate still import it from here
from .rundir import shrink_command as shrink_command
from .scenario import Scenario, available

Event = dict[str, Any]
Oracle = Callable[[list[Event]], bool]
"""Does this candidate schedule still fail? (True: keep it.)"""

AFTER_LAST_FAULT = 4.0
"""Seconds of workload a candidate runs past its last fault's end: time for a woken worker's write
to reach the store before the final heal."""


def _key(events: list[Event]) -> str:
    return json.dumps(events, sort_keys=True)


def ddmin(events: list[Event], fails: Oracle, stop: Callable[[], bool] = lambda: False) -> list[Event]:
    """Delta debugging over the events: split into ``n`` chunks (2 first), try the schedule
    without each chunk, the last chunk first (so a candidate ends early and runs short), keep the
    first that still fails and coarsen again; when none does, split finer, down to single events.
    Returns a schedule from which no single event can be dropped (1-minimal), or the smallest
    found when ``stop`` says the budget is spent. ``events`` is assumed to fail; it is not tried."""
    current = list(events)
    n = 2
    while len(current) >= 2 and not stop():
        size = -(-len(current) // n)  # ceil
        chunks = [(i, min(i + size, len(current))) for i in range(0, len(current), size)]
        reduced = False
        for lo, hi in reversed(chunks):
            if stop():
                return current
            candidate = current[:lo] + current[hi:]
            if candidate and fails(candidate):
                current = candidate
                n = max(n - 1, 2)
                reduced = True
                break
        if not reduced:
            if n >= len(current):
                break
            n = min(len(current), 2 * n)
    return current


def _shorter(ev: Event) -> Event | None:
    # a stall "over" the lease is that long on purpose: shorter, it fails only when a takeover
    # happens to win the race, and a shrunk schedule that rarely fails is worse than a longer one
    if "duration" not in ev or "over" in ev or float(ev["duration"]) < 0.5:
        return None
    return {**ev, "duration": round(float(ev["duration"]) / 2, 3)}


def _earlier(ev: Event) -> Event | None:
    if float(ev["at"]) < 1.0:
        return None
    return {**ev, "at": round(float(ev["at"]) / 2, 3)}


def simplify(events: list[Event], fails: Oracle, stop: Callable[[], bool] = lambda: False) -> list[Event]:
    """After ``ddmin``: for each event, the last first, try half its duration (not a stall's sized
    ``over`` the lease), then half its start time, keeping each change under which the schedule still fails. One try per event and
    change, so the cost is at most twice the events' number."""
    current = sorted(events, key=lambda e: float(e["at"]))
    for change in (_shorter, _earlier):
        for i in reversed(range(len(current))):
            if stop():
                return current
            changed = change(current[i])
            if changed is None:
                continue
            candidate = sorted([*current[:i], changed, *current[i + 1 :]], key=lambda e: float(e["at"]))
            if fails(candidate):
                current = candidate
    return current


def ends_at(events: list[Event]) -> float:
    """When the last of ``events`` is over (start plus duration), in seconds of the workload."""
    return max((float(e["at"]) + float(e.get("duration", 0.0)) for e in events), default=0.0)


def candidate_limit(events: list[Event], original: float) -> float:
    """A candidate's workload phase: past its last fault's end by ``AFTER_LAST_FAULT`` s, never
    longer than the original run's."""
    return round(min(original, ends_at(events) + AFTER_LAST_FAULT), 3)


def failing_checkers(summary: dict[str, Any]) -> list[str]:
    """The checkers a run failed, without the bite checks: a fault that did not bite is not the
    failure being shrunk (such a verdict is unknown now; runs judged before that had it invalid)."""
    return [
        str(v["name"])
        for v in summary.get("verdicts", [])
        if v.get("valid") is False and not str(v["name"]).startswith("bite")
    ]


class NothingToShrink(ValueError):
    """The run folder holds a run that did not fail a checker (or had no faults)."""


@dataclass
class Tried:
    """One candidate schedule and what its runs said."""

    number: int
    events: list[Event]
    time_limit: float
    failed: bool
    runs: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Result:
    """What a shrink found: ``reproduced`` says whether the original failure came back at all;
    ``shrunk`` is the smallest schedule seen failing (the original when nothing smaller did)."""

    folder: Path
    original: list[Event]
    shrunk: list[Event]
    shrunk_limit: float
    reproduced: bool
    targets: list[str]
    tried: list[Tried]
    replay: str
    out_of_budget: bool
    stopped: str | None = None
    """Why the shrink ended early (an error, a signal); ``shrunk`` is then the last failing candidate."""


def _read(run_dir: Path) -> tuple[Scenario, dict[str, Any], dict[str, Any]]:
    scenario, (meta, summary) = read_parts(run_dir, "run.json", "summary.json")
    return scenario, meta, summary


def replay_command(
    meta: dict[str, Any], schedule_file: Path, time_limit: float, scenario_file: Path | None = None
) -> str:
    """The ``wd-chaos run`` command that replays ``schedule_file`` with the rest of the run as
    ``meta`` (a run.json) recorded it; ``scenario_file`` (a copy of the run's scenario.json) in
    place of the scenario's name, for a user's scenario the name alone cannot find."""
    scenario = str(scenario_file) if scenario_file is not None else str(meta["scenario"])
    words = ["wd-chaos", "run", scenario, "--store", str(meta["store"])]
    words += ["--seed", str(meta["seed"]), "--workers", str(meta["workers"])]
    words += ["--time-limit", f"{time_limit:g}", "--schedule", str(schedule_file)]
    if meta.get("mutant"):
        words += ["--mutant", str(meta["mutant"])]
    if meta.get("client") and meta["client"] != "harness":
        words += ["--client", str(meta["client"])]
    return shlex.join(words)


def shrink(
    run_dir: Path,
    report_dir: Path,
    attempts: int,
    budget_seconds: float,
    say: Callable[[str], None],
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> Result:
    """Shrink the failing run in ``run_dir``; candidate runs and the result go to a new folder
    under ``report_dir``. ``say`` gets one line per candidate run. Raises ``NothingToShrink`` for
    a run that failed no checker, ``DamagedRun`` for a folder that is not a finished run's."""
    scenario, meta, summary = _read(run_dir)
    targets = failing_checkers(summary)
    if not targets:
        raise NothingToShrink(
            f"{run_dir}: the run failed no checker (valid: {summary.get('valid')}); nothing to shrink"
        )
    if meta.get("checkpointer_class"):  # a run from before the catalogue took that option's place
        raise NothingToShrink(
            f"{run_dir}: it ran with --checkpointer-class, which wd-chaos no longer has; run the "
            "store's catalogue mutant instead (--mutant NAME; wd-chaos mutants --list names them)"
        )
    original = [dict(e) for e in meta.get("schedule", [])]
    if not original:
        raise NothingToShrink(f"{run_dir}: the run had no faults; nothing to shrink")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    folder = report_dir / f"{stamp}-shrink-{meta['scenario']}-{meta['store']}"
    folder.mkdir(parents=True, exist_ok=False)
    deadline = time.monotonic() + budget_seconds
    tried: list[Tried] = []
    seen: dict[str, bool] = {}
    full_limit = float(meta["time_limit"])

    def stop() -> bool:
        return time.monotonic() >= deadline

    def fails(events: list[Event]) -> bool:
        key = _key(events)
        if key in seen:
            return seen[key]
        limit = candidate_limit(events, full_limit)
        entry = Tried(len(tried) + 1, events, limit, False)
        tried.append(entry)
        for attempt in range(1, attempts + 1):
            opts = Options(
                store=str(meta["store"]),
                seed=int(meta["seed"]),
                time_limit=limit,
                workers=int(meta["workers"]),
                report_dir=folder / "runs",
                client=meta.get("client"),
                mutant=meta.get("mutant"),
                schedule=events,
                schedule_source=f"shrink candidate {entry.number} of {run_dir}",
            )
            outcome = run(scenario, opts, progress)
            verdicts = {v.name: v.valid for v in outcome.verdicts}
            hit = [t for t in targets if verdicts.get(t) is False]
            entry.runs.append({"run_dir": str(outcome.run_dir), "failed": hit, "valid": outcome.valid})
            shown = ", ".join(
                f"{t} {'INVALID' if verdicts.get(t) is False else verdicts.get(t)}" for t in targets
            )
            say(
                f"candidate {entry.number}: {len(events)}/{len(original)} faults, limit {limit:g} s, "
                f"attempt {attempt}/{attempts}: {shown} "
                f"({outcome.summary.get('wall_seconds')} s) -> {'fails: kept' if hit else 'passes'}"
            )
            if hit:
                entry.failed = True
                break
        seen[key] = entry.failed
        return entry.failed

    # the whole schedule first, cut to end after its last fault: if it does not fail, stop
    def finish(shrunk: list[Event], reproduced: bool, stopped: str | None = None) -> Result:
        shrunk_limit = candidate_limit(shrunk, full_limit)
        schedule_file = folder / "schedule.json"
        schedule_file.write_text(json.dumps(shrunk, indent=2) + "\n")
        scenario_file = None
        if meta["scenario"] not in available():  # a user's scenario: replay the run's own copy
            scenario_file = folder / "scenario.json"
            shutil.copyfile(run_dir / "scenario.json", scenario_file)
        replay = replay_command(meta, schedule_file, shrunk_limit, scenario_file)
        result = Result(
            folder, original, shrunk, shrunk_limit, reproduced, targets, tried, replay, stop(), stopped
        )
        _write_report(result, run_dir, meta)
        return result

    try:
        reproduced = fails(original)
        shrunk = simplify(ddmin(original, fails, stop), fails, stop) if reproduced else original
    except BaseException as exc:
        # a crashed candidate or Ctrl-C keeps what was found: the last candidate seen failing
        # (ddmin and simplify only ever move to a failing one)
        failing = [t.events for t in tried if t.failed]
        if failing:
            finish(failing[-1], True, f"{type(exc).__name__}: {exc}")
        raise
    return finish(shrunk, reproduced)


def _write_report(result: Result, run_dir: Path, meta: dict[str, Any]) -> None:
    """``shrink.json`` (everything, for a program) and ``report.md`` (original against shrunk)."""
    data = {
        "run_dir": str(run_dir),
        "targets": result.targets,
        "reproduced": result.reproduced,
        "out_of_budget": result.out_of_budget,
        "stopped": result.stopped,
        "original": {"schedule": result.original, "time_limit": meta["time_limit"]},
        "shrunk": {"schedule": result.shrunk, "time_limit": result.shrunk_limit},
        "replay": result.replay,
        "candidates": [
            {
                "number": t.number,
                "faults": len(t.events),
                "time_limit": t.time_limit,
                "failed": t.failed,
                "schedule": t.events,
                "runs": t.runs,
            }
            for t in result.tried
        ],
    }
    (result.folder / "shrink.json").write_text(json.dumps(data, indent=2, default=str) + "\n")

    def rows(events: list[Event]) -> str:
        return "\n".join(
            f"| {e['at']} | {e['fault']} | {e.get('target', '')} | {e.get('duration', '')} | "
            + ", ".join(
                f"{k}={v}" for k, v in e.items() if k not in ("at", "fault", "target", "duration", "index")
            )
            + " |"
            for e in events
        )

    head = "| at (s) | fault | target | duration (s) | detail |\n|---|---|---|---|---|\n"
    verdict = (
        "the failure did not reproduce: the original schedule passed every attempt"
        if not result.reproduced
        else f"{len(result.original)} faults shrunk to {len(result.shrunk)}"
    )
    text = (
        f"""# Shrink of {run_dir}

{meta["scenario"]} on {meta["store"]}, seed {meta["seed"]}, mutant {meta.get("mutant")},
client {meta.get("client")}.
Target: {", ".join(result.targets)} failing (in any attempt). {verdict};
{len(result.tried)} candidates tried{"; the budget ran out" if result.out_of_budget else ""}{
            f"; stopped early by {result.stopped}" if result.stopped else ""
        }.

Replay: `{result.replay}`

## Original ({len(result.original)} faults, time limit {meta["time_limit"]} s)

{head}{rows(result.original)}

## Shrunk ({len(result.shrunk)} faults, time limit {result.shrunk_limit} s)

{head}{rows(result.shrunk)}

## Candidates

| # | faults | time limit (s) | failed | runs |
|---|---|---|---|---|
"""
        + "\n".join(
            f"| {t.number} | {len(t.events)} | {t.time_limit} | {t.failed if t.runs else 'interrupted'} | "
            + ", ".join(Path(r["run_dir"]).name for r in t.runs)
            + " |"
            for t in result.tried
        )
        + "\n"
    )
    (result.folder / "report.md").write_text(text)
