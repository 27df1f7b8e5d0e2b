"""The run report: ``report.html`` beside ``summary.json`` and ``history.jsonl``.

One self-contained HTML file that needs no network: the verdict table with its evidence as tables,
the command that reproduces the run, the fault schedule, an interactive timeline of every
operation per workflow (``timeline.py``: inline SVG, hover and filters), latency and throughput
plots and the pickup of each due delivery over the run with its fault windows (matplotlib, embedded
as PNG), and links to the run's ``history.jsonl`` and ``summary.json``.
"""

from __future__ import annotations

import base64
import html
import io
import json
import shlex
from collections import defaultdict
from pathlib import Path
from typing import Any

from .checks.core import not_bitten, operations
from .faults import kinds
from .history import Op
from .rundir import FinalState, shrink_command
from .scenario import available
from .timeline import STYLE as TIMELINE_STYLE
from .timeline import render as render_timeline

_DETAIL = ("workflow", "key", "why")
"""The fields of a fault line the fault table shows for every kind (each kind adds its ``detail``)."""


def _detail() -> set[str]:
    return {*_DETAIL, *(name for k in kinds().values() for name in k.detail)}


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def latency_throughput(ops: list[Op]) -> str:
    """Latency per operation kind, and completions per second by outcome."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not ops:
        return ""
    t0 = ops[0]["mono"]
    lat: dict[str, list[float]] = defaultdict(list)
    per_sec: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for o in operations(ops):
        if o.complete is None or o.f == "effect":
            continue
        lat[o.f].append(max((o.end - o.start) / 1e6, 0.01))
        per_sec[o.outcome][int((o.end - t0) / 1e9)] += 1
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 3.6))
    kinds = sorted(lat)
    if kinds:
        a1.boxplot([lat[k] for k in kinds], tick_labels=kinds, showfliers=True)
        a1.set_yscale("log")
    a1.set_ylabel("latency (ms)")
    a1.tick_params(axis="x", labelrotation=45, labelsize=7)
    a1.set_title("latency by operation")
    for outcome, series in sorted(per_sec.items()):
        xs = sorted(series)
        a2.plot(xs, [series[x] for x in xs], label=outcome, drawstyle="steps-mid")
    a2.set_xlabel("seconds since start")
    a2.set_ylabel("completions / s")
    if per_sec:
        a2.legend(fontsize=7)
    a2.set_title("throughput by outcome")
    return _png(fig)


def _verdict_cell(valid: object, untested: bool = False) -> str:
    label = {True: "valid", False: "INVALID"}.get(valid, "unknown")  # type: ignore[call-overload]
    if untested:
        label = "not tested"
    cls = {True: "ok", False: "bad"}.get(valid, "unk")  # type: ignore[call-overload]
    return f'<td class="{cls}">{label}</td>'


def reproduce_command(run_dir: Path, summary: dict[str, Any]) -> str:
    """The ``wd-chaos run`` command that runs this run again: same scenario, store, seed, time limit,
    workers, client and mutant, and its recorded fault schedule when that did not come from the seed.
    A scenario that is not built in is named by the run's own ``scenario.json``. A run that says
    its own replay (a simulated run's ``wd-chaos sim`` command) is replayed by that."""
    if summary.get("replay"):
        return str(summary["replay"])
    name = str(summary["scenario"])
    try:
        built_in = name in available()
    except Exception:  # a broken install must not lose the report
        built_in = False
    scenario = (
        name if built_in or not (run_dir / "scenario.json").is_file() else str(run_dir / "scenario.json")
    )
    words = ["wd-chaos", "run", scenario, "--store", str(summary["store"]), "--seed", str(summary["seed"])]
    words += ["--time-limit", f"{summary['time_limit']:g}", "--workers", str(summary["workers"])]
    if summary.get("client") not in (None, "harness"):
        words += ["--client", str(summary["client"])]
    if summary.get("mutant"):
        words += ["--mutant", str(summary["mutant"])]
    if str(summary.get("schedule_from", "seed")) != "seed":
        words += ["--schedule", str(run_dir / "run.json")]
    return shlex.join(words)


def _cell(value: object) -> str:
    """A value as a table cell reads: text as itself, a structure as compact JSON."""
    if value is None:
        return ""
    text = value if isinstance(value, str) else json.dumps(value, default=str, sort_keys=True)
    return html.escape(text)


def table(rows: list[dict[str, Any]], cls: str = "evidence") -> str:
    """Records as an HTML table: one column per field, in the order fields first appear."""
    columns: list[str] = []
    for r in rows:
        columns += [k for k in r if k not in columns]
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{_cell(r.get(c))}</td>" for c in columns) + "</tr>" for r in rows)
    return f'<table class="{cls}"><tr>{head}</tr>{body}</table>'


def _pairs(counts: dict[str, Any]) -> str:
    return "<br>".join(f"{html.escape(str(k))}: <b>{_cell(v)}</b>" for k, v in counts.items())


def _op_counts(counts: dict[str, int]) -> str:
    """``f:outcome`` counts as one row per operation, one column per outcome."""
    by_f: dict[str, dict[str, int]] = defaultdict(dict)
    for name, n in counts.items():
        f, _, outcome = name.partition(":")
        by_f[f][outcome or "count"] = n
    outcomes = sorted({o for per in by_f.values() for o in per})
    return table(
        [{"operation": f, **{o: by_f[f].get(o, "") for o in outcomes}} for f in sorted(by_f)], "counts"
    )


def pickup_plot(ops: list[Op], final: FinalState) -> str:
    """Each due delivery's pickup (``checks.pickup``) over the run, in ms on a log scale: judged
    ones, and lost ones (a take found nothing while it was due) in red; the bound as a dashed line
    and every fault window shaded. Empty when the run had no due delivery to show."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .checks.pickup import fault_windows, measure

    pk = measure(ops, final)
    if not ops or not (pk.judged or pk.missed):
        return ""
    t0, end = float(ops[0]["mono"]), float(ops[-1]["mono"])
    fig, ax = plt.subplots(figsize=(12, 3.2))
    for lo, hi in fault_windows(ops):
        ax.axvspan((max(lo, t0) - t0) / 1e9, (min(hi, end) - t0) / 1e9, color="orange", alpha=0.15, lw=0)
    for rows, colour, label in ((pk.judged, "tab:blue", "judged"), (pk.missed, "tab:red", "lost")):
        if rows:
            xs = [(d.due - t0) / 1e9 for d, _ in rows]
            ax.scatter(xs, [max(ms, 0.1) for _, ms in rows], s=9, color=colour, label=label)
    ax.axhline(pk.bound_ms, color="grey", ls="--", lw=1, label=f"bound {pk.bound_ms:.0f} ms")
    ax.set_yscale("log")
    ax.set_xlabel("seconds since start (faults shaded)")
    ax.set_ylabel("pickup (ms)")
    ax.set_title("pickup: due to taken")
    ax.legend(fontsize=7)
    return _png(fig)


def write_report(run_dir: Path, summary: dict[str, Any], ops: list[Op], final: FinalState) -> Path:
    """Write ``report.html`` for a run; returns its path."""
    esc = html.escape
    rows = []
    for v in summary["verdicts"]:
        ev = ""
        if v["evidence"]:
            more = (
                f" (first {len(v['evidence'])} of {v['evidence_total']})"
                if v["evidence_total"] > len(v["evidence"])
                else f" ({len(v['evidence'])})"
            )
            shown = [e if isinstance(e, dict) else {"evidence": e} for e in v["evidence"]]
            ev = f"<details><summary>evidence{more}</summary>{table(shown)}</details>"
        rows.append(
            f"<tr><td>{esc(v['name'])}</td>"
            f"{_verdict_cell(v['valid'], not_bitten(str(v['name']), v['valid'], v.get('counts', {})))}"
            f'<td>{esc(v["summary"])}{ev}</td><td class="pairs">{_pairs(v["counts"])}</td></tr>'
        )
    faults = (
        "".join(
            f"<tr><td>{(f['mono'] - ops[0]['mono']) / 1e9:.2f}</td>"
            f"<td>{esc(str(f.get('fault')))}</td>"
            f"<td>{esc(str(f.get('phase')))}</td><td>{esc(str(f.get('target', '')))}</td>"
            f"<td>{'; '.join(f'{esc(k)} {_cell(f[k])}' for k in f if k in _detail())}</td></tr>"
            for f in summary.get("faults", [])
        )
        if ops
        else ""
    )
    steps = summary.get("wall_clock_steps", [])
    clock = (
        f"<p>leases measured on the {esc(str(summary.get('lease_clock', 'unrecorded')))} clock; "
        + (
            "this machine's wall clock stepped during the run (not a scheduled fault): "
            + "; ".join(f"{s['seconds']:+.3f} s near {esc(str(s['wall']))}" for s in steps)
            if steps
            else "this machine's wall clock did not step during the run"
        )
        + "</p>"
    )
    clock += "".join(k.describe(ops) for k in kinds().values() if k.describe is not None)
    overall = summary["valid"]
    title = f"{summary['scenario']} on {summary['store']}"
    kept = next((v for v in summary["verdicts"] if v["name"] == "durability"), None)
    if kept is not None and "acknowledged" in kept["counts"]:
        clock += (
            f"<p><b>durability: {kept['counts']['lost']} of {kept['counts']['acknowledged']} "
            "acknowledged writes lost</b></p>"
        )
    offending = {
        str(e["op"])
        for v in summary["verdicts"]
        if v["valid"] is False
        for e in v["evidence"]
        if isinstance(e, dict) and "op" in e
    }
    try:
        drawn = render_timeline(ops, offending)
    except Exception as exc:  # a drawing failure must not lose the verdict
        drawn = f"<p>timeline failed: {esc(repr(exc))}</p>"
    try:
        lt = latency_throughput(ops)
        plots = f'<img alt="latency and throughput" src="data:image/png;base64,{lt}">' if lt else ""
    except Exception as exc:
        plots = f"<p>plots failed: {esc(repr(exc))}</p>"
    try:
        picked = pickup_plot(ops, final)
        plots += f'<img alt="pickup over the run" src="data:image/png;base64,{picked}">' if picked else ""
    except Exception as exc:  # like the timeline: a drawing failure must not lose the verdict
        plots += f"<p>pickup plot failed: {esc(repr(exc))}</p>"
    mutant = f", mutant {esc(str(summary['mutant']))}" if summary.get("mutant") else ""
    source = str(summary.get("schedule_from", "seed"))
    replayed = (
        f"<p><b>fault schedule replayed from {esc(source)}</b>, not made from the seed</p>"
        if source != "seed"
        else ""
    )
    again = f'<p>run it again: <code class="cmd">{esc(reproduce_command(run_dir, summary))}</code></p>'
    # a failing run says how to find the few faults that matter
    expected = summary.get("expected")
    shrink = (
        f"<p>smallest failing fault schedule: <code>{esc(shrink_command(run_dir))}</code></p>"
        if overall is False and not expected
        else ""
    )
    if expected:  # the loss the scenario exists to show: a pass, said with its figure
        shrink = (
            f"<p><b>expected</b>: {expected['lost']} of {expected['acknowledged']} acknowledged writes "
            f'lost, as this scenario expects (expect = "{esc(str(expected["expect"]))}"); exit code 0'
            + (f"; {esc(', '.join(expected['consequences']))} fail as its consequence" if expected.get("consequences") else "")
            + "</p>"
        )
    headline, headline_class = (
        ("EXPECTED", "exp") if expected else ({True: "VALID", False: "INVALID"}.get(overall, "UNKNOWN"),
                                               {True: "ok", False: "bad"}.get(overall, "unk"))
    )
    untested = (
        "<p><b>the store was NOT tested by the fault</b>: it did not bite (run it again, with "
        "another <code>--seed</code>, to test it)</p>"
        if any(not_bitten(str(v["name"]), v["valid"], v.get("counts", {})) for v in summary["verdicts"])
        else ""
    )
    files = (
        '<p class="files">files: <a href="summary.json">summary.json</a> (verdicts and figures) · '
        '<a href="history.jsonl">history.jsonl</a> (every operation, one JSON line each)</p>'
    )
    versions = table([{"package": k, "version": v} for k, v in summary.get("versions", {}).items()], "counts")
    doc = f"""<!doctype html><html><head><meta charset="utf-8"><title>{esc(title)}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:1400px}}
table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #ccc;padding:4px 8px;
vertical-align:top;font-size:14px;text-align:left}}.ok{{background:#d8f3dc}}.bad{{background:#ffccd5;
font-weight:bold}}.unk{{background:#fff3b0}}.exp{{background:#cfe2ff}}table.evidence td,table.evidence th{{font-size:12px;
max-width:420px;word-break:break-word}}td.pairs{{font-size:12px;white-space:nowrap}}
code.cmd{{background:#f3f3f3;padding:2px 6px;user-select:all}}img{{max-width:100%}}
{TIMELINE_STYLE}</style></head><body>
<h1>{esc(title)}: <span class="{headline_class}">{headline}</span></h1>
<p>seed {summary["seed"]}, time limit {summary["time_limit"]} s, {summary["workers"]} workers,
{summary["workflows"]} workflows, wall {summary.get("wall_seconds")} s, exit code
{summary["exit_code"]}{mutant}</p>
{again}{files}
{replayed}{untested}{shrink}
{clock}
<h2>Verdicts</h2><table><tr><th>checker</th><th>verdict</th><th>summary</th><th>counts</th></tr>
{"".join(rows)}</table>
<h2>Fault schedule (as it happened)</h2><table><tr><th>t (s)</th><th>fault</th><th>phase</th>
<th>target</th><th>detail</th></tr>{faults}</table>
<h2>Timeline</h2>{drawn}
<h2>Latency, throughput and pickup</h2>{plots}
<h2>Operation counts</h2>{_op_counts(summary["counts"])}
<h2>Versions</h2>{versions}
</body></html>"""
    out = run_dir / "report.html"
    out.write_text(doc)
    return out
