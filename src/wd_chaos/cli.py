"""``wd-chaos``: list, run, analyze and shrink scenarios' runs, and clean up after a killed run.

Exit codes, and nothing else produces them: 0 valid, 1 invalid, 2 unknown (a verdict); 64 a usage
error (a bad option or value, an unknown scenario, store or scenario-file key, an output path that
cannot be written; the run never started); 130 interrupted by SIGINT, 143 by SIGTERM (the run's
folder says ``INTERRUPTED``); 255 the harness itself failed (a server could not be had or reached,
a bad scenario file, a damaged run folder), with one line naming the cause (``--debug`` adds the
traceback). Of several runs (``--all``, ``--repeat``): 255 if any could not start or finish, else
the worst verdict. docs/cli-gate.md is the reference of the CI-facing options.
"""

from __future__ import annotations

import json
import secrets
import signal
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import click
from click.shell_completion import CompletionItem
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
    UnknownName,
    WorkerCount,
    available,
    close_to,
    find,
    load_file,
    load_schedule,
)
from .serve import serve_command
from .services import ServerUnavailable, check_available, preflight, sweep_stale
from .shrink import shrink_command

console = Console(stderr=True)
PIPED_WIDTH = 160
"""The least width tables are laid out in when the output is not a terminal (a CI log, a pipe):
rich would take 80 columns there and squeeze, or cut, long names."""


def _table_console(stderr: bool = False) -> Console:
    """A console for tables: a terminal's own width; at least ``PIPED_WIDTH`` when piped."""
    found = Console(stderr=stderr)
    return found if found.is_terminal else Console(stderr=stderr, width=max(found.width, PIPED_WIDTH))
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
    if s.get("partial"):
        label += " [yellow](PARTIAL: an interrupted run, judged on what it recorded)"
    table = Table(title=f"{s['scenario']} on {s['store']} (seed {s['seed']}): {label}", show_lines=False)
    # a checker's name is what a reader searches for: never cut, however narrow the output
    table.add_column("checker", no_wrap=True, min_width=max((len(v.name) for v in outcome.verdicts), default=7))
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
    caption = f"{s.get('wall_seconds')} s"  # the report's path follows on a line of its own
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


VERDICT_NAMES = {True: "valid", False: "invalid"}


def _verdict_name(valid: checks.Valid) -> str:
    return VERDICT_NAMES.get(valid, "unknown") if isinstance(valid, bool) else "unknown"


@dataclass
class Result:
    """One planned run as the CLI reports it: its outcome, or why it could not start or finish
    (``error``, one line naming the cause)."""

    scenario: str
    store: str
    seed: int
    outcome: Outcome | None = None
    error: str | None = None
    run_dir: Path | None = None
    seconds: float = 0.0

    @property
    def exit_code(self) -> int:
        """255 for a run that could not start or finish, else its verdict's code (0, 1, 2)."""
        return CRASHED if self.outcome is None else checks.exit_code(self.outcome.valid)

    def record(self) -> dict[str, Any]:
        """The run's JSON line (``--json``): scenario, store, seed, verdict (valid, invalid, unknown,
        error), exit_code, run_dir, seconds, partial, checkers (name, verdict, summary), coverage
        (when the scenario counts windows), error (when it could not run)."""
        out: dict[str, Any] = {
            "scenario": self.scenario,
            "store": self.store,
            "seed": self.seed,
            "verdict": "error",
            "exit_code": self.exit_code,
            "run_dir": str(self.run_dir) if self.run_dir is not None else None,
            "seconds": round(self.seconds, 2),
            "partial": False,
            "checkers": [],
        }
        if self.outcome is None:
            out["error"] = self.error
            return out
        s = self.outcome.summary
        out["verdict"] = _verdict_name(self.outcome.valid)
        out["run_dir"] = str(self.outcome.run_dir)
        out["partial"] = bool(s.get("partial", False))
        if s.get("wall_seconds") is not None:
            out["seconds"] = s["wall_seconds"]
        out["checkers"] = [
            {"name": v.name, "verdict": _verdict_name(v.valid), "summary": v.summary}
            for v in self.outcome.verdicts
        ]
        if s.get("coverage"):
            out["coverage"] = s["coverage"]
        return out


def _junit(path: Path, results: Sequence[Result]) -> None:
    """Write ``results`` as a JUnit file: one test case per run (``SCENARIO[STORE]``, with its seed
    when a pair ran more than once) whose properties carry scenario, store, seed, duration and run
    folder; an invalid run is a ``<failure>`` whose text is the failing checkers' evidence as JSON,
    an unknown one ``<skipped>``, one that could not start or finish an ``<error>`` naming why."""
    import xml.etree.ElementTree as ET

    pairs = Counter((r.scenario, r.store) for r in results)
    suite = ET.Element("testsuite", name="wd-chaos")
    counts = Counter[str]()
    for r in results:
        name = f"{r.scenario}[{r.store}]" + (f" seed {r.seed}" if pairs[(r.scenario, r.store)] > 1 else "")
        case = ET.SubElement(suite, "testcase", classname="wd-chaos", name=name, time=f"{r.seconds:.2f}")
        props = ET.SubElement(case, "properties")
        rec = r.record()
        for key in ("scenario", "store", "seed", "seconds", "run_dir", "partial"):
            value = rec[key]
            shown = "" if value is None else json.dumps(value) if isinstance(value, bool) else str(value)
            ET.SubElement(props, "property", name=key, value=shown)
        if r.outcome is None:
            counts["errors"] += 1
            err = ET.SubElement(case, "error", message=str(r.error), type="harness")
            err.text = str(r.error)
            continue
        partial = " (partial: an interrupted run's records)" if rec["partial"] else ""
        bad = [v for v in r.outcome.verdicts if v.valid is not True]
        if r.outcome.valid is False:
            counts["failures"] += 1
            failed = [v for v in bad if v.valid is False]
            fail = ET.SubElement(
                case,
                "failure",
                message=f"INVALID{partial}: " + "; ".join(f"{v.name}: {v.summary}" for v in failed),
                type="invalid",
            )
            fail.text = json.dumps(
                [{"checker": v.name, "summary": v.summary, "evidence": v.evidence[:5]} for v in failed],
                indent=1,
                default=str,
            )
        elif r.outcome.valid is not True:
            counts["skipped"] += 1
            ET.SubElement(
                case,
                "skipped",
                message=f"UNKNOWN{partial}: " + "; ".join(f"{v.name}: {v.summary}" for v in bad),
            )
    suite.set("tests", str(len(results)))
    for key in ("failures", "errors", "skipped"):
        suite.set(key, str(counts[key]))
    tmp = path.with_name(path.name + ".tmp")
    ET.ElementTree(suite).write(tmp, encoding="utf-8", xml_declaration=True)
    tmp.replace(path)  # a reader never sees half a file


RUN_EXAMPLES = """\b
Examples:
  wd-chaos run lease-stall --store postgres
  wd-chaos run lease-stall --store redis --repeat 5 --seed random --stop-on-fail
  wd-chaos run --all --store postgres --junit chaos.xml --json > runs.jsonl
  wd-chaos run --all --check          (pre-flight: servers reached, plan and duration)
  wd-chaos run ./my-scenario.toml --time-limit 10
"""
MAIN_EXAMPLES = """\b
Examples:
  wd-chaos list
  wd-chaos run lease-stall --store postgres --check
  wd-chaos run --all --junit chaos.xml
  wd-chaos analyze reports/20261203T120000-lease-stall-postgres
  wd-chaos clean --interrupted
"""
EXAMPLES = {
    "list": "\b\nExamples:\n  wd-chaos list\n  wd-chaos list --json | jq -r '.name'",
    "analyze": "\b\nExamples:\n  wd-chaos analyze reports/RUN --junit run.xml\n"
    "  wd-chaos analyze --partial reports/RUN    (a run that was interrupted)",
    "shrink": "\b\nExamples:\n  wd-chaos shrink reports/RUN --budget-minutes 10",
    "clean": "\b\nExamples:\n  wd-chaos clean\n  wd-chaos clean --interrupted --report-dir reports",
    "mutants": "\b\nExamples:\n  wd-chaos mutants --store postgres\n  wd-chaos mutants --store redis --no-chaos",
    "mutate": "\b\nExamples:\n  wd-chaos mutate --store postgres",
    "show": "\b\nExamples:\n  wd-chaos show lease-stall > my.toml    (then set its name to \"my\")",
    "serve": "\b\nExamples:\n  wd-chaos serve\n  wd-chaos serve reports --port 0    (a free port; the URL is printed)",
}
"""The examples each command's ``--help`` ends with (``run`` and the group have their own)."""


def _set_debug(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        _debug["on"] = True


_DEBUG_HELP = "Show the traceback of a harness error (before or after the command)."


def _version() -> str:
    from . import __version__

    return __version__


@click.group(
    cls=_Cli,
    epilog=MAIN_EXAMPLES,
    context_settings={"help_option_names": ["-h", "--help"], "show_default": True},
)
@click.version_option(_version(), "--version", "-V", prog_name="wd-chaos", message="%(prog)s %(version)s")
@click.option("--debug", is_flag=True, expose_value=False, callback=_set_debug, help=_DEBUG_HELP)
def main() -> None:
    """Fault-injection harness for without-durability's stores. Exit codes: 0 valid, 1 invalid,
    2 unknown; 64 a usage error; 130/143 stopped by SIGINT/SIGTERM; 255 the harness failed."""


def _kit_name(store: str) -> str:
    """``store``'s kit name, or a usage error naming the installed kits."""
    from without_durability.testing.kit import KitError, resolve

    from .kits import chaos_kits

    try:
        return resolve(store)
    except KitError as exc:
        names = [n for name, kit in chaos_kits().items() for n in (name, *kit.aliases)]
        raise click.BadParameter(str(exc) + close_to(store, names), param_hint="--store") from exc


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
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="One JSON object per line instead of the tables: each store kit (type 'store': name, aliases, "
    "provides, available, reason, description), then each scenario (type 'scenario': name, needs, "
    "stores, description, error).",
)
def list_(scenario_dirs: tuple[Path, ...], as_json: bool) -> None:
    """The installed store kits (what each provides) and the scenarios (built in, and those in
    --scenario-dir) with the stores each runs on."""
    from without_durability.testing.kit import broken_kits, kits

    from .kits import stores_for

    store_rows: list[dict[str, Any]] = []
    for name, kit in kits().items():
        reason = kit.unavailable()
        store_rows.append({
            "type": "store", "name": name, "aliases": list(kit.aliases), "provides": sorted(kit.provides),
            "available": reason is None, "reason": reason, "description": kit.description,
        })  # fmt: skip
    for name, why in broken_kits().items():
        store_rows.append({
            "type": "store", "name": name, "aliases": [], "provides": [], "available": False,
            "reason": f"failed to load: {why}", "description": "",
        })  # fmt: skip
    scenario_rows: list[dict[str, Any]] = []
    for name, path in _available(scenario_dirs).items():
        try:
            sc = load_file(path)
            scenario_rows.append({
                "type": "scenario", "name": name, "needs": sorted(sc.requires()), "stores": stores_for(sc),
                "description": sc.description, "error": None,
            })  # fmt: skip
        except ScenarioError as exc:
            scenario_rows.append({
                "type": "scenario", "name": name, "needs": [], "stores": [], "description": "", "error": str(exc),
            })  # fmt: skip
    if as_json:
        for row in store_rows + scenario_rows:
            click.echo(json.dumps(row))
        return
    # a name is what the user copies into `wd-chaos run`: never wrapped nor cut, even when piped
    # (an 80-column pipe would otherwise ellipsize it): its column is at least the longest name
    labels = [r["name"] + (f" (also {', '.join(r['aliases'])})" if r["aliases"] else "") for r in store_rows]
    stores = Table(
        Column("store", no_wrap=True, min_width=max(map(len, labels), default=5)),
        Column("provides", overflow="fold"), Column("server", overflow="fold"),
        Column("description", overflow="fold"), title="stores",
    )  # fmt: skip
    for label, r in zip(labels, store_rows, strict=True):
        stores.add_row(
            label,
            ", ".join(r["provides"]) or ("[red]failed to load" if not r["description"] else "conformance suite only"),
            "[green]ok" if r["available"] else f"[yellow]{r['reason']}",
            r["description"],
        )
    _table_console().print(stores)
    table = Table(
        Column("scenario", no_wrap=True, min_width=max((len(r["name"]) for r in scenario_rows), default=8)),
        Column("needs", overflow="fold"), Column("stores", overflow="fold"),
        Column("description", overflow="fold"), title="scenarios",
    )  # fmt: skip
    for r in scenario_rows:
        if r["error"] is None:
            table.add_row(r["name"], ", ".join(r["needs"]), ", ".join(r["stores"]), r["description"])
        else:
            table.add_row(r["name"], "", "[red]invalid", r["error"])
    _table_console().print(table)


@main.command("show")
@click.argument("name")
def show_cmd(name: str) -> None:
    """Print built-in scenario NAME as TOML, comments included, to start a scenario of your own
    from: save it as MY.toml, set its name to MY (a file's name must be its name), edit, then
    wd-chaos run MY.toml. An unknown NAME exits 64 naming the built-in ones."""
    from .scenario import BUILT_IN, close_to

    built_in = {p.name.removesuffix(".toml"): p for p in BUILT_IN.iterdir() if p.name.endswith(".toml")}
    if name not in built_in:
        raise click.UsageError(
            f"no built-in scenario {name!r}{close_to(name, sorted(built_in))} (built in: {', '.join(sorted(built_in))})"
        )
    # the file as shipped, not a re-dump of the model: its comments say why each value is what it is
    click.echo(built_in[name].read_text(encoding="utf-8"), nl=False)


class _Seed(click.ParamType[Any, Any]):
    """A seed: an integer, or ``random`` for one picked now (and printed with the run)."""

    name = "integer|random"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and value.strip().lower() == "random":
            return secrets.randbelow(2**31)
        return click.INT.convert(value, param, ctx)


def _complete_scenarios(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    dirs = ctx.params.get("scenario_dirs") or ()
    try:
        names = list(available(dirs))
    except ScenarioError:
        names = list(available())
    return [CompletionItem(n) for n in names if n.startswith(incomplete)]


def _complete_stores(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    from .kits import chaos_kits

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
    where = "; ".join(f"{p.role}: {p.detail}" if p.source == "none" else f"{p.role} ({p.source}): {p.detail}" for p in servers)
    return (
        f"{sc.name} on {opts.store}: would run with seed {opts.seed}, "
        f"{opts.workers or sc.workload.workers} workers, time limit "
        f"{opts.time_limit if opts.time_limit is not None else sc.time_limit:g} s, "
        f"about {likely:.0f} s (at most {most:.0f} s); servers: {where}"
    )


def _scenario_or_usage(name: str, dirs: Sequence[Path]) -> Scenario:
    """The scenario ``name``; an unknown name or a scenario file's unknown key is a usage error
    (exit 64, with the names it may have meant), any other bad file a harness error (255)."""
    try:
        return find(name, dirs)
    except UnknownName as exc:
        raise click.UsageError(str(exc)) from exc
    except ScenarioError as exc:
        raise HarnessError(str(exc)) from exc


@main.command("run", epilog=RUN_EXAMPLES)
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
@click.option("--stop-on-fail", is_flag=True, help="Start no more runs after one is invalid or could not run.")
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
@click.option("--report-dir", type=click.Path(path_type=Path), default=Path("reports"), help="Where run folders go.")
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
        store = _kit_name(store)
    if run_all:
        jobs: list[tuple[Scenario, str]] = []
        for sc_name in _available(scenario_dirs):
            sc = _scenario_or_usage(sc_name, scenario_dirs)
            if sc.expect != "valid":  # shows writes lost by design; run it by name
                continue
            for one in stores_for(sc):
                if store is None or one == store:
                    jobs.append((sc, one))
    elif name:
        jobs = [(_scenario_or_usage(name, scenario_dirs), store or "sqlite")]
    else:
        raise click.UsageError("give a scenario NAME or --all (see wd-chaos list)")
    planned: list[tuple[Scenario, Options]] = []
    for sc, st in jobs:
        base = sc.seed if seed is None else seed
        for i in range(repeat):
            opts = Options(
                store=st,
                seed=base + i,
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
            planned.append((sc, opts))
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
                out.note(f"--stop-on-fail: {sc.name} on {opts.store} failed; {len(planned) - len(results)} runs not started")
                break
    finally:  # whatever happened, even Ctrl-C, the file says what ran
        if junit:
            _junit(junit, results)
    if len(results) > 1:
        out.note(_totals(results))
    sys.exit(_worst(results))


def _worst(results: Sequence[Result]) -> int:
    """255 if any run could not start or finish, else the worst verdict's code."""
    if any(r.outcome is None for r in results):
        return CRASHED
    return checks.exit_code(checks.overall([checks.Verdict("run", r.outcome.valid, "") for r in results if r.outcome]))


def _totals(results: Sequence[Result]) -> str:
    counts = Counter(r.record()["verdict"] for r in results)
    return f"{len(results)} runs: " + ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))


class _Out:
    """Where a command's output goes: with ``--json``, JSON lines alone on stdout and everything
    else on stderr; otherwise tables and lines on stdout, progress on stderr."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        # tables never cut a name: the name columns have their longest name as their minimum width
        self.tables = _table_console(stderr=as_json)
        self.lines = Console(stderr=as_json, soft_wrap=True, highlight=False)

    def line(self, text: str) -> None:
        """One unwrapped line (a path a script picks out)."""
        self.lines.print(text, markup=False)

    def note(self, text: str) -> None:
        self.lines.print(text)

    def json(self, record: dict[str, Any]) -> None:
        if self.as_json:
            click.echo(json.dumps(record, default=str))


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
            out.json({"scenario": sc.name, "store": opts.store, "seed": opts.seed, "check": "error", "error": failed[-1]})
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
        out.line(f"{len(planned)} runs, about {total[0] / 60:.1f} min in all (at most {total[1] / 60:.1f} min)")
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


def _show_outcome(outcome: Outcome, out: _Out) -> None:
    out.tables.print(_verdict_table(outcome))
    if outcome.valid is False and not outcome.summary.get("partial"):  # one line of its own, so it copies whole
        out.line(f"smallest failing fault schedule: {shrink_command(outcome.run_dir)}")
    out.line(f"report: {outcome.run_dir / 'report.html'}")
    out.line(f"run folder: {outcome.run_dir}")


@main.command("analyze")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--junit", type=click.Path(path_type=Path), default=None, metavar="FILE", help="Write a JUnit file.")
@click.option("--json", "as_json", is_flag=True, help="Print the run's JSON object on stdout (as run --json).")
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
    from .runner import DamagedRun, analyze_partial

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
@click.option(
    "--interrupted",
    is_flag=True,
    help="Also remove the run folders marked INTERRUPTED (after cleaning up after them); "
    "finished runs are kept.",
)
def clean_cmd(report_dir: Path, interrupted: bool) -> None:
    """Remove what killed runs left behind: private servers whose owner is gone (killed, folder
    removed), and unfinished run folders whose controller is gone (processes killed, marked
    INTERRUPTED). Finished runs and running ones are left alone; with --interrupted, the folders
    marked INTERRUPTED are removed too."""
    import shutil

    from .lifeline import mark_stale_runs

    did = mark_stale_runs(report_dir) + [f"removed server folder {p}" for p in sweep_stale()]
    if interrupted and report_dir.is_dir():
        for folder in sorted(p for p in report_dir.iterdir() if (p / "INTERRUPTED").is_file()):
            shutil.rmtree(folder)
            did.append(f"removed interrupted run folder {folder}")
    for line in did:
        click.echo(line)
    click.echo(f"cleaned: {len(did)} things" if did else "nothing to clean")


main.add_command(mutants_command)
main.add_command(mutate_command)
main.add_command(serve_command)
for _name, _command in main.commands.items():
    # global options work after the subcommand too (wd-chaos run NAME --debug)
    if not any(p.name == "debug" for p in _command.params):
        _command.params.append(
            click.Option(["--debug"], is_flag=True, expose_value=False, callback=_set_debug, help=_DEBUG_HELP)
        )
    if _command.epilog is None and _name in EXAMPLES:
        _command.epilog = EXAMPLES[_name]

if __name__ == "__main__":
    main()
