"""The report's timeline: every operation of every workflow over time, as inline SVG.

One lane per workflow; in it each operation a bar from invoke to complete, coloured by the process
that made it (an operation with no complete runs to the end, dashed), the passes behind them as
faint lines, fault windows shaded, instant faults as vertical lines, fenced writes crossed and the
operations an invalid verdict names starred. A few lines of inline JavaScript show an operation's
call, result and worker on hover and filter by worker or workflow. No network: it is all in the page.
"""

from __future__ import annotations

import html
import json
import math
import os
from collections import defaultdict

from .checks.core import Operation, operations
from .faults import kinds
from .history import Op

PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b",
    "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#393b79",
)  # fmt: skip
"""Colours of the processes, in the order of their names (matplotlib's tab10, red left to faults)."""

MAX_LANES = 60
"""Workflows drawn (the first by name); a long run's report stays readable and small."""
MAX_OPS = 6000
"""Operations drawn; past this the shortest are dropped first, and the page says how many."""
MAX_LABEL = 48
"""Characters of a lane's label shown (the rest of a long workflow id is in its tooltip)."""
READS = frozenset({"load", "history"})
"""Reads are many and say little on a timeline (the checkers judge them): not drawn."""

_PLOT_WIDTH = 1000
_ROW = 20
_TOP = 22
_AXIS = 36

_SCRIPT = """(function(){
const root=document.getElementById('timeline-box');if(!root)return;
const info=JSON.parse(document.getElementById('timeline-data').textContent);
const tip=document.getElementById('tip');
function esc(s){return String(s).replace(/[&<>"]/g,c=>({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'}[c]));}
function rows(el){const i=el.dataset.i,k=el.dataset.fault;
  return i!==undefined?info.ops[+i]:(k!==undefined?info.faults[+k]:null);}
function table(r){return '<table>'+r.map(x=>'<tr><th>'+esc(x[0])+'</th><td>'+esc(x[1])+'</td></tr>').join('')+'</table>';}
function show(e){if(!rows(e.target))return;
  // every operation under the pointer, not just the top one: at a coarse scale they overlap
  const under=document.elementsFromPoint(e.clientX,e.clientY).filter(el=>el.closest&&el.closest('#timeline')&&rows(el)&&el.style.display!=='none');
  const ops=under.filter(el=>el.dataset.i!==undefined),faults=under.filter(el=>el.dataset.fault!==undefined);
  const shown=[...ops.slice(0,4),...faults.slice(0,2)];
  let more=ops.length>4?'<p>and '+(ops.length-4)+' more here: zoom in</p>':'';
  tip.innerHTML=shown.map(el=>table(rows(el))).join('<hr>')+more;
  tip.hidden=false;move(e);}
function move(e){if(tip.hidden)return;const x=Math.min(e.clientX+14,window.innerWidth-tip.offsetWidth-8);
  tip.style.left=Math.max(0,x)+'px';tip.style.top=(e.clientY+14)+'px';}
const svg=root.querySelector('svg');
svg.addEventListener('mouseover',show);svg.addEventListener('mousemove',move);
svg.addEventListener('mouseout',()=>{tip.hidden=true;});
const z=document.getElementById('tl-zoom');
// zoom stretches time only: every x right of the lane labels moves out from them, text keeps its size
const L=+svg.dataset.left,W=+svg.dataset.plot,H=svg.viewBox.baseVal.height,pad=svg.viewBox.baseVal.width-L-W;
const orig=[...svg.querySelectorAll('*')].map(el=>[el,['x','x1','x2','width'].map(a=>el.getAttribute(a))]);
z.addEventListener('change',()=>{const k=+z.value;
  for(const [el,[x,x1,x2,wd]] of orig){
    const at=v=>v===null||+v<L?v:String(L+(+v-L)*k);
    if(x!==null)el.setAttribute('x',at(x));if(x1!==null)el.setAttribute('x1',at(x1));
    if(x2!==null)el.setAttribute('x2',at(x2));
    if(wd!==null&&x!==null&&+x>=L&&el.tagName==='rect')el.setAttribute('width',String(+wd*k));
    if(el.dataset.x)el.setAttribute('transform','translate('+((+el.dataset.x-L)*(k-1))+',0)');}
  const w=L+W*k+pad;svg.setAttribute('viewBox','0 0 '+w+' '+H);svg.setAttribute('width',w);
  svg.style.maxWidth=k>1?'none':'100%';});
const w=document.getElementById('tl-worker'),f=document.getElementById('tl-workflow');
function filter(){for(const el of svg.querySelectorAll('[data-worker],[data-workflow]')){
  const ok=(!w.value||el.dataset.worker===w.value)&&(!f.value||el.dataset.workflow===f.value);
  el.style.display=ok?'':'none';}
  for(const lane of svg.querySelectorAll('.lane')){lane.style.opacity=(!f.value||lane.dataset.lane===f.value)?1:0.25;}}
w.addEventListener('change',filter);f.addEventListener('change',filter);})();"""


def _fmt(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str, sort_keys=True)


def _op_rows(o: Operation, t0: int) -> list[tuple[str, str]]:
    """What a hover shows: the call (function and arguments), the result, who made it and when."""
    call = ", ".join(
        f"{k}={_fmt(o.invoke[k])}"
        for k in ("workflow", "key", "value", "token", "at", "visibility", "receipt")
        if o.invoke.get(k) is not None
    )
    rows = [
        ("call", f"{o.f}({call})"),
        ("result", o.outcome),
    ]
    if o.complete is not None:
        got = [
            f"{k}={_fmt(o.complete[k])}"
            for k in ("value", "won", "key", "token", "workflow", "receipt")
            if o.complete.get(k) is not None and (k != "workflow" or o.invoke.get(k) is None)
        ]
        if got:
            rows.append(("returned", ", ".join(got)))
        if o.complete.get("error"):
            rows.append(("error", str(o.complete["error"])))
    else:
        rows.append(("returned", "nothing: no complete (killed or cut off), indeterminate"))
    rows.append(("worker", f"{o.invoke.get('process')} (pid {o.invoke.get('pid')})"))
    end = "" if o.complete is None else f", took {(o.end - o.start) / 1e6:.1f} ms"
    rows.append(("at", f"{(o.start - t0) / 1e9:.3f} s{end}"))
    rows.append(("op", str(o.invoke.get("op"))))
    return rows


def _ticks(span: float) -> list[float]:
    step = 10 ** math.floor(math.log10(span / 5)) if span > 0 else 1.0
    for mult in (1, 2, 5, 10):
        if span / (step * mult) <= 10:
            step *= mult
            break
    return [i * step for i in range(int(span / step) + 1)]


def fault_kinds_seen(ops: list[Op]) -> list[str]:
    """The fault kinds that happened in this history (a window opened, or an instant such as a
    kill's start; a kill disarmed before its failpoint was reached did not happen), in registry
    order: the timeline's legend lists these and no others."""
    if not ops:
        return []
    t0, end = int(ops[0]["mono"]), max(int(o["mono"]) for o in ops)
    seen = {kind for kind, _, _, _ in _fault_spans(ops, t0, end)}
    return [name for name in kinds() if name in seen]


def _fault_spans(ops: list[Op], t0: int, end: int) -> list[tuple[str, float, float | None, Op]]:
    """(kind, start, stop or None for an instant, the starting line) for every fault of a kind."""
    starts: dict[str, Op] = {}
    out: list[tuple[str, float, float | None, Op]] = []
    registry = kinds()
    for line in ops:
        if line.get("type") != "fault" or str(line.get("fault")) not in registry:
            continue
        kind = registry[str(line["fault"])]
        at = (int(line["mono"]) - t0) / 1e9
        phase = line.get("phase")
        if kind.window and phase == "start":
            starts[str(line.get("id"))] = line
        elif kind.window and phase == "stop" and str(line.get("id")) in starts:
            s = starts.pop(str(line.get("id")))
            out.append((kind.name, (int(s["mono"]) - t0) / 1e9, at, s))
        # an instant: a marker's phase, or the start of a kind with neither window nor markers
        if any(m.phase == phase for m in kind.markers) or (
            not kind.window and not kind.markers and phase in ("start", None)
        ):
            out.append((kind.name, at, None, line))
    for s in starts.values():  # never stopped: shaded to the end
        out.append((str(s["fault"]), (int(s["mono"]) - t0) / 1e9, (end - t0) / 1e9, s))
    return out


def render(ops: list[Op], offending: set[str] | None = None) -> str:
    """The timeline section's HTML: filters, the SVG, its legend, and the data and script behind the
    hover. ``offending`` holds the op ids an invalid verdict names (starred). Empty for no history."""
    offending = offending or set()
    esc = html.escape
    if not ops:
        return "<p>no history: nothing to draw</p>"
    t0 = int(ops[0]["mono"])
    end = max(int(o["mono"]) for o in ops)
    drawn = [o for o in operations(ops) if o.workflow is not None and o.f not in READS]
    wfs = sorted({str(o.workflow) for o in drawn})
    lanes = wfs[:MAX_LANES]
    row = {wf: i for i, wf in enumerate(lanes)}
    drawn = [o for o in drawn if o.workflow in row]
    dropped = max(0, len(drawn) - MAX_OPS)
    if dropped:
        drawn = sorted(drawn, key=lambda o: o.end - o.start)[:MAX_OPS]
    span = max((end - t0) / 1e9, 1e-3)
    common = os.path.commonprefix(lanes) if len(lanes) > 1 else ""  # noqa: RUF071 - strings, not paths
    labels = {wf: wf[len(common) :] or wf for wf in lanes}
    # a very long id would push the plot off the page: cut, the whole id in the lane's <title>
    labels = {wf: v if len(v) <= MAX_LABEL else v[: MAX_LABEL - 1] + "\u2026" for wf, v in labels.items()}
    # the left margin fits the longest lane label: nothing is cut
    left = 16 + 7 * max((len(v) for v in labels.values()), default=4)
    width = left + _PLOT_WIDTH + 16
    height = _TOP + _ROW * max(len(lanes), 1) + _AXIS

    def x(t: float) -> float:
        return round(left + t / span * _PLOT_WIDTH, 1)

    def y(wf: str, token: int | None) -> float:
        shift = 0 if token is None else ((token % 3) - 1) * 5  # one workflow's passes side by side
        return _TOP + row[wf] * _ROW + _ROW / 2 + shift

    names = sorted({str(o.invoke.get("process")) for o in drawn})
    color = {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(names)}
    svg: list[str] = []
    for wf in lanes:
        top = _TOP + row[wf] * _ROW
        svg.append(
            f'<g class="lane" data-lane="{esc(wf)}"><rect x="{left}" y="{top}" width="{_PLOT_WIDTH}" '
            f'height="{_ROW}" fill="{"#f6f6f6" if row[wf] % 2 else "#ffffff"}"/>'
            f'<text x="{left - 6}" y="{top + _ROW / 2 + 4}" text-anchor="end" font-size="11">'
            f"<title>{esc(wf)}</title>{esc(labels[wf])}</text></g>"
        )
    fault_rows: list[list[tuple[str, str]]] = []
    plot_top, plot_bottom = _TOP, _TOP + _ROW * max(len(lanes), 1)
    for kind_name, a, b, line in _fault_spans(ops, t0, end):
        kind = kinds()[kind_name]
        detail = [(k, _fmt(line[k])) for k in ("target", *kind.detail) if line.get(k) is not None]
        when = f"{a:.3f} s" + ("" if b is None else f" to {b:.3f} s")
        fault_rows.append([("fault", kind_name), ("when", when), *detail])
        i = len(fault_rows) - 1
        if b is not None:
            svg.append(
                f'<rect class="fault" data-fault="{i}" data-kind="{esc(kind_name)}" x="{x(a)}" y="{plot_top}" '
                f'width="{max(x(b) - x(a), 1.5)}" height="{plot_bottom - plot_top}" fill="{kind.color}" '
                'fill-opacity="0.18"/>'
            )
        else:
            svg.append(
                f'<line class="fault" data-fault="{i}" data-kind="{esc(kind_name)}" x1="{x(a)}" x2="{x(a)}" '
                f'y1="{plot_top}" y2="{plot_bottom}" stroke="{kind.color}" stroke-width="2" '
                'stroke-dasharray="4 3"/>'
            )
    passes: dict[tuple[str, int, int], list[Operation]] = defaultdict(list)
    for o in drawn:
        if o.token is not None:
            passes[(str(o.workflow), o.token, int(o.invoke["pid"]))].append(o)
    for (wf, tok, _pid), pass_ops in passes.items():
        a = min(o.start for o in pass_ops)
        b = max(o.end if o.complete else o.start for o in pass_ops)
        who = str(pass_ops[0].invoke.get("process"))
        svg.append(
            f'<line class="pass" data-worker="{esc(who)}" data-workflow="{esc(wf)}" '
            f'x1="{x((a - t0) / 1e9)}" x2="{x((b - t0) / 1e9)}" y1="{y(wf, tok)}" y2="{y(wf, tok)}" '
            f'stroke="{color[who]}" stroke-opacity="0.35" stroke-width="2"/>'
        )
    op_rows: list[list[tuple[str, str]]] = []
    marks: list[str] = []
    # the longest first, so a short operation is drawn on top and stays within reach of the mouse
    for o in sorted(drawn, key=lambda o: -(o.end - o.start)):
        wf, who = str(o.workflow), str(o.invoke.get("process"))
        a = (o.start - t0) / 1e9
        b = (end - t0) / 1e9 if o.complete is None else (o.end - t0) / 1e9
        op_rows.append(_op_rows(o, t0))
        cy = y(wf, o.token)
        dash = ' stroke="#000" stroke-dasharray="2 2" stroke-width="0.8"' if o.complete is None else ""
        attrs = f'data-worker="{esc(who)}" data-workflow="{esc(wf)}"'
        svg.append(
            f'<rect class="op" data-i="{len(op_rows) - 1}" data-f="{esc(o.f)}" {attrs} '
            f'data-outcome="{esc(o.outcome)}" x="{x(a)}" y="{cy - 4}" width="{max(x(b) - x(a), 3)}" '
            f'height="8" fill="{color[who]}"{dash}/>'
        )
        if o.outcome == "fenced":
            px, py = x(b), cy
            marks.append(
                f'<path class="fenced" {attrs} data-x="{px}" d="M{px - 4} {py - 4}L{px + 4} {py + 4}M{px - 4} {py + 4}'
                f'L{px + 4} {py - 4}" stroke="#d00" stroke-width="2" pointer-events="none"/>'
            )
        if o.invoke.get("op") in offending:
            marks.append(
                f'<text class="violation" {attrs} x="{x(b)}" y="{cy + 5}" text-anchor="middle" '
                'font-size="16" pointer-events="none">&#9733;</text>'
            )
    svg += marks
    for t in _ticks(span):
        svg.append(
            f'<line x1="{x(t)}" x2="{x(t)}" y1="{plot_bottom}" y2="{plot_bottom + 4}" stroke="#333"/>'
            f'<text x="{x(t)}" y="{plot_bottom + 16}" text-anchor="middle" font-size="11">{t:g}</text>'
        )
    svg.append(
        f'<text x="{left + _PLOT_WIDTH / 2}" y="{plot_bottom + 31}" text-anchor="middle" font-size="12">'
        "seconds since start</text>"
    )
    # the axis title sits above the lane labels, horizontal: rotated, a long one overran a short plot
    title = f"workflow ({common}...)" if common else "workflow"
    svg.append(f'<text x="4" y="{_TOP - 6}" font-size="12" font-weight="bold">{esc(title)}</text>')
    legend = [f'<span class="key"><i style="background:{color[n]}"></i>{esc(n)}</span>' for n in names]
    for name in fault_kinds_seen(ops):
        kind = kinds()[name]
        shape = "" if kind.window else ' class="instant"'
        legend.append(f'<span class="key"><i{shape} style="background:{kind.color}"></i>{esc(name)}</span>')
    if any(o.outcome == "fenced" for o in drawn):
        legend.append('<span class="key"><b style="color:#d00">&#10005;</b> fenced write</span>')
    if any(o.complete is None for o in drawn):
        legend.append('<span class="key"><i class="open"></i>no complete (indeterminate)</span>')
    if marks and any("violation" in m for m in marks):
        legend.append('<span class="key">&#9733; named by a failing check</span>')
    options = "".join(f'<option value="{esc(n)}">{esc(n)}</option>' for n in names)
    wf_options = "".join(f'<option value="{esc(w)}">{esc(w)}</option>' for w in lanes)
    note = []
    if len(wfs) > len(lanes):
        note.append(f"the first {len(lanes)} of {len(wfs)} workflows drawn")
    if dropped:
        note.append(f"the {dropped} longest operations left out")
    data = json.dumps({"ops": op_rows, "faults": fault_rows}).replace("</", "<\\/")
    return (
        '<div id="timeline-box"><p class="controls">'
        f'<label>worker <select id="tl-worker"><option value="">all</option>{options}</select></label> '
        f'<label>workflow <select id="tl-workflow"><option value="">all</option>{wf_options}</select></label> '
        '<label>zoom <select id="tl-zoom"><option value="1">1x</option><option value="4">4x</option>'
        '<option value="16">16x</option></select></label> '
        "<small>hover an operation for its call, result and worker; reads (load, history) are not "
        f"drawn{'; ' + '; '.join(note) if note else ''}</small></p>"
        '<div class="scroll">'
        f'<svg id="timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'data-left="{left}" data-plot="{_PLOT_WIDTH}" '
        f'viewBox="0 0 {width} {height}" font-family="system-ui,sans-serif">{"".join(svg)}</svg></div>'
        f'<p class="legend">{"".join(legend)}</p></div>'
        '<div id="tip" hidden></div>'
        f'<script type="application/json" id="timeline-data">{data}</script>'
        f"<script>{_SCRIPT}</script>"
    )


STYLE = """#timeline{max-width:100%;height:auto;border:1px solid #ddd}.scroll{overflow-x:auto}
#tip hr{border:0;border-top:1px solid #ccc;margin:3px 0}#tip p{margin:2px 0}
#tip{position:fixed;z-index:10;background:#fffff0;border:1px solid #888;padding:4px 6px;font-size:12px;
max-width:560px;box-shadow:2px 2px 6px rgba(0,0,0,.2);pointer-events:none}
#tip table{margin:0}#tip th,#tip td{border:0;padding:1px 4px;font-size:12px;word-break:break-all}#tip th{white-space:nowrap}
.legend .key{margin-right:1.2em;white-space:nowrap;font-size:13px}
.legend i{display:inline-block;width:14px;height:10px;margin-right:4px;vertical-align:middle}
.legend i.instant{width:3px}.legend i.open{border:1px dashed #000}
.controls label{margin-right:1em}"""
"""The timeline's CSS, for the report's ``<style>``."""
