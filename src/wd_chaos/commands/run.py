"""``wd-chaos run``: plan the runs the options ask for, check them (``--check``), run each and
report its verdict; the exit code is the worst."""

from __future__ import annotations

import dataclasses
import secrets
import shlex
import sys
import time
import traceback
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
from click.shell_completion import CompletionItem
from rich.live import Live

from without_durability.testing.kit import default_kit

from ..control.kits import stores_for
from ..control.runner import Options, check_options, run
from ..control.services import ServerUnavailable, check_available, preflight
from ..faults import service_needs
from ..options import Bounded, probe_dir, probe_file
from ..scenario import (
    OptionError,
    Scenario,
    ScenarioError,
    TimeLimit,
    WorkerCount,
    available,
    load_schedule,
)
from .common import (
    CRASHED,
    HarnessError,
    Result,
    _available,
    _debug,
    _junit,
    _kit_name,
    _one_line,
    _Out,
    _progress_view,
    _scenario_dirs,
    _scenario_or_usage,
    _show_outcome,
    console,
)

RUN_EXAMPLES = """\b
Examples:
  wd-chaos run lease-stall --store postgres
  wd-chaos run lease-stall --store redis --repeat 5 --seed random --stop-on-fail
  wd-chaos run --all --store postgres --junit chaos.xml --json > runs.jsonl
  wd-chaos run --all --check          (pre-flight: servers reached, plan and duration)
  wd-chaos run ./my-scenario.toml --time-limit 10
"""


class _Seed(click.ParamType[Any, Any]):
    """A seed: an integer, or ``random`` for one picked now (and printed with the run)."""

    name = "integer|random"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and value.strip().lower() == "random":
            return secrets.randbelow(2**31)
        seed = click.INT.convert(value, param, ctx)
        if seed < 0:  # as wd-chaos sim: a seed is 0 or more
            self.fail(f"{seed} is not a seed: give an integer 0 or more, or 'random'", param, ctx)
        return seed


def _complete_scenarios(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    dirs = ctx.params.get("scenario_dirs") or ()
    try:
        names = list(available(dirs))
    except ScenarioError:
        names = list(available())
    return [CompletionItem(n) for n in names if n.startswith(incomplete)]


def _complete_stores(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    from ..control.kits import chaos_kits

    names = [n for name, kit in chaos_kits().items() for n in (name, *kit.aliases)]
    return [CompletionItem(n) for n in names if n.startswith(incomplete)]


def _estimate(sc: Scenario, opts: Options) -> tuple[float, float]:
    """A run's likely and longest wall time in seconds: servers and processes starting, the
    workload (or storm), the heal (at most ``heal_seconds``), the checkers."""
    overhead = 8.0  # servers, processes and the checkers, as measured on a laptop
    if sc.storm is not None:
        seconds = sc.storm.seconds if opts.time_limit is None else opts.time_limit
        return seconds + overhead, seconds + overhead + 60
    limit = sc.time_limit if opts.time_limit is None else opts.time_limit
    return limit + overhead + 2, limit + overhead + sc.heal_seconds


def _plan_line(sc: Scenario, opts: Options, servers: Sequence[Any]) -> str:
    likely, most = _estimate(sc, opts)
    where = "; ".join(
        f"{p.role}: {p.detail}" if p.source == "none" else f"{p.role} ({p.source}): {p.detail}"
        for p in servers
    )
    return (
        f"{sc.name} on {opts.store}: would run with seed {opts.seed}, "
        f"{opts.workers or sc.workload.workers} workers, time limit "
        f"{opts.time_limit if opts.time_limit is not None else sc.time_limit:g} s, "
        f"about {likely:.0f} s (at most {most:.0f} s); servers: {where}"
    )


@click.command("run", epilog=RUN_EXAMPLES)
@click.argument("name", required=False, shell_complete=_complete_scenarios)
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
    shell_complete=_complete_stores,
    help="The store kit to run against (default sqlite; wd-chaos list shows those installed).",
)
@click.option(
    "--seed",
    type=_Seed(),
    default=None,
    help="Fixes the workload and the fault schedule (default: the scenario's own); 'random' picks one, "
    "printed with the run.",
)
@click.option(
    "--repeat",
    type=click.IntRange(1, 1000),
    default=1,
    help="Run each scenario this many times, with the seeds SEED, SEED+1, ... (each printed, and in "
    "the JSON); the exit code is the worst verdict.",
)
@click.option(
    "--stop-on-fail", is_flag=True, help="Start no more runs after one is invalid or could not run."
)
@click.option(
    "--time-limit",
    type=Bounded(TimeLimit, click.FLOAT, "time_limit"),
    default=None,
    help="Seconds of workload and faults (0 < s <= 3600, past the first fault); longer scales "
    "the workflows (at most 10000) and repeats the faults. Default: the scenario's own.",
)
@click.option(
    "--workers",
    type=Bounded(WorkerCount, click.INT, "workload.workers"),
    default=None,
    help="Worker processes (1 to 64). Default: the scenario's own.",
)
@click.option(
    "--report-dir", type=click.Path(path_type=Path), default=Path("reports"), help="Where run folders go."
)
@click.option(
    "--junit",
    type=click.Path(path_type=Path),
    default=None,
    metavar="FILE",
    help="Write a JUnit file: one test case per run, written even when runs could not start.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print one JSON object per run on stdout and nothing else there (tables go to stderr).",
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
    help="A storm's locust in its distributed mode: a master and N worker processes (0: one "
    "process). More machines join with locust --worker --master-host, given the same run.",
)
@click.option(
    "--check",
    "check_only",
    is_flag=True,
    help="Pre-flight: check the options, reach every server the runs would use (URLs, Docker, "
    "binaries), print the plan and its duration, start nothing. Exit 0, or 255 naming what is missing.",
)
def run_cmd(
    name: str | None,
    scenario_dirs: tuple[Path, ...],
    run_all: bool,
    store: str | None,
    seed: int | None,
    repeat: int,
    stop_on_fail: bool,
    time_limit: float | None,
    workers: int | None,
    report_dir: Path,
    junit: Path | None,
    as_json: bool,
    client: str | None,
    mutant: str | None,
    schedule_file: Path | None,
    locust_workers: int,
    check_only: bool,
) -> None:
    """Run scenario NAME (a name from ``wd-chaos list``, or the path of your own .toml file), or
    --all, and print a verdict; exit 0 valid, 1 invalid, 2 unknown, 255 when a run could not start."""
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
    if store is not None:
        given, store = store, _kit_name(store)
        if given != store:  # an alias: say which store kit it means, once, on stderr
            click.echo(f"wd-chaos: --store {given} is the store kit {store} (wd-chaos list shows each alias)", err=True)
    jobs = _jobs(name, run_all, store, scenario_dirs)
    template = Options(
        time_limit=time_limit,
        workers=workers,
        report_dir=report_dir,
        client=client,
        mutant=mutant,
        schedule=schedule,
        schedule_source=str(schedule_file) if schedule_file is not None else None,
        locust_workers=locust_workers,
    )
    planned = _planned(jobs, seed, repeat, template)
    if not planned:  # a gate that ran nothing must not pass
        raise click.UsageError(f"no scenario runs on store {store!r} (wd-chaos list shows where each runs)")
    # every output path is tried before the first run: a lost report or junit file is found now
    probe_dir(report_dir, "--report-dir")
    if junit:
        probe_file(junit, "--junit")
    out = _Out(as_json)
    if check_only:
        _check(planned, out)
        return
    results: list[Result] = []
    try:
        for sc, opts in planned:
            result = _run_one(sc, opts, out, results)
            if stop_on_fail and result.exit_code in (1, CRASHED):
                out.note(
                    f"--stop-on-fail: {sc.name} on {opts.store} failed; {len(planned) - len(results)} runs not started"
                )
                break
    finally:  # whatever happened, even Ctrl-C, the file says what ran
        if junit:
            _junit(junit, results)
    if len(results) > 1:
        out.note(_totals(results))
    sys.exit(_worst(results))


def _jobs(
    name: str | None, run_all: bool, store: str | None, scenario_dirs: Sequence[Path]
) -> list[tuple[Scenario, str]]:
    """The (scenario, store) pairs asked for: NAME on ``store`` (default: the kit registry's
    ``default_kit``), or with ``--all`` every scenario expected valid on every store it applies to
    (only ``store``, when given)."""
    if name:
        return [(_scenario_or_usage(name, scenario_dirs), store or default_kit())]
    if not run_all:
        raise click.UsageError("give a scenario NAME or --all (see wd-chaos list)")
    jobs: list[tuple[Scenario, str]] = []
    for sc_name in _available(scenario_dirs):
        sc = _scenario_or_usage(sc_name, scenario_dirs)
        if sc.expect != "valid":  # shows writes lost by design; run it by name
            continue
        jobs.extend((sc, one) for one in stores_for(sc) if store is None or one == store)
    return jobs


def _planned(
    jobs: Sequence[tuple[Scenario, str]], seed: int | None, repeat: int, template: Options
) -> list[tuple[Scenario, Options]]:
    """Each job ``repeat`` times (seeds SEED, SEED+1, ...) with ``template``'s options; options a
    scenario's bounds refuse are a usage error naming the scenario and store."""
    planned: list[tuple[Scenario, Options]] = []
    for sc, st in jobs:
        base = sc.seed if seed is None else seed
        for i in range(repeat):
            opts = dataclasses.replace(template, store=st, seed=base + i)
            try:
                check_options(sc, opts)
            except OptionError as exc:
                raise click.UsageError(f"{sc.name} on {st}: {exc}") from exc
            planned.append((sc, opts))
    return planned


def _worst(results: Sequence[Result]) -> int:
    """255 if any run could not start or finish, else the worst verdict's code."""
    if any(r.outcome is None for r in results):
        return CRASHED
    codes = {r.exit_code for r in results}
    return 1 if 1 in codes else 2 if 2 in codes else 0  # an expected verdict is 0


def _totals(results: Sequence[Result]) -> str:
    counts = Counter(r.record()["verdict"] for r in results)
    return f"{len(results)} runs: " + ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))


def _check(planned: Sequence[tuple[Scenario, Options]], out: _Out) -> None:
    """``--check``: reach every server each planned run would use and print the plan; exits 255
    (after the whole plan) naming what is missing when any run could not have its servers."""
    failed: list[str] = []
    total = [0.0, 0.0]
    for sc, opts in planned:
        try:
            servers = preflight(opts.store, **service_needs(_events(sc)))
        except ServerUnavailable as exc:
            failed.append(f"{sc.name} on {opts.store}: cannot get its servers: {exc}")
            out.json(
                {
                    "scenario": sc.name,
                    "store": opts.store,
                    "seed": opts.seed,
                    "check": "error",
                    "error": failed[-1],
                }
            )
            continue
        likely, most = _estimate(sc, opts)
        total[0] += likely
        total[1] += most
        replay = f", replaying {len(opts.schedule)} faults" if opts.schedule is not None else ""
        out.line(_plan_line(sc, opts, servers) + replay + f"; report in {opts.report_dir}")
        out.json({
            "scenario": sc.name, "store": opts.store, "seed": opts.seed, "check": "ok",
            "workers": opts.workers or sc.workload.workers,
            "time_limit": opts.time_limit if opts.time_limit is not None else sc.time_limit,
            "estimated_seconds": round(likely), "at_most_seconds": round(most),
            "servers": [{"role": p.role, "source": p.source, "detail": p.detail} for p in servers],
        })  # fmt: skip
    if len(planned) > 1:
        out.line(
            f"{len(planned)} runs, about {total[0] / 60:.1f} min in all (at most {total[1] / 60:.1f} min)"
        )
    if failed:
        raise HarnessError(" | ".join(failed))


def _events(sc: Scenario) -> list[dict[str, Any]]:
    return [{"fault": f.kind} for f in sc.faults]


def _run_one(sc: Scenario, opts: Options, out: _Out, results: list[Result]) -> Result:
    """Run one planned run, report it and add it to ``results``; a run that could not start or
    finish (a server refused, a crashed process) becomes a ``Result`` with its ``error``, and the
    caller carries on. One stopped by a signal is added as such before the signal goes on."""
    assert opts.seed is not None
    result = Result(sc.name, opts.store, opts.seed)
    results.append(result)
    started = time.monotonic()
    seen: dict[str, str] = {}
    try:
        reason = check_available(opts.store, **service_needs(_events(sc)))
        if reason:
            raise ServerUnavailable(reason)
        with Live(
            _progress_view({"phase": "starting"}),
            console=console,
            refresh_per_second=4,
            transient=True,
            redirect_stdout=False,  # stdout is the JSON lines' or the verdicts', never the progress's
        ) as live:

            def show(state: dict[str, Any], live: Live = live) -> None:
                folder = state.get("run_dir")
                if folder and "run_dir" not in seen:
                    seen["run_dir"] = folder
                    out.line(f"run: {sc.name} on {opts.store}, seed {opts.seed}: {folder}")
                live.update(_progress_view(state))

            result.outcome = run(sc, opts, show)
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: the JUnit file still names this run
        result.error = f"{sc.name} on {opts.store} (seed {opts.seed}): stopped by {str(exc) or 'SIGINT'}"
        result.run_dir = Path(seen["run_dir"]) if seen.get("run_dir") else None
        result.seconds = time.monotonic() - started
        if result.run_dir is not None:  # where the records are, and how to judge what they hold
            click.echo(
                f"wd-chaos: {sc.name} on {opts.store} stopped; its records are in {result.run_dir}\n"
                f"wd-chaos: judge what it recorded: wd-chaos analyze --partial {shlex.quote(str(result.run_dir))}",
                err=True,
            )
        raise
    except Exception as exc:
        cause = str(exc) if isinstance(exc, ServerUnavailable) else f"{type(exc).__name__}: {exc}"
        result.error = f"{sc.name} on {opts.store} (seed {opts.seed}): {_one_line(cause)}"
        if _debug["on"]:
            traceback.print_exc()
        click.echo(f"wd-chaos: error: {result.error}", err=True)
    result.seconds = time.monotonic() - started
    if seen.get("run_dir"):
        result.run_dir = Path(seen["run_dir"])
    if result.outcome is not None:
        _show_outcome(result.outcome, out)
    out.json(result.record())
    return result
