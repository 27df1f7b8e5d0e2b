"""MkDocs hook: the pages that must not drift are rendered from the code and the committed
baselines when the site is built.

A page asks for a generated part with a marker line ``<!-- wd:NAME -->``; ``GENERATORS`` maps each
NAME to a function returning Markdown. An unknown NAME fails the build, so a typo cannot leave a
hole in a page. ``tests/test_docs.py`` imports this module to check what the pages say.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import itertools
import json
import re
import textwrap
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

ROOT = Path(__file__).resolve().parents[2]
BASELINE = ROOT / "reports" / "baseline"
MARKER = re.compile(r"^<!-- wd:([a-z-]+) -->$", re.MULTILINE)


# ---- the scenario file format, from the pydantic models that validate it ----


def _attribute_docs(model: type) -> dict[str, str]:
    """The docstring under each field of ``model`` and its bases (pydantic does not keep them
    unless a model asks it to)."""
    out: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if cls is BaseModel or not issubclass(cls, BaseModel) or cls.__module__.startswith("pydantic"):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for here, after in itertools.pairwise(body):
            if (
                isinstance(here, ast.AnnAssign)
                and isinstance(here.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                out[here.target.id] = " ".join(after.value.value.split())
    return out


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is typing.Annotated:
        return _type_name(get_args(tp)[0])
    if origin is Literal:
        return " \\| ".join(f'`"{a}"`' if isinstance(a, str) else f"`{a}`" for a in get_args(tp))
    if origin in (Union, types.UnionType):
        parts = [a for a in get_args(tp) if a is not type(None)]
        if all(isinstance(a, type) and issubclass(a, BaseModel) for a in parts) and len(parts) > 1:
            return "a fault table (by `kind`)"
        return " \\| ".join(_type_name(a) for a in parts)
    if origin is list:
        (inner,) = get_args(tp) or (Any,)
        return f"list of {_type_name(inner)}"
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return f"table `[{tp.__name__.lower()}]`"
    names = {float: "number", int: "integer", str: "string", bool: "boolean"}
    return names.get(tp, getattr(tp, "__name__", str(tp)))


def _bounds(field: FieldInfo) -> str:
    parts: list[str] = []
    metadata = list(field.metadata)
    # a bounded alias (``Seconds``, ``WorkerCount``) keeps its bounds inside its Annotated
    if get_origin(field.annotation) is typing.Annotated:
        metadata += list(get_args(field.annotation)[1:])
    for m in metadata:
        for attr, sign in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
            value = getattr(m, attr, None)
            if value is not None:
                parts.append(f"{sign} {value}")
        if getattr(m, "min_length", None):
            parts.append(f"at least {m.min_length} item(s)")
        if getattr(m, "pattern", None):
            parts.append(f"matches `{m.pattern}`")
        if isinstance(m, FieldInfo):
            parts.extend(_bounds(m).split("; ") if _bounds(m) else [])
        validator = getattr(m, "func", None)
        if validator is not None:
            parts.append(_VALIDATED.get(validator.__name__, "checked when read"))
    return "; ".join(dict.fromkeys(parts))


_VALIDATED = {
    "_known_check": "a checker's name (see [checkers](faults-and-checkers.md#checkers))",
    "_known_bite": "a bite check's name (see [bite checks](faults-and-checkers.md#bite-checks))",
    "_known_window": "a coverage window's name (see [windows](faults-and-checkers.md#coverage-windows))",
}


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "**required**"
    factory = field.default_factory
    value = factory() if factory is not None else field.default  # type: ignore[call-arg]
    if isinstance(value, BaseModel):
        return "see its table"
    if value is None:
        return "unset"
    return f"`{json.dumps(value)}`"


def _list_item_model(field: FieldInfo) -> type[BaseModel] | None:
    tp = field.annotation
    if get_origin(tp) in (Union, types.UnionType):
        tp = next(a for a in get_args(tp) if a is not type(None))
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def _own_description(field: FieldInfo) -> str:
    # a bounded alias's description only restates its bounds, which have their own column
    text = field.description or ""
    return "" if text.startswith("a number of seconds") else text


def model_rows(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, str, str, str, str]]:
    """(key, type, default, bounds, meaning) for each field of ``model``."""
    docs = _attribute_docs(model)
    for name, field in model.model_fields.items():
        yield (
            prefix + name,
            _type_name(field.annotation),
            _default(field),
            _bounds(field),
            docs.get(name) or _own_description(field),
        )


def _table(rows: list[tuple[str, ...]], head: tuple[str, ...]) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ") if "\\|" not in text else text.replace("\n", " ")

    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _field_table(model: type[BaseModel], prefix: str = "", skip: tuple[str, ...] = ()) -> str:
    rows = [(f"`{k}`", t, d, b, m) for k, t, d, b, m in model_rows(model, prefix) if k not in skip]
    return _table(rows, ("key", "type", "default", "bounds", "meaning"))


def scenario_sections() -> list[tuple[str, type[BaseModel]]]:
    """Every table a scenario file may hold: the top level, then each section's model."""
    from wd_chaos.scenario import Lease, Lifecycle, Scenario, Storm, Workload

    return [("", Scenario), ("lease", Lease), ("workload", Workload), ("lifecycle", Lifecycle), ("storm", Storm)]


def scenario_keys() -> set[str]:
    """Every key a scenario file may hold, by its dotted path (``lease.alive``,
    ``faults.stall.margin``): what ``tests/test_docs.py`` requires the reference to name."""
    from wd_chaos.faults import kinds

    keys: set[str] = set()
    for section, model in scenario_sections():
        keys |= {f"{section}.{k}" if section else k for k in model.model_fields}
    for name, kind in kinds().items():
        keys |= {f"faults.{name}.{k}" for k in kind.spec.model_fields}
    return keys


def scenario_format() -> str:
    """The scenario file format: every key, its type, default, bounds and meaning."""
    from wd_chaos.faults import FaultSpec, kinds
    from wd_chaos.scenario import Scenario

    out = [
        "A scenario file is TOML named `NAME.toml`, and its `name` key must equal `NAME`. "
        "Unknown keys are refused, naming the file and the key.",
        "",
        "### Top level",
        "",
        _field_table(Scenario),
    ]
    for section, model in scenario_sections()[1:]:
        doc = " ".join((model.__doc__ or "").split())
        out += ["", f"### `[{section}]`", "", doc, "", _field_table(model, f"{section}.")]
    common = set(FaultSpec.model_fields)
    out += [
        "",
        "### `[[faults]]`",
        "",
        "Each entry is one kind's table, chosen by its `kind`. Every kind takes these timing keys:",
        "",
        _field_table(FaultSpec, "", skip=("kind",)),
    ]
    for name, kind in kinds().items():
        doc = " ".join((kind.spec.__doc__ or "").split())
        own = [n for n in kind.spec.model_fields if n not in common]
        out += ["", f'#### `kind = "{name}"`', "", doc, ""]
        if own:
            rows = [
                (f"`{k}`", t, d, b, m)
                for k, t, d, b, m in model_rows(kind.spec, "")
                if k in own
            ]
            out.append(_table(rows, ("key", "type", "default", "bounds", "meaning")))
        else:
            out.append("No keys besides the timing keys.")
    del Scenario
    return "\n".join(out)


# ---- registries: fault kinds, checkers, bite checks, coverage windows ----


def _doc(obj: object) -> str:
    text = inspect.getdoc(obj) or ""
    return " ".join(text.split()) or "(no docstring)"


def faults_and_checkers() -> str:
    """Every fault kind, checker, bite check and coverage window, each with its docstring."""
    from wd_chaos.checks.coverage import windows
    from wd_chaos.checks.registry import CORE, bites, checkers
    from wd_chaos.faults import kinds

    out = ["## Fault kinds", ""]
    for name, kind in kinds().items():
        module = kind.spec.__module__
        out += [f"### `{name}`", "", _doc(kind.spec), "", f'??? info "`{module}`"', ""]
        out += ["    " + _doc(importlib.import_module(module)), ""]
    out += ["## Checkers", "", "What a scenario's `checks` may list. The **core** checkers run in every scenario,", ""]
    out[-2] += " whatever its `checks` says (a scenario may add checkers, never drop a core one)."
    rows = [(f"`{n}`" + (" (core)" if n in CORE else ""), _doc(c)) for n, c in sorted(checkers().items())]
    out += [_table(rows, ("checker", "what it judges"))]
    out += ["", "## Bite checks", "", "What a scenario's `bite` may be.", ""]
    out += [_table([(f"`{n}`", _doc(c)) for n, c in sorted(bites().items())], ("bite", "what it asks"))]
    out += ["", "## Coverage windows", "", "What a scenario's `coverage` may list.", ""]
    out += [_table([(f"`{n}`", " ".join(str(d).split())) for n, d in windows().items()], ("window", "meaning"))]
    return "\n".join(out)


def scenario_list() -> str:
    """The built-in scenarios with their descriptions, from their files."""
    from wd_chaos.scenario import BUILT_IN, load_file

    rows = []
    for path in sorted(BUILT_IN.iterdir(), key=lambda p: p.name):
        if path.name.endswith(".toml"):
            sc = load_file(path)
            faults = ", ".join(dict.fromkeys(str(f.kind) for f in sc.faults)) or (
                f"storm: {sc.storm.kind}" if sc.storm else "none"
            )
            rows.append((f"`{sc.name}`", faults, f"`{sc.bite}`", sc.description))
    return _table(rows, ("scenario", "faults", "bite", "description"))


# ---- results from the committed baselines ----


def _load(name: str) -> Any:
    return json.loads((BASELINE / name).read_text())


def _num(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.2f}" if abs(value) < 100 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _machine(data: dict[str, Any]) -> str:
    m = data.get("machine", {})
    load = ", ".join(f"{x:.1f}" for x in m.get("loadavg", []))
    return f"Measured {m.get('when', '?')} on {m.get('cpus', '?')} CPUs (load average {load}), Python {m.get('python', '?')}."


def benchmarks() -> str:
    """The benchmark baseline's tables."""
    out = ["## Headline figures", "", "From `reports/baseline/headline.json`.", ""]
    head = _load("headline.json")
    out.append(
        _table(
            [(r["figure"], _num(r["value"]), r.get("target", ""), r.get("met", ""), r.get("context", "")) for r in head],
            ("figure", "value", "target", "met", "context"),
        )
    )
    take = _load("take.json")
    out += ["", "## Take throughput", "", _machine(take), ""]
    keys = [k for k in take["ratios"][0] if k != "workers"]
    out.append(
        _table(
            [(str(r["workers"]), *(_num(r.get(k, "")) for k in keys)) for r in take["ratios"]],
            ("workers", *keys),
        )
    )
    workers = sorted({r["workers"] for r in take["rows"]})
    rates = {(r["system"], r["workers"]): r["rate"] for r in take["rows"]}
    systems = list(dict.fromkeys(r["system"] for r in take["rows"]))
    out += ["", "Deliveries per second by system and worker count:", ""]
    out.append(
        _table(
            [(s, *(_num(rates.get((s, w), "-")) for w in workers)) for s in systems],
            ("system", *(f"{w} workers" for w in workers)),
        )
    )
    out += ["", "![take throughput by workers](take.svg)"]
    append = _load("append.json")
    out += ["", "## Append throughput", "", _machine(append), ""]
    rows = [
        (r["store"], _num(r["targets"]), _num(r["rate"]), _num(r["lost"]), _num(r.get("duplicated_keys", "-")))
        for r in append["rows"]
        if "round" not in r  # the per-round rows are behind each median row
    ]
    out.append(_table(rows, ("system", "workflows", "appends/s", "lost", "duplicated keys")))
    pickup = _load("pickup.json")
    out += ["", "## Pickup latency against poll interval", "", _machine(pickup), ""]
    rows = [
        (
            r["store"],
            "yes" if r["wakeup"] else "no",
            _num(r["poll_ms"]),
            _num(r["p50_ms"]),
            _num(r["p99_ms"]),
            _num(r["lost"]),
        )
        for r in pickup["rows"]
    ]
    out.append(_table(rows, ("store", "wakeup", "poll ms", "p50 ms", "p99 ms", "lost")))
    out += ["", "![pickup latency against poll interval](pickup.svg)"]
    ceiling = _load("sqlite_ceiling.json")
    out += ["", "## SQLite against its own ceiling", "", _machine(ceiling), ""]
    rows = [(r["system"], _num(r["rate"]), _num(r["lost"]), _num(r["duplicated"])) for r in ceiling["rows"]]
    out.append(_table(rows, ("system", "rate /s", "lost", "duplicated")))
    backlog = _load("backlog.json")
    out += ["", "## Take rate against queue depth", "", _machine(backlog), ""]
    out.append(_table([(_num(r["queued"]), _num(r["rate"])) for r in backlog["flat"]], ("queued", "takes/s")))
    sustained = backlog.get("sustained")
    if sustained:
        out += [
            "",
            f"Sustained for {_num(sustained['minutes'])} minutes at a depth of {_num(sustained['depth'])}: "
            f"{_num(sustained['handed_out'])} handed out, {_num(sustained['handed_out_twice'])} twice; "
            f"the last five minutes' rate over the first five: {_num(sustained['last_to_first_five_minutes'])}.",
        ]
    load = _load("load.json")
    out += ["", "## Load across processes (locust)", "", _machine(load), ""]
    rows = [
        (r["locustfile"], r["store"], _num(r["users"]), _num(r["processes"]), _num(r["ops_per_s"]), str(r["p50_ms"]), str(r["p99_ms"]), _num(r["failures"]))
        for r in load["rows"]
    ]
    out.append(_table(rows, ("locustfile", "store", "users", "processes", "ops/s", "p50 ms", "p99 ms", "failures")))
    if (BASELINE / "recovery.json").exists():
        recovery = _load("recovery.json")
        out += ["", "## Recovery after a crash: kill to resume", "", _machine(recovery), ""]
        rows = [
            (
                r["store"] + (", fast failover" if r.get("fast_failover") else ""),
                _num(r["alive_s"]),
                _num(r["poll_ms"]),
                _num(r["samples"]),
                _num(r["kill_to_resume_p50_ms"]),
                _num(r["kill_to_resume_p99_ms"]),
                _num(r["bound_ms"]),
                _num(r["p50_to_bound"]),
                _num(r["p99_to_bound"]),
                _num(r["lost"] + r["past_fence"] + r["duplicated"]),
            )
            for r in recovery["rows"]
            if "kill_to_resume_p50_ms" in r
        ]
        head = ("store", "alive s", "poll ms", "samples", "p50 ms", "p99 ms", "bound ms (alive + poll)",
                "p50 / bound", "p99 / bound", "lost, past fence, twice")
        out.append(_table(rows, head))
    if (BASELINE / "recovery_second_fault.json").exists():
        second = _load("recovery_second_fault.json")
        out += ["", "## Recovery under a second fault: a store restart during the takeover", "", _machine(second), ""]
        rows = [
            (
                r["store"] + (" + store restart" if r.get("second_fault") else ""),
                _num(r["alive_s"]),
                _num(r["samples"]),
                _num(r["kill_to_resume_p50_ms"]),
                _num(r["kill_to_resume_p99_ms"]),
                _num(r["kill_to_done_p50_ms"]),
                _num(r["kill_to_done_p99_ms"]),
                _num(r["outage_max_ms"]) if r.get("outage_max_ms") is not None else "",
                _num(r["bound_ms"]),
                _num(r["lost"] + r["past_fence"] + r["duplicated"]),
            )
            for r in second["rows"]
            if "kill_to_done_p50_ms" in r and not r.get("fast_failover")
        ]
        head = ("store", "alive s", "samples", "resume p50 ms", "resume p99 ms", "done p50 ms", "done p99 ms",
                "outage ms", "bound ms", "lost, past fence, twice")
        out.append(_table(rows, head))
    return "\n".join(out)


MUTATE_FILES = (
    "mutate-sqlite.json",
    "mutate-postgres.json",
    "mutate-redis.json",
    "mutate-sqlite-python.json",
    "mutate-runtime-python.json",
)


def _mutate_part(name: str) -> tuple[str, dict[str, Any]]:
    data = _load(name)
    if "python" in data:
        return f"{data['store']} (Python, {data['python'].get('tool', '')})", data["python"]
    return f"{data['store']} (statements)", data


def mutation_results() -> str:
    """The mutation baselines' summaries, equivalents and survivors."""
    rows = []
    for name in MUTATE_FILES:
        label, part = _mutate_part(name)
        skipped = sum(part.get("skipped", {}).values()) if isinstance(part.get("skipped"), dict) else 0
        rows.append(
            (
                label,
                _num(part["generated"]),
                _num(skipped),
                _num(part["killed"]),
                _num(len(part["equivalent"])),
                _num(len(part["survived"])),
                _num(len(part["not_run"])),
                str(part["killed_or_equivalent"]),
                f"`{name}`",
            )
        )
    out = [
        _table(
            rows,
            ("job", "generated", "skipped", "killed", "equivalent", "survived", "not run", "killed or equivalent", "baseline"),
        )
    ]
    for name in MUTATE_FILES:
        label, part = _mutate_part(name)
        by_operator: dict[str, list[int]] = {}
        for m in part.get("mutants", []):
            counts = by_operator.setdefault(str(m.get("operator", "?")), [0, 0, 0])
            verdict = m.get("verdict", "")
            counts[0 if verdict == "killed" else 1 if verdict == "equivalent" else 2] += 1
        out += ["", f"## {label}", ""]
        out.append(
            _table(
                [(f"`{op}`", _num(k), _num(e), _num(o)) for op, (k, e, o) in sorted(by_operator.items())],
                ("operator", "killed", "equivalent", "other"),
            )
        )
        if part["equivalent"]:
            out += ["", f'??? note "Equivalent mutants ({len(part["equivalent"])}), each with its reason"', ""]
            for e in part["equivalent"]:
                out.append(f"    - `{e['mutant']}`: {' '.join(str(e['why']).split())}")
        if part["survived"]:
            out += ["", "Survivors:", ""] + [f"- `{s if isinstance(s, str) else s.get('mutant')}`" for s in part["survived"]]
    return "\n".join(out)


# ---- plots, drawn from the same baselines and added to the site as files ----

TAKE_PLOTTED = ("postgres", "pgbench", "psycopg-raw", "pgqueuer-b10", "redis-set", "redis-stream", "sqlite")


def _svg(draw: Callable[[Any], None]) -> bytes:
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    matplotlib.rcParams["svg.hashsalt"] = "wd-docs"  # the same baseline draws the same file
    fig, ax = plt.subplots(figsize=(7, 4), layout="constrained")
    draw(ax)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    buf = io.BytesIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    plt.close(fig)
    return buf.getvalue()


def take_plot() -> bytes:
    """Take throughput against workers, one line per system (``take.json``)."""
    rows = _load("take.json")["rows"]

    def draw(ax: Any) -> None:
        for system in TAKE_PLOTTED:
            mine = sorted((r["workers"], r["rate"]) for r in rows if r["system"] == system)
            if mine:
                ax.plot(*zip(*mine, strict=True), marker="o", label=system)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")  # Redis runs an order of magnitude above the SQL stores
        ax.set_xlabel("workers")
        ax.set_ylabel("deliveries / s")

    return _svg(draw)


def pickup_plot() -> bytes:
    """Pickup latency (p50) against poll interval, one line per store and wakeup (``pickup.json``)."""
    rows = _load("pickup.json")["rows"]

    def draw(ax: Any) -> None:
        for store, wakeup in dict.fromkeys((r["store"], r["wakeup"]) for r in rows):
            mine = sorted((r["poll_ms"], r["p50_ms"]) for r in rows if (r["store"], r["wakeup"]) == (store, wakeup))
            ax.plot(*zip(*mine, strict=True), marker="o", label=f"{store}{' + wakeup' if wakeup else ''}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("poll interval (ms)")
        ax.set_ylabel("pickup p50 (ms)")

    return _svg(draw)


PLOTS: dict[str, Callable[[], bytes]] = {"results/take.svg": take_plot, "results/pickup.svg": pickup_plot}


def on_files(files: Any, config: Any) -> Any:
    """MkDocs event: add the plots to the site's files, so pages link them like any image."""
    from mkdocs.structure.files import File

    for uri, plot in PLOTS.items():
        files.append(File.generated(config, uri, content=plot()))
    return files


GENERATORS: dict[str, Callable[[], str]] = {
    "scenario-format": scenario_format,
    "faults-and-checkers": faults_and_checkers,
    "scenario-list": scenario_list,
    "benchmarks": benchmarks,
    "mutation-results": mutation_results,
}


def render(markdown: str, where: str = "a page") -> str:
    """``markdown`` with each marker replaced by what its generator renders."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise ValueError(f"{where}: unknown generated part <!-- wd:{name} -->; known: {', '.join(GENERATORS)}")
        return GENERATORS[name]()

    return MARKER.sub(one, markdown)


def first_sentence(text: str) -> str:
    """The first sentence of a command's help, on one line (a summary cut at a line break would
    stop mid-sentence)."""
    flat = " ".join(text.replace("\b", " ").split())
    match = re.search(r"(?<=[.!?])\s+(?=[A-Z(`'\"])", flat)
    return flat[: match.start()] if match else flat


def tidy_cli_reference() -> None:
    """Ready ``wd_chaos.cli``'s commands for mkdocs-click (same objects, this process only):
    summaries are whole first sentences, and an option declared without a default shows the value
    it takes when not given (click keeps an ``UNSET`` sentinel that would print as
    ``Sentinel.UNSET``)."""
    import click

    from wd_chaos.cli import main

    unset = getattr(click.core, "UNSET", object())
    for command in [main, *main.commands.values()]:
        if command.help and not command.short_help:
            command.short_help = first_sentence(command.help)
        for param in command.params:
            if isinstance(param, click.Option) and param.default is unset:
                param.default = False if param.is_flag else () if param.multiple else None


def on_config(config: Any) -> Any:
    """MkDocs event: ready the CLI's commands for the reference page."""
    tidy_cli_reference()
    return config


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    """MkDocs event: the help option click adds on its own (``-h, --help``) is made per call, so
    ``tidy_cli_reference`` cannot reach its default: it is a flag, off unless given."""
    if page.file.src_path == "reference/cli.md":
        html = html.replace("<code>Sentinel.UNSET</code>", "<code>False</code>")
        if "Sentinel.UNSET" in html:
            raise ValueError("reference/cli.md: a default still shows as Sentinel.UNSET")
    return html


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """MkDocs event: render the page's generated parts."""
    return render(markdown, page.file.src_path)
