"""What every ``wd-chaos`` command shares: the documented exit codes and the group class that keeps
to them (``_Cli``), ``--debug``, output consoles and tables, the JSON and JUnit records of a run
(``Result``), and resolving store and scenario names."""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .. import checks
from ..analyze import Outcome, expected_text
from ..report import reproduce_command
from ..rundir import shrink_command
from ..scenario import (
    Scenario,
    ScenarioError,
    UnknownName,
    available,
    close_to,
    find,
)

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


def first_evidence(item: object) -> str:
    """A checker's first evidence on one line: its why (or what), then the fields a reader looks
    up (process, workflow, key, token, op, window, hits); empty when it names none of them."""
    if not isinstance(item, dict):
        return str(item) if item not in (None, "") else ""
    why = str(item.get("why") or item.get("what") or "")
    fields = ", ".join(
        f"{k}={item[k]}" for k in ("process", "workflow", "key", "token", "op", "window", "hits") if k in item
    )
    return f"{why}: {fields}" if why and fields else why or fields


def _row_mark(v: checks.Verdict) -> str:
    """A checker row's verdict: a bite or coverage row is about the run, not the store, so it says
    whether the fault bit or the window was reached rather than "valid"."""
    if checks.not_bitten(v.name, v.valid, v.counts):
        return "[yellow]not tested"
    if v.name.startswith("bite") and v.valid is True:
        return "[green]bit"
    if v.name == "coverage" and v.valid is True:
        return "[green]reached"
    if v.name == "coverage" and v.valid is not False:
        return "[yellow]not reached"
    return _label(v.valid, "[green]valid", "[red bold]INVALID", "[yellow]unknown")


def _verdict_table(outcome: Outcome) -> Table:
    s = outcome.summary
    label = _label(outcome.valid, "[green]VALID", "[red bold]INVALID", "[yellow]UNKNOWN")
    if outcome.expected:
        label = "[blue bold]EXPECTED[/] (the loss this scenario exists to show)"
    if s.get("partial"):
        label += " [yellow](PARTIAL: an interrupted run, judged on what it recorded)"
    table = Table(title=f"{s['scenario']} on {s['store']} (seed {s['seed']}): {label}", show_lines=False)
    # a checker's name is what a reader searches for: never cut, however narrow the output
    table.add_column(
        "checker", no_wrap=True, min_width=max((len(v.name) for v in outcome.verdicts), default=7)
    )
    table.add_column("verdict")
    table.add_column("summary", overflow="fold")
    for v in outcome.verdicts:
        text = v.summary
        example = first_evidence(v.evidence[0]) if v.valid is not True and v.evidence else ""
        if example:
            text += f"\n  e.g. {example}"
        table.add_row(v.name, _row_mark(v), escape(text))
    caption = f"{s.get('wall_seconds')} s"  # the report's path follows on a line of its own
    if outcome.expected:
        caption = expected_text(outcome.expected) + "\n" + caption
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
        """255 for a run that could not start or finish, else its verdict's code (0 valid or
        expected, 1 invalid, 2 unknown)."""
        return CRASHED if self.outcome is None else self.outcome.exit_code

    def record(self) -> dict[str, Any]:
        """The run's JSON line (``--json``): scenario, store, seed, verdict (valid, invalid, unknown,
        expected, error), exit_code, run_dir, seconds, partial, checkers (name, verdict, summary,
        and for one not valid its first evidence), reproduce (the command that runs it again),
        shrink (for an invalid run: the command that finds its smallest failing schedule),
        expected (the loss, for an expected verdict), coverage (when the scenario counts
        windows), error (when it could not run)."""
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
        out["verdict"] = self.outcome.verdict
        out["run_dir"] = str(self.outcome.run_dir)
        out["partial"] = bool(s.get("partial", False))
        if s.get("wall_seconds") is not None:
            out["seconds"] = s["wall_seconds"]
        checkers = []
        for v in self.outcome.verdicts:
            one: dict[str, Any] = {"name": v.name, "verdict": _verdict_name(v.valid), "summary": v.summary}
            if v.valid is not True and v.evidence:
                one["evidence"] = v.evidence[0]
            checkers.append(one)
        out["checkers"] = checkers
        if self.outcome.expected:
            out["expected"] = self.outcome.expected
        with contextlib.suppress(KeyError, TypeError, ValueError):  # a summary without its figures
            out["reproduce"] = reproduce_command(self.outcome.run_dir, s)
        if self.outcome.verdict == "invalid" and not out["partial"]:
            out["shrink"] = shrink_command(self.outcome.run_dir)
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
        ET.SubElement(props, "property", name="verdict", value=rec["verdict"])
        partial = " (partial: an interrupted run's records)" if rec["partial"] else ""
        bad = [v for v in r.outcome.verdicts if v.valid is not True]
        if r.outcome.expected:  # a pass: the loss the scenario exists to show, with its figure
            out = ET.SubElement(case, "system-out")
            out.text = expected_text(r.outcome.expected)
        elif r.outcome.valid is False:
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


def _set_debug(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        _debug["on"] = True


_DEBUG_HELP = "Show the traceback of a harness error (before or after the command)."


def _kit_name(store: str) -> str:
    """``store``'s kit name, or a usage error naming the installed kits."""
    from without_durability.testing.kit import KitError, resolve

    from ..control.kits import chaos_kits

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


def _scenario_or_usage(name: str, dirs: Sequence[Path]) -> Scenario:
    """The scenario ``name``; an unknown name or a scenario file's unknown key is a usage error
    (exit 64, with the names it may have meant), any other bad file a harness error (255)."""
    try:
        return find(name, dirs)
    except UnknownName as exc:
        raise click.UsageError(str(exc)) from exc
    except ScenarioError as exc:
        raise HarnessError(str(exc)) from exc


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


def _show_outcome(outcome: Outcome, out: _Out) -> None:
    out.tables.print(_verdict_table(outcome))
    if outcome.verdict == "invalid" and not outcome.summary.get("partial"):
        out.line(f"smallest failing fault schedule: {shrink_command(outcome.run_dir)}")  # copies whole
    out.line(f"report: {outcome.run_dir / 'report.html'}")
    out.line(f"run folder: {outcome.run_dir}")
