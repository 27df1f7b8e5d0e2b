"""``wd-chaos mutants``: run the catalogue and fail unless every mutant is killed and every real store
passes the same checks."""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from without_durability.testing.kit import KitError, resolve

from ..options import Bounded, probe_dir
from ..scenario import TimeLimit
from . import CatalogueError, Mutant, catalogue, check_killers
from .runner import ChaosRunner, GateReport, run_gate


def chaos_runner(seconds: float) -> ChaosRunner:
    """Run a chaos killer as a real wd-chaos run (worker processes, faults) of ``seconds``."""

    def run_one(scenario: str, store: str, mutant: str | None, report_dir: Path) -> dict[str, str]:
        from wd_chaos.runner import Options, run
        from wd_chaos.scenario import find
        from without_durability.testing.kit import find_kit

        if "workers" not in find_kit(store).provides:
            return {"__evidence__": f"store kit {store!r} cannot be opened by worker processes"}
        options = Options(store=store, time_limit=seconds, report_dir=report_dir, mutant=mutant)
        outcome = run(find(scenario), options)
        stepped = ""
        if outcome.valid not in (True, False) and outcome.summary.get("wall_clock_steps"):
            # this machine's wall clock stepped under a store deciding by it: that run proves
            # nothing either way, so it is kept, named, and run once more
            stepped = f"{outcome.run_dir} was unknown across a wall-clock step; again: "
            outcome = run(find(scenario), options)
        verdicts = {
            v.name: "valid" if v.valid is True else "invalid" if v.valid is False else "unknown"
            for v in outcome.verdicts
        }
        failed = [f"{v.name}: {v.summary}" for v in outcome.verdicts if v.valid is not True]
        verdicts["__evidence__"] = stepped + f"{outcome.run_dir}: " + ("; ".join(failed) or "all valid")
        return verdicts

    return run_one


def _table(report: GateReport) -> Table:
    table = Table(title="mutant gate")
    for column in ("mutant", "guarantee", "verdict", "by tests", "by wd-chaos", "killed by", "time"):
        table.add_column(column, overflow="fold")
    for m in report.mutants:
        verdict = "[green]killed" if m.killed else "[red bold]SURVIVED"
        table.add_row(
            m.name,
            m.guarantee,
            verdict,
            "yes" if m.killed_by_tests else "no",
            "yes" if m.killed_by_chaos else "no",
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
@click.option("--chaos/--no-chaos", default=True, help="Run killers that are wd-chaos scenarios too.")
@click.option(
    "--chaos-seconds",
    type=Bounded(TimeLimit, click.FLOAT, "time_limit"),
    default=10.0,
    show_default=True,
    help="The workload phase of each chaos killer's run (0 < s <= 3600).",
)
def mutants_command(
    store: str | None,
    names: tuple[str, ...],
    report_dir: Path,
    modules: tuple[str, ...],
    chaos: bool,
    chaos_seconds: float,
) -> None:
    """Run every mutant (a store with one guarantee removed) and its real store through the checks
    named for that guarantee. Exit 0 when every mutant is killed and every real store passes, else 1."""
    console = Console()
    try:
        mutants: list[Mutant] = catalogue(modules)
        if store:
            kit = resolve(store)
            mutants = [m for m in mutants if m.store == kit]
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
    runner: Any = chaos_runner(chaos_seconds) if chaos else None
    with console.status(f"running {len(mutants)} mutants and their real stores ..."):
        report = run_gate(mutants, out, chaos=runner)
    console.print(_table(report))
    bad_real = [r for r in report.real if r.outcome != "passed"]
    for r in bad_real:
        console.print(f"[red]real store {r.store} failed {r.check}: {r.evidence[:300]}")
    survivors = [m.name for m in report.mutants if not m.killed]
    verdict = "[green]PASS" if report.passed else "[red bold]FAIL"
    console.print(
        f"{verdict}: {len(report.mutants) - len(survivors)}/{len(report.mutants)} killed"
        f" (by tests {report.killed_by_tests}, by wd-chaos {report.killed_by_chaos})"
        f"{', survivors: ' + ', '.join(survivors) if survivors else ''}; "
        f"real stores {'pass' if not bad_real else 'FAIL'}; {report.seconds}s; report {out / 'mutants.html'}"
    )
    sys.exit(0 if report.passed else 1)
