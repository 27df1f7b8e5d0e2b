"""``wd-chaos analyze``, ``shrink`` and ``clean``: commands on stored run folders."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from ..analyze import analyze
from ..control.services import sweep_stale
from ..options import probe_dir, probe_file
from .common import (
    HarnessError,
    Result,
    _junit,
    _Out,
    _show_outcome,
    console,
)


@click.command("analyze")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--junit", type=click.Path(path_type=Path), default=None, metavar="FILE", help="Write a JUnit file."
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print the run's JSON object on stdout (as run --json)."
)
@click.option(
    "--partial",
    is_flag=True,
    help="Judge an interrupted run on what it recorded: checkers that need the final state are "
    "unknown, the verdict is never valid (1 on a violation found, else 2), and every output says PARTIAL.",
)
def analyze_cmd(run_dir: Path, junit: Path | None, as_json: bool, partial: bool) -> None:
    """Re-check a stored run's history and final state; exit as ``run`` would. A folder that is
    not a finished run's (without --partial), or whose history was cut or altered, exits 255 and
    is left as it was."""
    from ..analyze import DamagedRun, analyze_partial

    if junit:
        probe_file(junit, "--junit")
    try:
        outcome = analyze_partial(run_dir) if partial else analyze(run_dir)
    except DamagedRun as exc:
        raise HarnessError(str(exc)) from exc
    s = outcome.summary
    result = Result(str(s.get("scenario")), str(s.get("store")), int(s.get("seed") or 0), outcome)
    result.seconds = float(s.get("wall_seconds") or 0.0)
    out = _Out(as_json)
    _show_outcome(outcome, out)
    out.json(result.record())
    if junit:
        _junit(junit, [result])
    sys.exit(result.exit_code)


@click.command("shrink")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--report-dir", type=click.Path(path_type=Path), default=Path("reports"))
@click.option(
    "--attempts",
    type=click.IntRange(1, 20),
    default=2,
    show_default=True,
    help="Runs of each candidate schedule; it counts as failing when any of them fails.",
)
@click.option(
    "--budget-minutes",
    type=click.FloatRange(0, 24 * 60, min_open=True),
    default=30.0,
    show_default=True,
    help="Start no new candidate after this long; the smallest failing schedule so far is kept.",
)
def shrink_cmd(run_dir: Path, report_dir: Path, attempts: int, budget_minutes: float) -> None:
    """Find the smallest fault schedule under which the checker that failed RUN_DIR still fails,
    re-running its scenario, store, seed, workload and mutant; write it to schedule.json with a
    report and the replay command. Exit 1 a failing schedule was found (smaller, unless the report
    says otherwise), 0 the failure did not reproduce, 64 RUN_DIR did not fail, 255 an error."""
    from ..analyze import DamagedRun
    from ..shrink import NothingToShrink, shrink

    probe_dir(report_dir, "--report-dir")
    out = Console(soft_wrap=True)  # one line per candidate, whole, even in a CI log

    def say(line: str) -> None:
        out.print(line, highlight=False)

    try:
        with console.status("shrinking") as status:

            def show(state: dict[str, Any]) -> None:
                status.update(f"{state.get('phase', '')} {state.get('elapsed', 0.0):5.1f}s")

            result = shrink(run_dir, report_dir, attempts, budget_minutes * 60, say, show)
    except NothingToShrink as exc:
        raise click.UsageError(str(exc)) from exc
    except DamagedRun as exc:
        raise HarnessError(str(exc)) from exc
    if not result.reproduced:
        say(f"[yellow]the failure did not reproduce in {attempts} attempts; nothing shrunk[/]")
        say(f"report: {result.folder / 'report.md'}")
        sys.exit(0)
    say(
        f"[red bold]{len(result.original)} faults shrunk to {len(result.shrunk)}[/] "
        f"({', '.join(result.targets)} still fails; {len(result.tried)} candidates"
        f"{', budget spent' if result.out_of_budget else ''})"
    )
    say(f"schedule: {result.folder / 'schedule.json'}\nreport: {result.folder / 'report.md'}")
    say(f"replay: {result.replay}")
    sys.exit(1)


@click.command("clean")
@click.option("--report-dir", type=click.Path(path_type=Path), default=Path("reports"))
@click.option(
    "--interrupted",
    is_flag=True,
    help="Also remove the run folders marked INTERRUPTED (after cleaning up after them); "
    "finished runs are kept.",
)
@click.option(
    "--servers/--no-servers",
    default=True,
    show_default=True,
    help="Also stop and remove private servers, anywhere in the machine's temporary folder, whose "
    "owner process is gone (any run's or test's, not only those under --report-dir).",
)
def clean_cmd(report_dir: Path, interrupted: bool, servers: bool) -> None:
    """Remove what killed runs left behind: unfinished run folders under --report-dir whose
    controller is gone (processes killed, marked INTERRUPTED), and private servers whose owner
    is gone (killed, folder removed). The servers are looked for in this machine's temporary
    folder, not under --report-dir: they are those of every wd-chaos run and test on the machine
    whose owner process has exited, whichever folder it reported to (--no-servers leaves them).
    Finished runs and running ones are left alone; with --interrupted, the folders marked
    INTERRUPTED are removed too."""
    import shutil

    from ..control.lifeline import mark_stale_runs

    did = mark_stale_runs(report_dir)
    if servers:
        did += [f"removed server folder {p}" for p in sweep_stale()]
    if interrupted and report_dir.is_dir():
        for folder in sorted(p for p in report_dir.iterdir() if (p / "INTERRUPTED").is_file()):
            shutil.rmtree(folder)
            did.append(f"removed interrupted run folder {folder}")
    for line in did:
        click.echo(line)
    click.echo(f"cleaned: {len(did)} things" if did else "nothing to clean")
