"""``wd-chaos mutants``: run the catalogue and fail unless every mutant is killed and every real store
passes the same checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from without_durability.testing.kit import KitError, resolve

from ..commands.common import _table_console
from ..options import Bounded, probe_dir
from ..scenario import TimeLimit, find
from . import CatalogueError, Mutant, catalogue, check_killers
from .gate_shrink import RUN_DIR
from .runner import RUNS, ChaosRunner, GateReport, chaos_share, run_gate

CHAOS_RETRIES = 3
"""Runs on other seeds a chaos killer gets when its run came out unknown (its fault did not bite),
or, on a mutant, came out valid: a fault schedule is a sample, and one that never reached the
window where the mutant differs from its store is no evidence that a run cannot catch it. Three,
so a mutant counts as not killed by wd-chaos only after four schedules missed it, and a kill one
seed in four finds is still found (the evidence names every run tried, so a weak kill shows)."""


def another_seed(summary: dict[str, Any], mutant: str | None) -> str | None:
    """Why a chaos killer's run (its ``summary.json``) should be made again on another seed, or
    None when it has said what it can: a run whose fault did not bite (or that never reached a
    window it must reach) tested nothing, as in the chaos gate; and a mutant's run that came out
    valid was one fault schedule that missed it (timing-bound kills, such as a power loss landing
    inside the second an everysec log has not fsynced yet, are samples). A real store's valid run
    and any invalid run are final."""
    valid = summary.get("valid")
    if valid is False or (valid is True and mutant is None):
        return None
    return "valid (the mutant was not caught)" if valid is True else "unknown"


@dataclass(frozen=True)
class ChaosAttempt:
    """One run a chaos killer made: its folder, the seed asked for (None: the scenario's own) and
    its ``summary.json``; ``why_again`` says why another run followed it (empty for the last)."""

    run_dir: str
    seed: int | None
    summary: dict[str, Any]
    why_again: str = ""


def attempts(
    run: Callable[[int | None], tuple[str, dict[str, Any]]], mutant: str | None, retries: int = CHAOS_RETRIES
) -> list[ChaosAttempt]:
    """Run a chaos killer's scenario (``run(seed)`` -> run folder, summary) until it has said what
    it can (``another_seed``): on the scenario's own seed, then on the next seeds, at most
    ``retries`` more. A run unknown across a wall-clock step of this machine proves nothing either
    way and is made once more on its seed, not counted as a retry. The last attempt is the verdict."""
    done: list[ChaosAttempt] = []
    seed: int | None = None
    retried, stepped = 0, False
    while True:
        run_dir, summary = run(seed)
        if not stepped and summary.get("valid") not in (True, False) and summary.get("wall_clock_steps"):
            stepped = True
            done.append(ChaosAttempt(run_dir, seed, summary, "unknown across a wall-clock step"))
            continue
        missed = another_seed(summary, mutant)
        if missed is None or retried >= retries:
            done.append(ChaosAttempt(run_dir, seed, summary))
            return done
        done.append(ChaosAttempt(run_dir, seed, summary, missed))
        retried += 1
        seed = int(done[0].summary.get("seed") or 0) + retried  # the scenario's own seed, then the next


def stored_real_runs(folders: Sequence[Path]) -> dict[tuple[str, str], Path]:
    """Finished runs under ``folders`` (searched for ``summary.json``) that a real store passed, by
    (scenario, store): runs of the harness's own client on a store as shipped (no mutant, no
    fast failover), whose every verdict was valid. The newest wins. What ``--real-runs`` reuses."""
    found: dict[tuple[str, str], tuple[str, Path]] = {}
    for folder in folders:
        for summary_path in sorted(folder.rglob("summary.json")):
            run_dir = summary_path.parent
            try:
                summary = json.loads(summary_path.read_text())
                final = json.loads((run_dir / "final.json").read_text())
            except (OSError, ValueError):
                continue
            if not isinstance(summary, dict) or not isinstance(final, dict):
                continue
            if summary.get("valid") is not True or summary.get("mutant") or final.get("fast_failover"):
                continue
            if summary.get("client", "harness") != "harness" or summary.get("schedule_from") != "seed":
                continue
            key = (str(summary.get("scenario")), str(summary.get("store")))
            stamp = str(summary.get("analyzed_at", ""))
            if key not in found or stamp > found[key][0]:
                found[key] = (stamp, run_dir)
    return {key: run_dir for key, (_, run_dir) in found.items()}


def chaos_runner(seconds: float, real_runs: dict[tuple[str, str], Path] | None = None) -> ChaosRunner:
    """Run a chaos killer as a real ``wd-chaos run`` command (worker processes, faults) of
    ``seconds``, in a process of its own, so that runs may go side by side (``--jobs``). A real
    store's run found in ``real_runs`` (``stored_real_runs``) is judged from that run instead of
    run again."""

    def run_once(
        scenario: str, store: str, mutant: str | None, report_dir: Path, seed: int | None = None
    ) -> tuple[str, dict[str, Any]]:
        # a folder per run: the run's own folder is found by name when it is done
        out = report_dir / f"{scenario}-{mutant or store}"
        command = [sys.executable, "-m", "wd_chaos.cli", "run", scenario, "--store", store]
        shortest = find(scenario).shortest  # a scenario no shorter run can judge runs that long
        length = max(seconds, shortest or 0.0)
        command += ["--time-limit", f"{length:g}", "--report-dir", str(out)]
        command += ["--mutant", mutant] if mutant else []
        command += ["--seed", str(seed)] if seed is not None else []
        before = set(out.glob(f"*-{scenario}-*"))
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        ran = sorted(set(out.glob(f"*-{scenario}-*")) - before)
        if (not ran or not (ran[-1] / "summary.json").is_file()) and "ToxiproxyStuck" in done.stderr:
            # the fault injector failed, not the store: once more on another seed (as the gate does)
            again = (seed if seed is not None else find(scenario).seed) + 1
            command = [*command[: command.index("--seed")]] if seed is not None else command
            done = subprocess.run([*command, "--seed", str(again)], capture_output=True, text=True, check=False)
            ran = sorted(set(out.glob(f"*-{scenario}-*")) - before)
        if not ran or not (ran[-1] / "summary.json").is_file():
            raise RuntimeError(
                f"wd-chaos run {scenario} on {mutant or store} exited {done.returncode} without a "
                f"summary:\n{(done.stdout + done.stderr)[-2000:]}"
            )
        return str(ran[-1]), json.loads((ran[-1] / "summary.json").read_text())

    def run_one(scenario: str, store: str, mutant: str | None, report_dir: Path) -> dict[str, str]:
        from without_durability.testing.kit import find_kit

        if "workers" not in find_kit(store).provides:
            return {"__evidence__": f"store kit {store!r} cannot be opened by worker processes"}
        stored = (real_runs or {}).get((scenario, store)) if mutant is None else None
        if stored is not None:  # the real store already passed this scenario's run (--real-runs)
            summary = json.loads((stored / "summary.json").read_text())
            verdicts = {str(v["name"]): "valid" for v in summary["verdicts"]}
            verdicts["__evidence__"] = f"{stored}: all valid (a run of this scenario from --real-runs)"
            verdicts[RUN_DIR] = str(stored)
            return verdicts
        tried = attempts(lambda seed: run_once(scenario, store, mutant, report_dir, seed), mutant)
        run_dir, summary = tried[-1].run_dir, tried[-1].summary
        stepped = "".join(f"{a.run_dir} was {a.why_again}; again: " for a in tried[:-1])
        verdicts = {
            str(v["name"]): "valid" if v["valid"] is True else "invalid" if v["valid"] is False else "unknown"
            for v in summary["verdicts"]
        }
        failed = [f"{v['name']}: {v['summary']}" for v in summary["verdicts"] if v["valid"] is not True]
        verdicts["__evidence__"] = stepped + f"{run_dir}: " + ("; ".join(failed) or "all valid")
        verdicts[RUN_DIR] = run_dir
        verdicts[RUNS] = str(len(tried))
        return verdicts

    return run_one


def _table(report: GateReport) -> Table:
    table = Table(title="mutant gate")
    # a mutant's name is what a reader searches a CI log for: never wrapped, however narrow the output
    table.add_column("mutant", no_wrap=True, min_width=max((len(m.name) for m in report.mutants), default=6))
    for column in ("guarantee", "verdict", "by tests", "by wd-chaos", "by sim", "killed by", "time"):
        table.add_column(column, overflow="fold")
    for m in report.mutants:
        verdict = "[green]killed" if m.killed else "[red bold]SURVIVED"
        table.add_row(
            m.name,
            m.guarantee,
            verdict,
            "yes" if m.killed_by_tests else "no",
            "yes" if m.killed_by_chaos else "no",
            "yes" if m.killed_by_sim else "no",
            ", ".join(m.killed_by) or "-",
            f"{m.seconds:.1f}s",
        )
    return table


@click.command("mutants")
@click.option("--store", default=None, help="Only mutants of this store kit (see wd-chaos list).")
@click.option("--mutant", "names", multiple=True, help="Only this mutant (repeatable).")
@click.option("--report-dir", type=click.Path(path_type=Path), default=Path("reports"))
@click.option(
    "--catalogue",
    "modules",
    multiple=True,
    metavar="MODULE",
    help="Also the mutants in MODULE's MUTANTS list (your own store's; repeatable).",
)
@click.option(
    "--chaos/--no-chaos",
    default=True,
    help="Run killers that are wd-chaos scenarios too (real processes and servers). Simulation "
    "killers (sim:...) run either way: they take seconds and start no server.",
)
@click.option(
    "--chaos-seconds",
    type=Bounded(TimeLimit, click.FLOAT, "time_limit"),
    default=10.0,
    show_default=True,
    help="The workload phase of each chaos killer's run (0 < s <= 3600).",
)
@click.option(
    "--jobs",
    "-j",
    type=click.IntRange(1, 8),
    default=1,
    show_default=True,
    help="Chaos runs at a time (each a wd-chaos run with its own servers; a run mostly waits on its "
    "workload's fixed phases).",
)
@click.option(
    "--shrink-seconds",
    type=click.FloatRange(min=0, max=3600),
    default=0.0,
    show_default=True,
    help="Also shrink one chaos-killed mutant per store (wd-chaos shrink, one attempt per candidate) "
    "within this many seconds each, and replay the shrunk schedule: the gate fails unless it has "
    "fewer faults and fails again (0: no shrinking).",
)
@click.option(
    "--shrink-store",
    "shrink_stores",
    multiple=True,
    metavar="STORE",
    help="Shrink only on this store kit (a name or alias; repeatable; default: every store with a "
    "chaos-killed mutant).",
)
@click.option(
    "--real-runs",
    "real_runs",
    multiple=True,
    type=click.Path(path_type=Path, exists=True, file_okay=False),
    metavar="DIR",
    help="Folders of finished wd-chaos runs (a chaos gate's reports) to take the real stores' "
    "verdicts from: a scenario a real store passed there (valid, no mutant) is not run again for it "
    "(repeatable).",
)
def mutants_command(
    store: str | None,
    names: tuple[str, ...],
    report_dir: Path,
    modules: tuple[str, ...],
    chaos: bool,
    chaos_seconds: float,
    jobs: int,
    shrink_seconds: float,
    shrink_stores: tuple[str, ...],
    real_runs: tuple[Path, ...],
) -> None:
    """Run every mutant (a store with one guarantee removed) and its real store through the checks
    named for that guarantee. Exit 0 when every mutant is killed and every real store passes, else 1."""
    console = _table_console()  # piped (a CI log): wide enough that no name is split
    try:
        mutants: list[Mutant] = catalogue(modules)
        if store:
            kit = resolve(store)
            mutants = [m for m in mutants if m.store == kit]
        shrink_stores = tuple(resolve(one) for one in shrink_stores)
    except (CatalogueError, KitError) as exc:
        raise click.UsageError(str(exc)) from exc
    if names:
        unknown = sorted(set(names) - {m.name for m in mutants})
        if unknown:
            raise click.UsageError(
                f"no mutant named {unknown}; see the catalogue: {[m.name for m in catalogue(modules)]}"
            )
        mutants = [m for m in mutants if m.name in names]
    if not mutants:
        raise click.UsageError("no mutants selected")
    try:  # the killers these mutants name must be files here: the gate runs them from this folder
        check_killers(mutants, files_required=True)
    except CatalogueError as exc:
        raise click.UsageError(str(exc)) from exc
    probe_dir(report_dir, "--report-dir")
    if modules:
        os.environ["WD_MUTANT_MODULES"] = ",".join(modules)
    out = report_dir / f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-mutants"
    reused = stored_real_runs(real_runs) if real_runs else {}
    if reused:
        console.print(f"real stores' verdicts from {len(reused)} stored run(s) under --real-runs")
    runner: Any = chaos_runner(chaos_seconds, reused) if chaos else None
    if shrink_seconds and not chaos:
        raise click.UsageError("--shrink-seconds shrinks chaos runs: it needs --chaos")
    with console.status(f"running {len(mutants)} mutants and their real stores ..."):
        report = run_gate(
            mutants,
            out,
            chaos=runner,
            shrink_seconds=shrink_seconds,
            shrink_stores=shrink_stores,
            say=console.print,
            jobs=jobs,
        )
    console.print(_table(report))
    for c in report.shrinks:
        mark = "[green]shrink ok" if c.passed else "[red bold]SHRINK FAILED"
        console.print(f"{mark}: {c.mutant} ({c.scenario} on {c.store}): {c.evidence} ({c.seconds}s)")
    bad_real = [r for r in report.real if r.outcome != "passed"]
    for r in bad_real:
        console.print(f"[red]real store {r.store} failed {r.check}: {r.evidence[:300]}")
    for line in chaos_share(report):
        console.print(line, markup=False, highlight=False)
    survivors = [m.name for m in report.mutants if not m.killed]
    verdict = "[green]PASS" if report.passed else "[red bold]FAIL"
    console.print(
        f"{verdict}: {len(report.mutants) - len(survivors)}/{len(report.mutants)} killed"
        f" (by tests {report.killed_by_tests}, by wd-chaos {report.killed_by_chaos}, by sim {report.killed_by_sim})"
        f"{', survivors: ' + ', '.join(survivors) if survivors else ''}; "
        f"real stores {'pass' if not bad_real else 'FAIL'}"
        f"{f'; shrinks {sum(c.passed for c in report.shrinks)}/{len(report.shrinks)} pass' if report.shrinks else ''}"
        f"; {report.seconds}s ({', '.join(f'{k} {v}s' for k, v in report.timings.items())}); "
        f"report {out / 'mutants.html'}"
    )
    sys.exit(0 if report.passed else 1)
