"""``wd-chaos mutate``: generated mutants of a store's statements and scripts, run through its tests."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path

import click

from ..options import probe_dir
from .runner import EQUIVALENT_FILE, PLANS, StorePlan, mutate
from .targets import mutants


@click.command("mutate")
@click.option(
    "--store", required=True, help="sqlite, postgres, redis, or your own store's name (with --statements)."
)
@click.option(
    "--budget-minutes",
    type=click.FloatRange(min=0.5, max=24 * 60),
    default=60.0,
    show_default=True,
    help="Stop starting mutants after this long; the rest are reported as not run.",
)
@click.option("--report-dir", type=click.Path(path_type=Path), default=Path("reports"), show_default=True)
@click.option(
    "--mutant", "only", multiple=True, help="Only the mutant with this id, or ids starting so (repeatable)."
)
@click.option("--chaos-seconds", type=click.FloatRange(min=1, max=600), default=8.0, show_default=True,
              help="The workload phase of each survivor's wd-chaos run.")  # fmt: skip
@click.option("--list", "list_only", is_flag=True, help="Print the mutants' ids and changes; run nothing.")
@click.option("--statements", multiple=True, metavar="MODULE",
              help="Your store: a module or package whose statement constants to mutate (repeatable).")  # fmt: skip
@click.option(
    "--tests", multiple=True, metavar="PATH", help="Your store: the test files to run (repeatable)."
)
@click.option("--wd-store", "wd_stores", multiple=True, metavar="NAME",
              help="Your store: its conformance-registry name(s), passed to pytest as --wd-store.")  # fmt: skip
@click.option(
    "--pytest-arg",
    "pytest_args",
    multiple=True,
    help="Your store: an extra pytest argument (e.g. -p plugin).",
)
@click.option(
    "--equivalent",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    default=EQUIVALENT_FILE,
    help='TOML file of equivalent mutants ([equivalent] "id" = "why").',
)
@click.option(
    "--resume",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    default=None,
    help="An earlier mutate.json: keep its kills, run only the mutants it did not kill.",
)
def mutate_command(
    store: str,
    budget_minutes: float,
    report_dir: Path,
    only: tuple[str, ...],
    chaos_seconds: float,
    list_only: bool,
    statements: tuple[str, ...],
    tests: tuple[str, ...],
    wd_stores: tuple[str, ...],
    pytest_args: tuple[str, ...],
    equivalent: Path,
    resume: Path | None,
) -> None:
    """Derive mutants from STORE's own statements (SQL constants) or scripts (Lua), run each through
    the store's conformance suite and its own tests (fail fast), then survivors through short wd-chaos
    runs, and write mutate.json and mutate.html. Exit 0 when every mutant run is killed or listed as
    equivalent and none was left unrun, else 1."""
    plan = _plan(store, statements, tests, wd_stores, pytest_args)
    if list_only:
        from .runner import targets_of
        from .targets import describe

        targets = targets_of(plan)
        texts = {t.name: t.text for t in targets}
        for spec in mutants(plan.name, targets):
            change = describe(spec, texts[spec.target])
            click.echo(f"{spec.id}\t{change['before']}  =>  {change['after']}")
        return
    missing = [t for t in plan.tests if not Path(t.partition("::")[0]).exists()]
    if missing:
        raise click.BadParameter(
            f"no such test file {missing}; run from the project folder", param_hint="--tests"
        )
    probe_dir(report_dir, "--report-dir")
    out = report_dir / f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-mutate-{plan.name}"
    report = mutate(
        plan,
        budget_seconds=budget_minutes * 60,
        report_dir=out,
        chaos_seconds=chaos_seconds,
        only=only,
        progress=lambda line: click.echo(line, err=True),
        equivalent_file=equivalent,
        resume=resume,
    )
    click.echo(
        f"{plan.name}: generated {report['generated']}, killed {report['killed']}, equivalent "
        f"{len(report['equivalent'])}, survived {len(report['survived'])}, not run {len(report['not_run'])}, "
        f"errors {len(report['errors'])}; killed or equivalent {report['killed_or_equivalent']}; "
        f"report {out / 'mutate.html'}"
    )
    for row in report["survived"]:
        click.echo(f"  survived {row['mutant']}: {row['before']}  =>  {row['after']}")
    ok = not report["survived"] and not report["not_run"] and not report["errors"]
    sys.exit(0 if ok else 1)


def _plan(
    store: str,
    statements: tuple[str, ...],
    tests: tuple[str, ...],
    wd_stores: tuple[str, ...],
    pytest_args: tuple[str, ...],
) -> StorePlan:
    if store in PLANS and not statements:
        plan = PLANS[store]
        if tests:
            plan = StorePlan(**{**plan.__dict__, "tests": tests})
        return plan
    if not statements or not tests or not wd_stores:
        raise click.UsageError(
            f"--store {store!r} is not built in ({', '.join(PLANS)}); for your own store give --statements "
            "MODULE, --tests PATH and --wd-store NAME (and --pytest-arg=-p --pytest-arg=YOUR_PLUGIN if your "
            "store registers itself through a pytest plugin)"
        )
    return StorePlan(store, statements=statements, wd_stores=wd_stores, tests=tests, pytest_args=pytest_args)
