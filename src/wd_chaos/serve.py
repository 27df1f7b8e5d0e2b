"""``wd-chaos serve``: browse stored runs in a web browser (Jepsen's ``lein run serve``).

An index at ``/`` of every run folder under a directory (one holding a ``summary.json``), with
filters by verdict, scenario and store; each run's files under ``/runs/<folder>/`` (its report
first); and ``/zip/<folder>.zip``, the whole run folder as one download. Standard library only
(``http.server``), bound to 127.0.0.1 unless ``--host`` says otherwise: it serves files from disk
to the person running it, nothing more; a zip never follows a symbolic link. Every page works offline: no CDN, the filters are a few lines of inline JavaScript.
"""

from __future__ import annotations

import html
import json
import mimetypes
import os
import re
import shutil
import socket
import tempfile
import zipfile
from dataclasses import dataclass
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import click

_STAMP = re.compile(r"^(\d{8}T\d{6})")
"""A run folder's name starts with its start time (``20261203T125023-lease-stall-sqlite``)."""

_TEXT = {".jsonl": "text/plain; charset=utf-8", ".log": "text/plain; charset=utf-8"}
"""Types ``mimetypes`` does not know, chosen so a browser shows the file rather than saving it."""


@dataclass(frozen=True)
class StoredRun:
    """One run folder as the index lists it: read from its ``summary.json``."""

    path: str
    """The folder relative to the served directory, with ``/`` separators."""
    scenario: str
    store: str
    seed: object
    verdict: str
    """``VALID``, ``INVALID``, ``UNKNOWN``, ``EXPECTED`` (the loss its scenario exists to show), or
    ``INTERRUPTED`` (stopped before its verdict)."""
    started: str
    """When the run started (UTC, ``YYYY-MM-DD HH:MM:SS``), or empty when not known."""
    seconds: object
    coverage: str
    """The dangerous windows the run reached, ``name count`` each, or empty."""
    mutant: str
    shrink: str = ""
    """For a shrink's candidate run: its shrink's folder (relative, ``/`` separators); else empty."""


def _shrink_of(folder: Path, root: Path) -> str:
    """The shrink folder (one holding ``shrink.json``, or named ``*-shrink-*``) a candidate run
    lies under (``SHRINK/runs/RUN``), relative to ``root``; empty for any other run."""
    parent = folder.parent
    if parent.name == "runs" and parent.parent != root.parent:
        shrink = parent.parent
        if (shrink / "shrink.json").is_file() or "-shrink-" in shrink.name:
            return shrink.relative_to(root).as_posix() if shrink != root else "."
    return ""


def _verdict(summary: dict[str, Any]) -> str:
    if summary.get("expected"):  # the loss the scenario exists to show: a pass, not a failure
        return "EXPECTED"
    valid = summary.get("valid")
    return "VALID" if valid is True else "INVALID" if valid is False else "UNKNOWN"


def _started(folder: Path, summary: dict[str, Any]) -> str:
    stamp = _STAMP.match(folder.name)
    if stamp:
        when = datetime.strptime(stamp.group(1), "%Y%m%dT%H%M%S").replace(tzinfo=UTC)
        return when.strftime("%Y-%m-%d %H:%M:%S")
    analyzed = summary.get("analyzed_at")
    try:
        return datetime.fromisoformat(str(analyzed)).strftime("%Y-%m-%d %H:%M:%S") if analyzed else ""
    except ValueError:
        return ""


def stored_runs(root: Path) -> list[StoredRun]:
    """Every run folder under ``root`` (at any depth), newest first: finished ones (``summary.json``)
    and interrupted ones (``INTERRUPTED`` beside ``run.json``). A file that cannot be read or is not
    a run's (the mutant gate writes a ``summary.json`` of its own) is left out."""
    runs = []
    found_runs = [(f.parent, f) for f in root.rglob("summary.json")]
    # a run stopped before its verdict: what was run (run.json) is known, the verdict is not
    found_runs += [
        (f.parent, f.parent / "run.json")
        for f in root.rglob("INTERRUPTED")
        if not (f.parent / "summary.json").exists() and (f.parent / "run.json").is_file()
    ]
    for folder, found in found_runs:
        try:
            summary = json.loads(found.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(summary, dict) or "scenario" not in summary:
            continue
        if found.name == "summary.json" and "verdicts" not in summary:
            continue
        interrupted = found.name == "run.json"
        coverage = summary.get("coverage") or {}
        runs.append(
            StoredRun(
                path=folder.relative_to(root).as_posix(),
                scenario=str(summary.get("scenario", "")),
                store=str(summary.get("store", "")),
                seed=summary.get("seed"),
                verdict="INTERRUPTED" if interrupted else _verdict(summary),
                started=_started(folder, summary),
                seconds=summary.get("wall_seconds"),
                coverage=", ".join(f"{k} {v}" for k, v in coverage.items())
                if isinstance(coverage, dict)
                else str(coverage),
                mutant=str(summary.get("mutant") or ""),
                shrink=_shrink_of(folder, root),
            )
        )
    return sorted(runs, key=lambda r: (r.started, r.path), reverse=True)


_PAGE_STYLE = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;font-size:14px;
text-align:left}.VALID{background:#d8f3dc}.INVALID{background:#ffccd5;font-weight:bold}
.UNKNOWN{background:#fff3b0}.EXPECTED{background:#cfe2ff}.INTERRUPTED{background:#e9ecef}label{margin-right:1.5em}.none{color:#666}
th.sortable{cursor:pointer}th[data-sorted=up]::after{content:" \\25B2"}th[data-sorted=down]::after{content:" \\25BC"}"""

_FILTER_JS = """(function(){
const sel=[...document.querySelectorAll('select[data-col]')];
const rows=[...document.querySelectorAll('#runs tbody tr')];
function apply(){let shown=0;for(const r of rows){
  const ok=sel.every(s=>!s.value||r.dataset[s.dataset.col]===s.value);
  r.hidden=!ok;if(ok)shown++;}
  document.getElementById('shown').textContent=shown+' of '+rows.length+' runs shown';}
sel.forEach(s=>s.addEventListener('change',apply));apply();
const body=document.querySelector('#runs tbody');
document.querySelectorAll('#runs thead th').forEach((th,i)=>{th.classList.add('sortable');
  th.addEventListener('click',()=>{const up=th.dataset.sorted!=='up';
    document.querySelectorAll('#runs thead th').forEach(h=>delete h.dataset.sorted);th.dataset.sorted=up?'up':'down';
    const key=r=>r.cells[i].textContent.trim();
    const sorted=[...body.rows].sort((a,b)=>{const x=key(a),y=key(b),nx=parseFloat(x),ny=parseFloat(y);
      const c=(!isNaN(nx)&&!isNaN(ny))?nx-ny:x.localeCompare(y);return up?c:-c;});
    sorted.forEach(r=>body.appendChild(r));});});})();"""


_HEAD = (
    "<tr><th>run</th><th>scenario</th><th>store</th><th>seed</th><th>verdict</th>"
    "<th>started (UTC)</th><th>seconds</th><th>coverage</th><th>download</th></tr>"
)


def index_page(root: Path) -> str:
    """The index: one row per stored run, and a filter per verdict, scenario and store."""
    esc = html.escape
    runs = stored_runs(root)

    def select(col: str, label: str, values: set[str]) -> str:
        options = "".join(f'<option value="{esc(v)}">{esc(v)}</option>' for v in sorted(values))
        return (
            f'<label>{label} <select id="filter-{col}" data-col="{col}">'
            f'<option value="">all</option>{options}</select></label>'
        )

    def row(r: StoredRun) -> str:
        link = "/runs/" + quote(r.path) + ("/INTERRUPTED" if r.verdict == "INTERRUPTED" else "/report.html")
        mutant = f" <small>(mutant {esc(r.mutant)})</small>" if r.mutant else ""
        return (
            f'<tr data-verdict="{esc(r.verdict)}" data-scenario="{esc(r.scenario)}" '
            f'data-store="{esc(r.store)}"><td><a href="{esc(link)}">{esc(r.path)}</a></td>'
            f"<td>{esc(r.scenario)}{mutant}</td><td>{esc(r.store)}</td><td>{esc(str(r.seed))}</td>"
            f'<td class="{r.verdict}">{r.verdict}</td><td>{esc(r.started)}</td>'
            f"<td>{esc(str(r.seconds if r.seconds is not None else ''))}</td>"
            f"<td>{esc(r.coverage) or '<span class=none>none named</span>'}</td>"
            f'<td><a href="/zip/{esc(quote(r.path))}.zip" download>zip</a></td></tr>'
        )

    rows = [row(r) for r in runs if not r.shrink]
    # a shrink's candidate runs are its working, not runs of their own: listed under it
    grouped: dict[str, list[StoredRun]] = {}
    for r in runs:
        if r.shrink:
            grouped.setdefault(r.shrink, []).append(r)
    shrinks = "".join(
        f'<details class="shrink"><summary>shrink <a href="/runs/{esc(quote(folder))}/report.md">'
        f"{esc(folder)}</a>: {len(candidates)} candidate run(s)</summary>"
        f'<table class="candidates"><thead>{_HEAD}</thead><tbody>{"".join(row(c) for c in candidates)}'
        "</tbody></table></details>"
        for folder, candidates in sorted(grouped.items(), reverse=True)
    )
    if shrinks:
        shrinks = "<h2>Shrinks</h2>" + shrinks
    filters = " ".join(
        [
            select("verdict", "verdict", {"VALID", "INVALID", "UNKNOWN", "EXPECTED", "INTERRUPTED"}),
            select("scenario", "scenario", {r.scenario for r in runs}),
            select("store", "store", {r.store for r in runs}),
        ]
    )
    latest = (
        '<p><a id="latest" href="/latest">the latest run</a></p>' if any(not r.shrink for r in runs) else ""
    )
    empty = "" if runs else f"<p>no stored runs under {esc(str(root))} (run <code>wd-chaos run</code>)</p>"
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>wd-chaos runs</title>
<style>{_PAGE_STYLE}</style></head><body><h1>wd-chaos runs</h1>
<p>under <code>{esc(str(root))}</code></p>{empty}{latest}
<p>{filters} <span id="shown"></span></p>
<table id="runs"><thead>{_HEAD}</thead>
<tbody>{"".join(rows)}</tbody></table>
{shrinks}
<script>{_FILTER_JS}</script></body></html>"""


def _plain_files(folder: Path) -> list[Path]:
    """Every regular file under ``folder``, sorted, never through a symbolic link: a link (to a
    file or a folder) may point outside the served root, and the zip must not ship what the file
    route refuses."""
    found = []
    for here, dirs, names in os.walk(folder, followlinks=False):
        dirs[:] = [d for d in dirs if not (Path(here) / d).is_symlink()]
        for name in names:
            path = Path(here) / name
            if not path.is_symlink() and path.is_file():
                found.append(path)
    return sorted(found)


class _Handler(BaseHTTPRequestHandler):
    """Serves the index, a run's files and a run's zip from ``server.root``; nothing outside it."""

    server: _Server
    _head = False

    def do_GET(self) -> None:
        """Answer one GET: ``/``, ``/runs/<folder>/<file>`` or ``/zip/<folder>.zip``."""
        path = unquote(urlsplit(self.path).path)
        if path in ("/", "/index.html"):
            self._send(HTTPStatus.OK, "text/html; charset=utf-8", index_page(self.server.root).encode())
        elif path.startswith("/runs/"):
            self._file(path[len("/runs/") :])
        elif path == "/latest":
            newest = next((r for r in stored_runs(self.server.root) if not r.shrink), None)
            if newest is None:
                self._error(HTTPStatus.NOT_FOUND, "no stored runs")
            else:
                end = "/INTERRUPTED" if newest.verdict == "INTERRUPTED" else "/report.html"
                self._redirect("/runs/" + quote(newest.path) + end, HTTPStatus.FOUND)
        elif path.startswith("/zip/") and path.endswith(".zip"):
            self._zip(path[len("/zip/") : -len(".zip")])
        else:
            self._error(HTTPStatus.NOT_FOUND, f"no page at {path}")

    def do_HEAD(self) -> None:
        """Answer a HEAD as the GET would, headers only."""
        self._head = True
        self.do_GET()

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: a browser's requests are not worth a line each on the terminal."""

    def _inside(self, rel: str) -> Path | None:
        # resolve() follows '..' and symlinks: what is left must still lie under the root
        root = self.server.root.resolve()
        try:
            target = (root / rel.lstrip("/")).resolve()
        except (OSError, ValueError):  # a NUL byte, a symlink loop
            return None
        return target if target == root or target.is_relative_to(root) else None

    def _file(self, rel: str) -> None:
        target = self._inside(rel)
        if target is None:
            self._error(HTTPStatus.FORBIDDEN, "outside the served folder")
            return
        if target.is_dir():
            if not self.path.split("?")[0].endswith("/"):
                self._redirect(self.path.split("?")[0] + "/")
                return
            target = target / "report.html"
        if not target.is_file():
            self._error(HTTPStatus.NOT_FOUND, f"no file {rel}")
            return
        kind = _TEXT.get(target.suffix) or mimetypes.guess_type(target.name)[0] or "application/octet-stream"
        if kind.startswith("text/") and "charset" not in kind:
            kind += "; charset=utf-8"
        self._send(HTTPStatus.OK, kind, target.read_bytes())

    def _zip(self, rel: str) -> None:
        folder = self._inside(rel)
        if folder is None:
            self._error(HTTPStatus.FORBIDDEN, "outside the served folder")
            return
        if not any((folder / name).is_file() for name in ("summary.json", "INTERRUPTED")):
            self._error(HTTPStatus.NOT_FOUND, f"no run folder {rel}")
            return
        # spooled to disk past 16 MB: a run's store file can be large
        with tempfile.SpooledTemporaryFile(max_size=16 << 20) as buf:
            with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
                for f in _plain_files(folder):
                    zf.write(f, Path(folder.name) / f.relative_to(folder))
            size = buf.tell()
            buf.seek(0)
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", "application/zip")
            self.send_header("Content-Length", str(size))
            self.send_header("Content-Disposition", f'attachment; filename="{folder.name}.zip"')
            self.end_headers()
            if not self._head:
                shutil.copyfileobj(buf, self.wfile)

    def _send(self, status: HTTPStatus, kind: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if not self._head:
            self.wfile.write(body)

    def _redirect(self, to: str, status: HTTPStatus = HTTPStatus.MOVED_PERMANENTLY) -> None:
        self.send_response(status)
        self.send_header("Location", to)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _error(self, status: HTTPStatus, why: str) -> None:
        self._send(status, "text/plain; charset=utf-8", f"{status.value} {status.phrase}: {why}\n".encode())


LOCAL = "127.0.0.1"
"""Where ``serve`` listens unless told otherwise: this machine only."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root: Path, port: int, host: str = LOCAL) -> None:
        self.root = root
        if ":" in host:  # an IPv6 address
            self.address_family = socket.AF_INET6
        super().__init__((host, port), _Handler)


def make_server(root: Path, port: int = 0, host: str = LOCAL) -> ThreadingHTTPServer:
    """A server for the runs under ``root`` on ``host`` (default 127.0.0.1; ``port`` 0: a free
    one), not yet serving."""
    return _Server(root, port, host)


@click.command("serve")
@click.argument(
    "directory",
    required=False,
    default=Path("reports"),
    type=click.Path(file_okay=False, path_type=Path),
)
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True,
              help="The port to listen on (0: a free one).")  # fmt: skip
@click.option("--host", default=LOCAL, show_default=True, metavar="ADDRESS",
              help="The address to listen on. Anything but 127.0.0.1 (or ::1) lets other machines "
              "read every run's files: a warning says so.")  # fmt: skip
def serve_command(directory: Path, port: int, host: str) -> None:
    """Browse the runs stored under DIRECTORY (default ``reports``): an index with filters, each
    run's report, a zip of each run folder, /latest for the newest run; a shrink's candidate runs
    are listed under their shrink. Prints the URL on one line; Ctrl-C stops it."""
    if not directory.is_dir():
        raise click.BadParameter(
            f"{directory} is not a folder (run wd-chaos run first)", param_hint="DIRECTORY"
        )
    try:
        server = make_server(directory, port, host)
    except (OSError, OverflowError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        raise click.BadParameter(f"cannot listen on {host}:{port}: {why}", param_hint="--host/--port") from exc
    if host not in (LOCAL, "localhost", "::1"):
        click.echo(
            f"wd-chaos serve: warning: listening on {host}, not {LOCAL}: anyone who can reach this "
            f"machine on port {server.server_address[1]} can read every run under {directory} "
            "(histories, store files, logs); there is no login",
            err=True,
        )
    shown = f"[{host}]" if ":" in host else host
    with server:
        click.echo(f"serving {directory} at http://{shown}:{server.server_address[1]}/")
        server.serve_forever()
