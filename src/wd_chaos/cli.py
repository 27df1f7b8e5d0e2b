"""``wd-chaos``: list, run and analyze scenarios. Exit codes: 0 valid, 1 invalid, 2 unknown,
255 the harness itself failed (a server could not be had, a bad scenario file)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

import click
from rich.console import Console
from rich.live import Live
from rich.table import Table

from . import checkers
from .mutants.command import mutants_command
from .runner import Options, Outcome, analyze, run
from .scenario import Scenario, ScenarioError, available, find, load_file
from .services import ServerUnavailable, check_available

console = Console(stderr=True)
CRASHED = 255


def _label(valid: checkers.Valid, yes: str, no: str, unsure: str) -> str:
    return yes if valid is True else no if valid is False else unsure


def _verdict_table(outcome: Outcome) -> Table:
    s = outcome.summary
    label = _label(outcome.valid, "[green]VALID", "[red bold]INVALID", "[yellow]UNKNOWN")
    table = Table(title=f"{s['scenario']} on {s['store']} (seed {s['seed']}): {label}", show_lines=False)
    table.add_column("checker")
    table.add_column("verdict")
    table.add_column("summary", overflow="fold")
    for v in outcome.verdicts:
        mark = _label(v.valid, "[green]valid", "[red bold]INVALID", "[yellow]unknown")
        text = v.summary
        if v.valid is not True and v.evidence:
            first = v.evidence[0]
            text += f"\n  e.g. {first.get('why', '')}: " + ", ".join(
                f"{k}={first[k]}" for k in ("process", "workflow", "key", "token", "op") if k in first
            )
        table.add_row(v.name, mark, text)
    caption = f"report: {outcome.run_dir / 'report.html'}  ({s.get('wall_seconds')} s)"
    for step in s.get("wall_clock_steps", []):
        caption = (
            f"this machine's wall clock stepped {step['seconds']:+.3f} s near {step['wall']} "
            f"(no fault of ours; the store's leases are on the {s.get('lease_clock')} clock)\n" + caption
        )
    table.caption = caption
    return table


def _progress_view(state: dict[str, Any]) -> Table:
    t = Table.grid(padding=(0, 2))
    phase = state.get("phase", "")
    elapsed = state.get("elapsed", 0.0)
    limit = state.get("limit")
    bar = ""
    if limit and phase == "workload":
        n = int(30 * min(1.0, elapsed / float(limit)))
        bar = "[" + "#" * n + "." * (30 - n) + "]"
    t.add_row(
        f"[bold]{phase}",
        f"{elapsed:5.1f}s",
        bar,
        f"ops {state.get('ops', 0)}",
        f"fenced {state.get('fenced', 0)}",
        f"faults {state.get('faults', 0)}",
        f"restarts {state.get('restarts', 0)}",
        (
            f"finished {state.get('done', 0)}/{state.get('total')}"
            if "total" in state
            else f"stalled now {state.get('stalled', 0)}"
        ),
    )
    return t


def _junit(path: Path, outcomes: list[Outcome]) -> None:
    cases = []
    for o in outcomes:
        s = o.summary
        for v in o.verdicts:
            name = escape(f"{s['scenario']}[{s['store']}] {v.name}", {'"': "&quot;"})
            body = ""
            if v.valid is False:
                body = (
                    f'<failure message="{escape(v.summary, {chr(34): "&quot;"})}">'
                    f"{escape(str(v.evidence[:5]))}</failure>"
                )
            elif v.valid is not True:
                body = f'<skipped message="unknown: {escape(v.summary, {chr(34): "&quot;"})}"/>'
            cases.append(f'<testcase classname="wd-chaos" name="{name}">{body}</testcase>')
    failures = sum(1 for o in outcomes for v in o.verdicts if v.valid is False)
    path.write_text(
        '<?xml version="1.0" encoding="utf-8"?>\n'
        f'<testsuite name="wd-chaos" tests="{len(cases)}" failures="{failures}">'
        + "".join(cases)
        + "</testsuite>\n"
    )


@click.group()
def main() -> None:
    """Fault-injection harness for without-durability's stores."""


@main.command("list")
def list_() -> None:
    """The scenarios and the stores each applies to."""
    table = Table("scenario", "stores", "description")
    for name, path in available().items():
        try:
            sc = load_file(path)
            table.add_row(name, ", ".join(sc.stores), sc.description)
        except ScenarioError as exc:
            table.add_row(name, "[red]invalid", str(exc))
    Console().print(table)


@main.command("run")
@click.argument("name", required=False)
@click.option(
    "--all",
    "run_all",
    is_flag=True,
    help="Every scenario on every store it applies to (with --store: on that store only).",
)
@click.option(
    "--store",
    type=click.Choice(["sqlite", "postgres", "redis"]),
    default=None,
    help="The store to run against (default sqlite).",
)
@click.option("--seed", type=int, default=None, help="Fixes the workload and the fault schedule.")
@click.option(
    "--time-limit",
    type=float,
    default=None,
    help="Seconds of workload and faults; longer scales the workflows and repeats the faults.",
)
@click.option("--workers", type=int, default=None, help="Worker processes.")
@click.option("--report-dir", type=click.Path(path_type=Path), default=Path("reports"))
@click.option("--junit", type=click.Path(path_type=Path), default=None)
@click.option(
    "--checkpointer-class",
    default=None,
    metavar="MODULE:CLASS",
    help="Use this checkpointer class in place of the store's own (a mutant).",
)
@click.option(
    "--client",
    type=click.Choice(["harness", "worker"]),
    default=None,
    help="Who runs the workflow: the harness's explicit loop (default) or the library's Worker.",
)
@click.option(
    "--mutant",
    default=None,
    metavar="NAME",
    help="Break the store the way this wd_chaos.mutants catalogue entry says (it must be caught).",
)
def run_cmd(
    name: str | None,
    run_all: bool,
    store: str | None,
    seed: int | None,
    time_limit: float | None,
    workers: int | None,
    report_dir: Path,
    junit: Path | None,
    checkpointer_class: str | None,
    client: str | None,
    mutant: str | None,
) -> None:
    """Run scenario NAME (or --all) and print a verdict; exit 0 valid, 1 invalid, 2 unknown."""
    try:
        if run_all:
            jobs: list[tuple[Scenario, str]] = []
            for sc_name in available():
                sc = find(sc_name)
                for one in sc.stores:
                    if store is None or one == store:
                        jobs.append((sc, one))
        elif name:
            sc = find(name)
            jobs = [(sc, store or "sqlite")]
        else:
            raise click.UsageError("give a scenario NAME or --all (see wd-chaos list)")
    except ScenarioError as exc:
        console.print(f"[red]{exc}")
        sys.exit(CRASHED)
    # a CI cancel (SIGTERM) cleans up like Ctrl-C: workers stopped, private servers removed
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    outcomes: list[Outcome] = []
    for sc, st in jobs:
        partition = any(f.kind == "partition" for f in sc.faults)
        reason = check_available(st, partition)
        if reason:
            console.print(f"[red]{sc.name} on {st}: cannot get its servers: {reason}")
            sys.exit(CRASHED)
        opts = Options(
            store=st,
            seed=seed,
            time_limit=time_limit,
            workers=workers,
            report_dir=report_dir,
            checkpointer_class=checkpointer_class,
            client=client,
            mutant=mutant,
        )
        try:
            with Live(
                _progress_view({"phase": "starting"}),
                console=console,
                refresh_per_second=4,
                transient=True,
            ) as live:

                def show(state: dict[str, Any], live: Live = live) -> None:
                    live.update(_progress_view(state))

                outcome = run(sc, opts, show)
        except (ServerUnavailable, ValueError) as exc:
            console.print(f"[red]{sc.name} on {st}: {exc}")
            sys.exit(CRASHED)
        Console().print(_verdict_table(outcome))
        outcomes.append(outcome)
    if junit:
        _junit(junit, outcomes)
    sys.exit(checkers.exit_code(checkers.overall([checkers.Verdict("run", o.valid, "") for o in outcomes])))


@main.command("analyze")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--junit", type=click.Path(path_type=Path), default=None)
def analyze_cmd(run_dir: Path, junit: Path | None) -> None:
    """Re-check a stored run's history and final state; exit as ``run`` would."""
    outcome = analyze(run_dir)
    Console().print(_verdict_table(outcome))
    if junit:
        _junit(junit, [outcome])
    sys.exit(checkers.exit_code(outcome.valid))


main.add_command(mutants_command)

if __name__ == "__main__":
    main()
