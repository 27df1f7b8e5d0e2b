"""``wd-chaos``: list, run, analyze and shrink scenarios' runs, and clean up after a killed run.

Exit codes, and nothing else produces them: 0 valid, 1 invalid, 2 unknown (a verdict); 64 a usage
error (a bad option or value, an output path that cannot be written; the run never started); 130
interrupted by SIGINT, 143 by SIGTERM (the run's folder says ``INTERRUPTED``); 255 the harness
itself failed (a server could not be had or reached, a bad scenario file, a damaged run folder),
with one line naming the cause (``--debug`` adds the traceback).
"""

from __future__ import annotations

import signal
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any
from xml.sax.saxutils import escape

import click
from rich.console import Console
from rich.live import Live
from rich.table import Column, Table

from . import checks
from .faults import service_needs
from .kits import stores_for
from .mutants.command import mutants_command
from .mutate.command import mutate_command
from .options import Bounded, probe_dir, probe_file
from .runner import Options, Outcome, analyze, check_options, run
from .scenario import (
    OptionError,
    Scenario,
    ScenarioError,
    TimeLimit,
    WorkerCount,
    available,
    find,
    load_file,
    load_schedule,
)
from .serve import serve_command
from .services import check_available, sweep_stale
from .shrink import shrink_command

console = Console(stderr=True)
USAGE = 64
"""A usage error (sysexits' EX_USAGE): none of the verdicts' 0, 1, 2."""
SIGINT_EXIT = 128 + signal.SIGINT
SIGTERM_EXIT = 128 + signal.SIGTERM
CRASHED = 255
DOCUMENTED = frozenset({0, 1, 2, USAGE, SIGINT_EXIT, SIGTERM_EXIT, CRASHED})
"""Every code ``wd-chaos`` exits with; anything else a command raised becomes 255."""
_debug = {"on": False}


def _one_line(text: str) -> str:
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


class HarnessError(RuntimeError):
    """The harness could not do what was asked (exit 255); the message is the one line shown."""


class Stopped(KeyboardInterrupt):
    """SIGINT or SIGTERM reached the controller: it stops its processes and servers and exits
    ``128 + signum``. A KeyboardInterrupt, so every cleanup path already handles it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _stop(signum: int, frame: FrameType | None) -> None:
    # the first signal starts the cleanup; more would cut it short, so they are ignored
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Stopped(signum)


def _exit_code(call: Callable[[], Any]) -> int:
    """Run the command line and turn whatever came out of it into one of the documented codes."""
    try:
        result = call()
        return result if isinstance(result, int) else 0
    except SystemExit as exc:
        if exc.code is None or exc.code in DOCUMENTED:
            return int(exc.code or 0)
        # a library's own exit (1 would read as INVALID): a harness failure
        click.echo(f"wd-chaos: error: exited {_one_line(str(exc.code))}", err=True)
        return CRASHED
    except click.UsageError as exc:
        exc.show()
        return USAGE
    except click.ClickException as exc:
        exc.show()
        return CRASHED
    except (click.Abort, KeyboardInterrupt) as exc:
        stopped = exc if isinstance(exc, Stopped) else exc.__cause__
        signum = stopped.signum if isinstance(stopped, Stopped) else signal.SIGINT
        click.echo(f"wd-chaos: stopped by {signal.Signals(signum).name}", err=True)
        return 128 + signum
    except Exception as exc:
        if _debug["on"]:
            traceback.print_exc()
        text = str(exc) if isinstance(exc, HarnessError) else f"{type(exc).__name__}: {exc}"
        click.echo(f"wd-chaos: error: {_one_line(text)}", err=True)  # one line a CI log can grep
        return CRASHED


class _Cli(click.Group):
    """A group whose exit codes are the documented ones: click's own usage errors exit 64, not 2
    (which would read as UNKNOWN), and no exception leaves as a traceback and exit 1."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        _debug["on"] = False
        previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        for s in previous:
            signal.signal(s, _stop)
        try:
            code = _exit_code(
                lambda: super(_Cli, self).main(args, prog_name, complete_var, standalone_mode=False, **extra)
            )
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
        if standalone_mode:
            sys.exit(code)
        return code


def _label(valid: checks.Valid, yes: str, no: str, unsure: str) -> str:
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
        if checks.not_bitten(v.name, v.valid, v.counts):
            mark = "[yellow]not tested"
        text = v.summary
        if v.valid is not True and v.evidence:
            first = v.evidence[0]
            text += f"\n  e.g. {first.get('why', '')}: " + ", ".join(
                f"{k}={first[k]}" for k in ("process", "workflow", "key", "token", "op") if k in first
            )
        table.add_row(v.name, mark, text)
    caption = f"report: {outcome.run_dir / 'report.html'}  ({s.get('wall_seconds')} s)"
    if any(checks.not_bitten(v.name, v.valid, v.counts) for v in outcome.verdicts):
        caption = (
            "the store was NOT tested by the fault: it did not bite (run it again, with another "
            "--seed, to test it)\n" + caption
        )
    if s.get("schedule_from", "seed") != "seed":
        caption = f"fault schedule replayed from {s['schedule_from']}, not made from the seed\n" + caption
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


@click.group(cls=_Cli)
@click.option("--debug", is_flag=True, help="Show the traceback of a harness error.")
def main(debug: bool) -> None:
    """Fault-injection harness for without-durability's stores. Exit codes: 0 valid, 1 invalid,
    2 unknown; 64 a usage error; 130/143 stopped by SIGINT/SIGTERM; 255 the harness failed."""
    _debug["on"] = debug


def _kit_name(store: str) -> str:
    """``store``'s kit name, or a usage error naming the installed kits."""
    from without_durability.testing.kit import KitError, resolve

    try:
        return resolve(store)
    except KitError as exc:
        raise click.BadParameter(str(exc), param_hint="--store") from exc


_scenario_dirs = click.option(
    "--scenario-dir",
    "scenario_dirs",
    multiple=True,
    type=click.Path(path_type=Path),
    metavar="DIR",
    help="A folder of your own scenarios (NAME.toml), beside the built-in ones; repeatable. A name "
    "that clashes with another scenario's is refused.",
)


def _available(scenario_dirs: Sequence[Path]) -> dict[str, Any]:
    try:
        return available(scenario_dirs)
    except ScenarioError as exc:
        raise HarnessError(str(exc)) from exc


@main.command("list")
@_scenario_dirs
def list_(scenario_dirs: tuple[Path, ...]) -> None:
    """The installed store kits (what each provides) and the scenarios (built in, and those in
    --scenario-dir) with the stores each runs on."""
    from without_durability.testing.kit import broken_kits, kits

    from .kits import stores_for

    stores = Table(Column("store", no_wrap=True), "provides", "server", "description", title="stores")
    for name, kit in kits().items():
        reason = kit.unavailable()
        aliases = f" (also {', '.join(kit.aliases)})" if kit.aliases else ""
        stores.add_row(
            name + aliases,
            ", ".join(sorted(kit.provides)) or "conformance suite only",
            "[green]ok" if reason is None else f"[yellow]{reason}",
            kit.description,
        )
    for name, why in broken_kits().items():
        stores.add_row(name, "[red]failed to load", "", why)
    Console().print(stores)
    # a scenario's name is what the user copies into `wd-chaos run`: never wrapped
    table = Table(Column("scenario", no_wrap=True), "needs", "stores", "description", title="scenarios")
    for name, path in _available(scenario_dirs).items():
        try:
            sc = load_file(path)
            table.add_row(name, ", ".join(sorted(sc.requires())), ", ".join(stores_for(sc)), sc.description)
        except ScenarioError as exc:
            table.add_row(name, "", "[red]invalid", str(exc))
    Console().print(table)


@main.command("show")
@click.argument("name")
def show_cmd(name: str) -> None:
    """Print built-in scenario NAME as TOML, comments included, to start a scenario of your own
    from: save it as MY.toml, set its name to MY (a file's name must be its name), edit, then
    wd-chaos run MY.toml. An unknown NAME exits 64 naming the built-in ones."""
    from .scenario import BUILT_IN

    built_in = {p.name.removesuffix(".toml"): p for p in BUILT_IN.iterdir() if p.name.endswith(".toml")}
    if name not in built_in:
        raise click.UsageError(f"no built-in scenario {name!r}; built in: {', '.join(sorted(built_in))}")
    # the file as shipped, not a re-dump of the model: its comments say why each value is what it is
    click.echo(built_in[name].read_text(encoding="utf-8"), nl=False)


@main.command("run")
@click.argument("name", required=False)
@_scenario_dirs
@click.option(
    "--all",
    "run_all",
    is_flag=True,
    help="Every scenario on every store it applies to (with --store: on that store only).",
)
@click.option(
    "--store",
    default=None,
    metavar="NAME",
    help="The store kit to run against (default sqlite; wd-chaos list shows those installed).",
)
@click.option("--seed", type=int, default=None, help="Fixes the workload and the fault schedule.")
@click.option(
    "--time-limit",
    type=Bounded(TimeLimit, click.FLOAT, "time_limit"),
    default=None,
    help="Seconds of workload and faults (0 < s <= 3600, past the first fault); longer scales "
    "the workflows (at most 10000) and repeats the faults.",
)
@click.option(
    "--workers",
    type=Bounded(WorkerCount, click.INT, "workload.workers"),
    default=None,
    help="Worker processes (1 to 64).",
)
@click.option("--report-dir", type=click.Path(path_type=Path), default=Path("reports"))
@click.option("--junit", type=click.Path(path_type=Path), default=None)
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
    help="Break the store the way this catalogue mutant says (it must be caught; wd-chaos mutants "
    "--store NAME runs them all).",
)
@click.option(
    "--schedule",
    "schedule_file",
    type=click.Path(path_type=Path),
    default=None,
    metavar="FILE",
    help="Run this exact fault schedule (a JSON list of events, or a run's run.json) instead of "
    "the one the seed makes; a shrink's schedule.json is one.",
)
@click.option(
    "--locust-workers",
    type=click.IntRange(0, 64),
    default=0,
    help="A storm's locust in its distributed mode: a master and N worker processes (default 0: one "
    "process). More machines join with locust --worker --master-host, given the same run.",
)
@click.option(
    "--check",
    "check_only",
    is_flag=True,
    help="Validate the options and the servers' availability, print the runs, start nothing.",
)
def run_cmd(
    name: str | None,
    scenario_dirs: tuple[Path, ...],
    run_all: bool,
    store: str | None,
    seed: int | None,
    time_limit: float | None,
    workers: int | None,
    report_dir: Path,
    junit: Path | None,
    client: str | None,
    mutant: str | None,
    schedule_file: Path | None,
    locust_workers: int,
    check_only: bool,
) -> None:
    """Run scenario NAME (a name from ``wd-chaos list``, or the path of your own .toml file), or
    --all, and print a verdict; exit 0 valid, 1 invalid, 2 unknown."""
    if name and run_all:
        raise click.UsageError("give a scenario NAME or --all, not both")
    if schedule_file is not None and run_all:
        raise click.UsageError("--schedule replays one scenario's schedule: give a NAME, not --all")
    schedule = None
    if schedule_file is not None:
        try:
            schedule = load_schedule(schedule_file)
        except OptionError as exc:
            raise click.BadParameter(str(exc), param_hint="--schedule") from exc
    try:
        if run_all:
            jobs: list[tuple[Scenario, str]] = []
            for sc_name in available(scenario_dirs):
                sc = find(sc_name, scenario_dirs)
                if sc.expect != "valid":  # shows writes lost by design; run it by name
                    continue
                for one in stores_for(sc):
                    if store is None or one == _kit_name(store):
                        jobs.append((sc, one))
        elif name:
            sc = find(name, scenario_dirs)
            jobs = [(sc, store or "sqlite")]
        else:
            raise click.UsageError("give a scenario NAME or --all (see wd-chaos list)")
    except ScenarioError as exc:
        raise HarnessError(str(exc)) from exc
    planned: list[tuple[Scenario, Options]] = []
    for sc, st in jobs:
        opts = Options(
            store=st,
            seed=seed,
            time_limit=time_limit,
            workers=workers,
            report_dir=report_dir,
            client=client,
            mutant=mutant,
            schedule=schedule,
            schedule_source=str(schedule_file) if schedule_file is not None else None,
            locust_workers=locust_workers,
        )
        try:
            check_options(sc, opts)
        except OptionError as exc:
            raise click.UsageError(f"{sc.name} on {st}: {exc}") from exc
        reason = check_available(st, **service_needs([{"fault": f.kind} for f in sc.faults]))
        if reason:
            raise HarnessError(f"{sc.name} on {st}: cannot get its servers: {reason}")
        planned.append((sc, opts))
    # every output path is tried before the first run: a lost report or junit file is found now
    probe_dir(report_dir, "--report-dir")
    if junit:
        probe_file(junit, "--junit")
    if check_only:
        for sc, opts in planned:
            replay = (
                f", replaying {len(schedule)} faults from {schedule_file}" if schedule is not None else ""
            )
            Console().print(f"{sc.name} on {opts.store}: would run (report in {report_dir}{replay})")
        return
    outcomes: list[Outcome] = []
    for sc, opts in planned:
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
        except Exception as exc:
            raise HarnessError(f"{sc.name} on {opts.store}: {type(exc).__name__}: {exc}") from exc
        Console().print(_verdict_table(outcome))
        if outcome.valid is False:  # one line of its own, so it copies whole
            Console(soft_wrap=True).print(
                f"smallest failing fault schedule: {shrink_command(outcome.run_dir)}", highlight=False
            )
        outcomes.append(outcome)
    if junit:
        _junit(junit, outcomes)
    sys.exit(checks.exit_code(checks.overall([checks.Verdict("run", o.valid, "") for o in outcomes])))


@main.command("analyze")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--junit", type=click.Path(path_type=Path), default=None)
def analyze_cmd(run_dir: Path, junit: Path | None) -> None:
    """Re-check a stored run's history and final state; exit as ``run`` would. A folder that is
    not a finished run's, or whose history was cut or altered, exits 255 and is left as it was."""
    if junit:
        probe_file(junit, "--junit")
    outcome = analyze(run_dir)
    Console().print(_verdict_table(outcome))
    if junit:
        _junit(junit, [outcome])
    sys.exit(checks.exit_code(outcome.valid))


@main.command("shrink")
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
    from .runner import DamagedRun
    from .shrink import NothingToShrink, shrink

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


@main.command("clean")
@click.option("--report-dir", type=click.Path(path_type=Path), default=Path("reports"))
def clean_cmd(report_dir: Path) -> None:
    """Remove what killed runs left behind: private servers whose owner is gone (killed, folder
    removed), and unfinished run folders whose controller is gone (processes killed, marked
    INTERRUPTED). Finished runs and running ones are left alone."""
    from .lifeline import mark_stale_runs

    did = mark_stale_runs(report_dir) + [f"removed server folder {p}" for p in sweep_stale()]
    for line in did:
        click.echo(line)
    click.echo(f"cleaned: {len(did)} things" if did else "nothing to clean")


main.add_command(mutants_command)
main.add_command(mutate_command)
main.add_command(serve_command)

if __name__ == "__main__":
    main()
