"""``wd-chaos workflow MODULE:FUNCTION``: crash a workflow author's own body at every step, say how
often each effect can run, and refuse a body that does not replay deterministically; with
``--replay-against OLD_MODULE:OLD_FUNCTION``, resume every in-flight run of the old version on the
new one. The work is ``without_durability.testing.workflow``; this module loads the body, prints
the table and picks the exit code (0 valid, 1 a problem found, 64 a usage error, 255 the kit failed).
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from without_durability.testing.workflow import (
    Body,
    KitUnusable,
    MissingInput,
    WorkflowReport,
    check_upgrade,
    check_workflow,
)

EXAMPLES = """\b
Examples:
  wd-chaos workflow examples/workflows/checkout.py:checkout --store sqlite --input '{"order": {"sku": "piano", "amount": 4200}}'
  wd-chaos workflow shop.flows:checkout --store sqlite --json
  wd-chaos workflow examples/workflows/checkout_v2.py:checkout --store sqlite --replay-against examples/workflows/checkout.py:checkout --input '{"order": {"sku": "piano", "amount": 4200}}'    (exits 1: v2 renames a step)
"""


def _import(module: str, option: str) -> Any:
    """The module a ``MODULE`` names: a ``.py`` file (its folder goes on ``sys.path``, so it can
    import its neighbours) or a dotted name importable from the current folder."""
    if module.endswith(".py") or "/" in module:
        path = Path(module)
        if not path.is_file():
            raise click.UsageError(
                f"{option}: no file {module!r} (give a path to a .py file or a dotted module name)"
            )
        folder = str(path.resolve().parent)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        name = f"_wd_workflow_{path.stem}_{abs(hash(str(path.resolve())))}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise click.UsageError(f"{option}: {module!r} cannot be loaded as a Python module")
        loaded = importlib.util.module_from_spec(spec)
        sys.modules[name] = loaded
        try:
            spec.loader.exec_module(loaded)
        except Exception as exc:
            raise click.UsageError(
                f"{option}: importing {module!r} raised {type(exc).__name__}: {exc}"
            ) from exc
        return loaded
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise click.UsageError(
            f"{option}: cannot import module {module!r} ({exc}); run from the folder that holds it, "
            "install its package, or give the path to its file (path/to/flows.py:FUNCTION)"
        ) from exc
    except Exception as exc:
        raise click.UsageError(f"{option}: importing {module!r} raised {type(exc).__name__}: {exc}") from exc


def load_body(target: str, option: str = "MODULE:FUNCTION") -> Body:
    """The workflow body ``target`` (``module:function`` or ``path/file.py:function``) names; a
    ``click.UsageError`` saying what to do when it cannot be had or is not an async function."""
    module, sep, name = target.rpartition(":")
    if not sep or not module or not name:
        raise click.UsageError(
            f"{option}: expected MODULE:FUNCTION (e.g. shop.flows:checkout or flows.py:checkout), got {target!r}"
        )
    loaded = _import(module, option)
    body = getattr(loaded, name, None)
    if body is None:
        found = sorted(
            n for n, v in vars(loaded).items() if inspect.iscoroutinefunction(v) and not n.startswith("_")
        )
        hint = f"; its async functions: {', '.join(found)}" if found else "; it defines no async function"
        raise click.UsageError(f"{option}: module {module!r} has no {name!r}{hint}")
    if not inspect.iscoroutinefunction(body):
        raise click.UsageError(
            f"{option}: {target!r} is a {type(body).__name__}, not an async function: a workflow body is "
            "'async def body(run: Run) -> object' (if a function builds your body, bind the body to a "
            "module-level name and give that name)"
        )
    return body  # type: ignore[no-any-return]


def _inputs(text: str | None) -> dict[str, object]:
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.UsageError(
            f"--input: not JSON ({exc}): give an object of awaited keys, e.g. '{{\"order\": {{}}}}'"
        ) from exc
    if not isinstance(value, dict):
        raise click.UsageError(
            f"--input: expected a JSON object of the keys the body awaits and their values, got {type(value).__name__}"
        )
    return value


def _print(
    console: Console,
    target: str,
    store: str,
    report: WorkflowReport,
    replay: WorkflowReport | None,
    old: str | None,
) -> None:
    table = Table(
        title=f"{target} on {store}: {report.runs} runs, crashed at every step", title_justify="left"
    )
    for column in ("#", "key", "kind", "its effect runs"):
        table.add_column(column)
    for i, step in enumerate(report.steps, 1):
        table.add_row(str(i), step.key, step.kind, step.effect)
    console.print(table)
    console.print(f"result without faults: {report.result!r}")
    for problem in report.problems:
        console.print(f"[bold red]NO[/] {problem.kind} at {problem.key!r}: {problem.message}", soft_wrap=True)
    if replay is not None:
        console.print(f"replayed {replay.replayed} in-flight runs of {old} on this version")
        for note in replay.notes:
            console.print(f"note: {note}", soft_wrap=True)
        for problem in replay.problems:
            console.print(
                f"[bold red]NO[/] {problem.kind} at {problem.key!r}: {problem.message}", soft_wrap=True
            )
    valid = report.valid and (replay is None or replay.valid)
    console.print("[bold green]VALID[/]" if valid else "[bold red]INVALID[/]")


class _SimulatedStore(click.ParamType[str]):
    """``--store``: a choice among the installed kits that provide ``simulated``. Their stores run
    on clocks they are handed, the kind the workflow kit moves across a sleep (a server's clock
    cannot be). Read when the option is parsed or shown, not at import: loading kits costs time."""

    name = "store"

    def _choice(self) -> click.Choice[str]:
        return click.Choice(_simulated_kits())

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str | None:
        return self._choice().get_metavar(param, ctx)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        return self._choice().convert(value, param, ctx)

    def shell_complete(self, ctx: click.Context, param: click.Parameter, incomplete: str) -> Any:
        return self._choice().shell_complete(ctx, param, incomplete)


def _simulated_kits() -> list[str]:
    """The installed kits that provide ``simulated``, by name (read here, not through ``sim``:
    this command stands on no other part of the harness)."""
    from without_durability.testing.kit import kits

    return sorted(name for name, kit in kits().items() if "simulated" in kit.provides)


def _default_store() -> str:
    """The first installed kit by name that provides ``simulated`` (as ``wd-chaos sim``'s default)."""
    found = _simulated_kits()
    if not found:
        raise click.UsageError("no installed store kit provides 'simulated': name one with --store")
    return found[0]


class _ShownDefault(click.Option):
    """An option whose default is a function, shown in ``--help`` by its value (Click would
    show "(dynamic)")."""

    def get_default(self, ctx: click.Context, call: bool = True) -> Any:
        return super().get_default(ctx, call=True)


@click.command("workflow", epilog=EXAMPLES)
@click.argument("target", metavar="MODULE:FUNCTION")
@click.option(
    "--store",
    cls=_ShownDefault,
    type=_SimulatedStore(),
    default=_default_store,
    show_default=True,
    help="The store the body runs on (its transact effects must be in that store's language).",
)
@click.option(
    "--input",
    "input_",
    metavar="JSON",
    help="A JSON object of the keys the body awaits (run.awaiting) and their values.",
)
@click.option(
    "--replay-against",
    "old",
    metavar="OLD_MODULE:OLD_FUNCTION",
    help="Also stop the old version at each of its step boundaries and resume it on this one.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
def workflow_command(target: str, store: str, input_: str | None, old: str | None, as_json: bool) -> None:
    """Crash a workflow body at every step boundary and inside every step, resume it, and report how
    often each effect can run. Exit 0 valid; 1 the body is nondeterministic, a resumed run failed,
    or (with --replay-against) an in-flight run of the old version cannot finish on this one; 64 a
    usage error; 255 the kit failed."""
    body = load_body(target)
    old_body = load_body(old, "--replay-against") if old else None
    inputs = _inputs(input_)

    async def go() -> tuple[WorkflowReport, WorkflowReport | None]:
        report = await check_workflow(body, store=store, inputs=inputs)
        replay = await check_upgrade(body, old_body, store=store, inputs=inputs) if old_body else None
        return report, replay

    try:
        report, replay = asyncio.run(go())
    except (MissingInput, KitUnusable) as exc:
        raise click.UsageError(str(exc)) from exc
    valid = report.valid and (replay is None or replay.valid)
    if as_json:
        data = {
            "workflow": target,
            "store": store,
            "valid": valid,
            "check": report.as_dict(),
            "replay": None if replay is None else {"against": old, **replay.as_dict()},
        }
        click.echo(json.dumps(data, default=repr))
    else:
        _print(Console(soft_wrap=True), target, store, report, replay, old)
    sys.exit(0 if valid else 1)
