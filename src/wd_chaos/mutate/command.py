"""``wd-chaos mutate``: generated mutants of a store's statements and scripts, run through its tests."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import click

from ..options import probe_dir
from .runner import StorePlan, mutate, plan_equivalents, plan_for, runtime_plan, servers
from .targets import mutants


@click.command("mutate")
@click.option(
    "--store",
    default=None,
    help="A store kit's name (sqlite, postgres, redis, yours): its kit's mutate_plan says what to "
    "mutate and run; or your own store's name with --statements, --tests and --wd-store. "
    "Required, unless --runtime.",
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
@click.option("--jobs", type=click.IntRange(min=1, max=16), default=1, show_default=True,
              help="Test processes per pytest session (pytest-xdist).")  # fmt: skip
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
    default=None,
    help='TOML file of equivalent mutants ([equivalent] "id" = "why"); default: the list the '
    "store's kit ships (its MutatePlan's equivalents).",
)
@click.option(
    "--resume",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    default=None,
    help="An earlier mutate.json (of the same half: statements, or --python): keep its kills, run "
    "only the mutants it did not kill, so a long job can run in pieces.",
)
@click.option(
    "--python",
    "python",
    is_flag=True,
    help="Mutate the store's Python decision code (its MutatePlan's python files) with cosmic-ray, "
    "in a copy of the project, instead of its statements.",
)
@click.option(
    "--runtime",
    is_flag=True,
    help="Mutate the library's runtime (Worker, Run, RetryPolicy and the lifecycle, the dag) with "
    "cosmic-ray, as --python does a store's decision code, through the runtime's own tests; "
    "takes no --store.",
)
def mutate_command(
    store: str | None,
    budget_minutes: float,
    report_dir: Path,
    only: tuple[str, ...],
    chaos_seconds: float,
    jobs: int,
    list_only: bool,
    statements: tuple[str, ...],
    tests: tuple[str, ...],
    wd_stores: tuple[str, ...],
    pytest_args: tuple[str, ...],
    equivalent: Path | None,
    resume: Path | None,
    python: bool,
    runtime: bool,
) -> None:
    """Derive mutants from STORE's own statements (SQL constants) or scripts (Lua), run each through
    the store's conformance suite and its own tests (fail fast), then survivors through short wd-chaos
    runs, and write mutate.json and mutate.html. Exit 0 when every mutant run is killed or listed as
    equivalent and none was left unrun, else 1."""
    if runtime:
        if store is not None or statements or wd_stores:
            raise click.UsageError(
                "--runtime mutates the library's own runtime, not a store: drop --store, "
                "--statements and --wd-store"
            )
        plan = replace(runtime_plan(), tests=tests) if tests else runtime_plan()
        _python(plan, budget_minutes, report_dir, equivalent, resume)
        return
    if store is None:
        raise click.UsageError("Missing option '--store' (a store kit's name), or give --runtime")
    plan = _plan(store, statements, tests, wd_stores, pytest_args)
    if python:
        _python(plan, budget_minutes, report_dir, equivalent, resume)
        return
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
        jobs=jobs,
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


def _python(
    plan: StorePlan, budget_minutes: float, report_dir: Path, equivalent: Path | None, resume: Path | None
) -> None:
    """The Python half: cosmic-ray's mutants of the plan's files, through its tests, into the job's
    mutate.json (under "python") and mutate.html; exit 0 only when every mutant run was killed or
    listed as equivalent and none was left unrun."""
    from .python import PythonMutateError, html_page, mutate_python

    probe_dir(report_dir, "--report-dir")
    out = report_dir / f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-mutate-{plan.name}-python"
    try:
        with servers(plan):  # one server for the job, named in the environment every session inherits
            found = mutate_python(
                plan.python,
                plan.tests,
                plan.wd_stores,
                plan.pytest_args,
                budget_seconds=budget_minutes * 60,
                store=plan.name,
                equivalent_file=equivalent or plan_equivalents(plan),
                resume=resume,
                progress=lambda line: click.echo(line, err=True),
            )
    except PythonMutateError as exc:
        raise click.UsageError(str(exc)) from None
    out.mkdir(parents=True, exist_ok=True)
    (out / "mutate.json").write_text(json.dumps({"store": plan.name, "python": found}, indent=2) + "\n")
    (out / "mutate.html").write_text(html_page(plan.name, found))
    skipped = ", ".join(f"{n} {why}" for why, n in sorted(found["skipped"].items())) or "0"
    click.echo(
        f"{plan.name} python: generated {found['generated']}, skipped ({skipped}), killed {found['killed']}, "
        f"equivalent {len(found['equivalent'])}, survived {len(found['survived'])}, not run "
        f"{len(found['not_run'])}, errors {len(found['errors'])}; killed or equivalent "
        f"{found['killed_or_equivalent']}; report {out / 'mutate.html'}"
    )
    for row in found["survived"]:
        click.echo(
            f"  survived {row['mutant']} ({row['module']}:{row['line']}): {row['before']}  =>  {row['after']}"
        )
    sys.exit(0 if not found["survived"] and not found["not_run"] and not found["errors"] else 1)


def _plan(
    store: str,
    statements: tuple[str, ...],
    tests: tuple[str, ...],
    wd_stores: tuple[str, ...],
    pytest_args: tuple[str, ...],
) -> StorePlan:
    """The plan ``store``'s kit declares, with any flag given replacing its part; without a kit
    plan, the flags alone (all three of --statements, --tests, --wd-store)."""
    from without_durability.testing.kit import KitError

    try:
        plan = plan_for(store)
    except KitError as exc:
        if not statements or not tests or not wd_stores:
            raise click.UsageError(
                f"{exc}. Declare a MutatePlan as your kit's mutate_plan (see the docs: The mutant "
                "gate, Generated mutants), or give --statements MODULE, --tests PATH and --wd-store NAME (and "
                "--pytest-arg=-p --pytest-arg=YOUR_PLUGIN if your store registers itself through a "
                "pytest plugin)"
            ) from None
        return StorePlan(
            store, statements=statements, wd_stores=wd_stores, tests=tests, pytest_args=pytest_args
        )
    changed: dict[str, object] = {}
    if statements:
        changed.update(statements=statements, scripts=None)
    if tests:
        changed["tests"] = tests
    if wd_stores:
        changed["wd_stores"] = wd_stores
    if pytest_args:
        changed["pytest_args"] = (*plan.pytest_args, *pytest_args)
    return replace(plan, **changed) if changed else plan  # type: ignore[arg-type]
