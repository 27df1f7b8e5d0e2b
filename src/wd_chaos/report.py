"""The run report: ``report.html`` beside ``summary.json`` and ``history.jsonl``.

One self-contained HTML file: the verdict table with evidence, the fault schedule, a timeline of
passes per workflow (fault windows shaded, fenced writes marked), and latency and throughput
plots, drawn with matplotlib and embedded as PNG.
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

from .checks.core import not_bitten, operations
from .faults import kinds
from .history import Op
from .shrink import shrink_command

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


def _windows(ops: list[Op], t0: int) -> list[tuple[str, float, float, str]]:
    starts: dict[str, Op] = {}
    out = []
    end = max((o["mono"] for o in ops), default=t0)
    for line in ops:
        if line["type"] != "fault":
            continue
        kind, phase, key = line.get("fault"), line.get("phase"), str(line.get("id"))
        if kind in kinds() and kinds()[str(kind)].window and phase == "start":
            starts[key] = line
        elif phase == "stop" and key in starts:
            s = starts.pop(key)
            out.append(
                (
                    str(kind),
                    (s["mono"] - t0) / 1e9,
                    (line["mono"] - t0) / 1e9,
                    str(s.get("target", "")),
                )
            )
    for key, s in starts.items():
        out.append((str(s["fault"]), (s["mono"] - t0) / 1e9, (end - t0) / 1e9, key))
    return out


def timeline(ops: list[Op], offending: set[str] | None = None) -> str:
    """Passes per workflow over time, faults shaded, fenced writes marked, and the operations an
    invalid verdict names (``offending`` op ids) starred."""
    offending = offending or set()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not ops:
        return ""
    t0 = ops[0]["mono"]
    passes: dict[tuple[str, int, int], list[float]] = defaultdict(list)
    procs: dict[tuple[str, int, int], str] = {}
    fenced: list[tuple[str, float, int]] = []
    starred: list[tuple[str, float, int]] = []
    for o in operations(ops):
        wf, tok = o.workflow, o.token
        if wf is None or tok is None:
            continue
        k = (wf, tok, int(o.invoke["pid"]))
        passes[k] += [(o.start - t0) / 1e9, ((o.end if o.complete else o.start) - t0) / 1e9]
        procs[k] = str(o.invoke.get("process"))
        if o.outcome == "fenced":
            fenced.append((wf, (o.end - t0) / 1e9, tok))
        if o.invoke.get("op") in offending:
            starred.append((wf, ((o.end if o.complete else o.start) - t0) / 1e9, tok))
    wfs = sorted({k[0] for k in passes})[:60]
    row = {wf: i for i, wf in enumerate(wfs)}
    names = sorted(set(procs.values()))
    cmap = plt.get_cmap("tab10")
    color = {n: cmap(i % 10) for i, n in enumerate(names)}
    fig, ax = plt.subplots(figsize=(12, max(3.0, 0.28 * len(wfs) + 1.5)))
    for kind, a, b, _target in _windows(ops, t0):
        ax.axvspan(a, b, color=kinds()[kind].color, alpha=0.18, lw=0)
    for line in ops:
        fk = kinds().get(str(line.get("fault"))) if line["type"] == "fault" else None
        if fk is None:
            continue
        for marker in fk.markers:
            if line.get("phase") == marker.phase:
                ax.axvline((line["mono"] - t0) / 1e9, color=fk.color, lw=marker.width, ls=marker.style)
    drawn = [handle for fk in kinds().values() if fk.draw is not None for handle in fk.draw(ax, ops, t0)]
    for (wf, tok, pid), times in passes.items():
        if wf in row:
            lane = row[wf] + ((tok % 3) - 1) * 0.22  # overlapping passes of one workflow side by side
            ax.plot(
                [min(times), max(times)],
                [lane, lane],
                lw=3,
                solid_capstyle="butt",
                color=color[procs[(wf, tok, pid)]],
            )
    xs = [t for wf, t, _ in fenced if wf in row]
    ys = [row[wf] + ((tok % 3) - 1) * 0.22 for wf, _, tok in fenced if wf in row]
    ax.scatter(xs, ys, marker="x", color="red", s=60, zorder=5, label="fenced write")
    if starred:
        ax.scatter(
            [t for wf, t, _ in starred if wf in row],
            [row[wf] + ((tok % 3) - 1) * 0.22 for wf, _, tok in starred if wf in row],
            marker="*", color="black", s=160, zorder=6, label="violation",
        )  # fmt: skip
    ax.set_yticks(range(len(wfs)))
    common = os.path.commonprefix(wfs) if len(wfs) > 1 else ""  # noqa: RUF071 - strings, not paths
    ax.set_yticklabels([w[len(common) :] or w for w in wfs], fontsize=7)
    if common:
        ax.set_ylabel(f"workflow ({common}...)", fontsize=8)
    ax.set_xlabel("seconds since start")
    from matplotlib.patches import Patch

    handles: list[Any] = [Patch(color=color[n], label=n) for n in names]
    handles += [Patch(color=k.color, alpha=0.3, label=name) for name, k in kinds().items() if k.window]
    handles.append(ax.scatter([], [], marker="x", color="red", label="fenced"))
    handles += drawn
    if starred:
        handles.append(ax.scatter([], [], marker="*", color="black", s=80, label="violation"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)
    ax.set_title("passes per workflow (bars), fault windows (shaded), kills (dotted)")
    return _png(fig)


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


def write_report(run_dir: Path, summary: dict[str, Any], ops: list[Op], final: dict[str, Any]) -> Path:
    """Write ``report.html`` for a run; returns its path."""
    esc = html.escape
    rows = []
    for v in summary["verdicts"]:
        ev = ""
        if v["evidence"]:
            shown = json.dumps(v["evidence"], indent=1, default=str)
            more = (
                f" (first {len(v['evidence'])} of {v['evidence_total']})"
                if v["evidence_total"] > len(v["evidence"])
                else ""
            )
            ev = f"<details><summary>evidence{more}</summary><pre>{esc(shown)}</pre></details>"
        rows.append(
            f"<tr><td>{esc(v['name'])}</td>"
            f"{_verdict_cell(v['valid'], not_bitten(str(v['name']), v['valid'], v.get('counts', {})))}"
            f"<td>{esc(v['summary'])}{ev}</td><td><code>{esc(json.dumps(v['counts']))}"
            "</code></td></tr>"
        )
    faults = (
        "".join(
            f"<tr><td>{(f['mono'] - ops[0]['mono']) / 1e9:.2f}</td>"
            f"<td>{esc(str(f.get('fault')))}</td>"
            f"<td>{esc(str(f.get('phase')))}</td><td>{esc(str(f.get('target', '')))}</td>"
            f"<td><code>{esc(json.dumps({k: f[k] for k in f if k in _detail()}))}</code></td></tr>"
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
    try:
        offending = {
            str(e["op"])
            for v in summary["verdicts"]
            if v["valid"] is False
            for e in v["evidence"]
            if isinstance(e, dict) and "op" in e
        }
        tl, lt = timeline(ops, offending), latency_throughput(ops)
        plots = (
            f'<h2>Timeline</h2><img src="data:image/png;base64,{tl}">'
            f'<h2>Latency and throughput</h2><img src="data:image/png;base64,{lt}">'
        )
    except Exception as exc:  # a plot failure must not lose the verdict
        plots = f"<p>plots failed: {esc(repr(exc))}</p>"
    mutant = f", mutant {esc(str(summary['mutant']))}" if summary.get("mutant") else ""
    source = str(summary.get("schedule_from", "seed"))
    replayed = (
        f"<p><b>fault schedule replayed from {esc(source)}</b>, not made from the seed</p>"
        if source != "seed"
        else ""
    )
    # a failing run says how to find the few faults that matter
    shrink = (
        f"<p>smallest failing fault schedule: <code>{esc(shrink_command(run_dir))}</code></p>"
        if overall is False
        else ""
    )
    untested = (
        "<p><b>the store was NOT tested by the fault</b>: it did not bite (run it again, with "
        "another <code>--seed</code>, to test it)</p>"
        if any(not_bitten(str(v["name"]), v["valid"], v.get("counts", {})) for v in summary["verdicts"])
        else ""
    )
    doc = f"""<!doctype html><html><head><meta charset="utf-8"><title>{esc(title)}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:1400px}}
table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #ccc;padding:4px 8px;
vertical-align:top;font-size:14px}}.ok{{background:#d8f3dc}}.bad{{background:#ffccd5;
font-weight:bold}}.unk{{background:#fff3b0}}pre{{max-height:400px;overflow:auto;font-size:12px}}
img{{max-width:100%}}</style></head><body>
<h1>{esc(title)}: <span class="{ {True: "ok", False: "bad"}.get(overall, "unk") }">
{ {True: "VALID", False: "INVALID"}.get(overall, "UNKNOWN") }</span></h1>
<p>seed {summary["seed"]}, time limit {summary["time_limit"]} s, {summary["workers"]} workers,
{summary["workflows"]} workflows, wall {summary.get("wall_seconds")} s, exit code
{summary["exit_code"]}{mutant}</p>
{replayed}{untested}{shrink}
{clock}
<h2>Verdicts</h2><table><tr><th>checker</th><th>verdict</th><th>summary</th><th>counts</th></tr>
{"".join(rows)}</table>
<h2>Fault schedule (as it happened)</h2><table><tr><th>t (s)</th><th>fault</th><th>phase</th>
<th>target</th><th>detail</th></tr>{faults}</table>
{plots}
<h2>Operation counts</h2><pre>{esc(json.dumps(summary["counts"], indent=1))}</pre>
<h2>Versions</h2><pre>{esc(json.dumps(summary.get("versions", {}), indent=1))}</pre>
</body></html>"""
    out = run_dir / "report.html"
    out.write_text(doc)
    return out
