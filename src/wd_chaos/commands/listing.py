"""``wd-chaos list`` and ``wd-chaos show``: what scenarios and stores there are."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.markup import escape
from rich.table import Column, Table

from ..scenario import (
    ScenarioError,
    load_file,
)
from .common import (
    _available,
    _scenario_dirs,
    _table_console,
)


@click.command("list")
@_scenario_dirs
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="One JSON object per line instead of the tables: each store kit (type 'store': name, aliases, "
    "provides, available, reason, description), then each scenario (type 'scenario': name, needs, "
    "stores, description, error, install: what to install for a store it names whose kit is missing).",
)
def list_(scenario_dirs: tuple[Path, ...], as_json: bool) -> None:
    """The installed store kits (what each provides) and the scenarios (built in, and those in
    --scenario-dir) with the stores each runs on."""
    from without_durability.testing.kit import broken_kits, kits

    from ..control.kits import missing_kits, stores_for

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
                "description": sc.description, "error": None, "install": missing_kits(sc),
            })  # fmt: skip
        except ScenarioError as exc:
            scenario_rows.append({
                "type": "scenario", "name": name, "needs": [], "stores": [], "description": "",
                "error": _relative(str(exc)), "install": {},
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
            ", ".join(r["provides"])
            or ("[red]failed to load" if not r["description"] else "conformance suite only"),
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
        if r["error"] is None and r["install"] and not r["stores"]:
            wanted = "; ".join(f"{store}: {how}" for store, how in r["install"].items())
            table.add_row(r["name"], ", ".join(r["needs"]), "[yellow]needs " + escape(wanted), escape(r["description"]))
        elif r["error"] is None:
            table.add_row(r["name"], ", ".join(r["needs"]), ", ".join(r["stores"]), escape(r["description"]))
        else:
            table.add_row(r["name"], "", "[red]invalid", escape(r["error"]))
    _table_console().print(table)


def _relative(message: str) -> str:
    """A scenario error with the built-in folder's machine path shortened to the package's."""
    from ..scenario import BUILT_IN

    return message.replace(str(BUILT_IN), "wd_chaos/scenarios")


@click.command("show")
@click.argument("name")
def show_cmd(name: str) -> None:
    """Print built-in scenario NAME as TOML, comments included, to start a scenario of your own
    from: save it as MY.toml, set its name to MY (a file's name must be its name), edit, then
    wd-chaos run MY.toml. A closing comment names the core checkers, which every scenario runs. An
    unknown NAME exits 64 naming the built-in ones."""
    from ..scenario import BUILT_IN, close_to

    built_in = {p.name.removesuffix(".toml"): p for p in BUILT_IN.iterdir() if p.name.endswith(".toml")}
    if name not in built_in:
        raise click.UsageError(
            f"no built-in scenario {name!r}{close_to(name, sorted(built_in))} (built in: {', '.join(sorted(built_in))})"
        )
    # the file as shipped, not a re-dump of the model: its comments say why each value is what it is
    click.echo(built_in[name].read_text(encoding="utf-8"), nl=False)
    from ..checks import CORE

    # the core checkers run whatever the file's checks say: a comment, so the output stays the file
    click.echo(
        "\n# core checkers: every scenario runs them, whatever `checks` says (a file may add checkers, "
        f"never drop one of these): {', '.join(CORE)}"
    )
