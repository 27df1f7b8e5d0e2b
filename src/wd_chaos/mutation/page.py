"""The one HTML page every mutation run writes (``mutants.html``, ``mutate.html``): a title, a line
of figures, then tables whose rows are coloured by verdict. Cells are text, escaped here; ``pre``
and ``code`` mark text to show as written."""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field


class Markup(str):
    """Cell text that is already HTML (made by ``pre`` or ``code``), written as is."""


def pre(text: str) -> Markup:
    """``text`` shown as written (line breaks kept), escaped."""
    return Markup(f"<pre>{html.escape(text)}</pre>")


def code(*lines: str) -> Markup:
    """Each of ``lines`` as code, one under the other, escaped."""
    return Markup("<br>".join(f"<code>{html.escape(line)}</code>" for line in lines))


def _cell(value: object) -> str:
    return value if isinstance(value, Markup) else html.escape(str(value))


@dataclass
class Table:
    """A table: its ``columns``, its ``rows`` (each a verdict, which colours it, and its cells) and
    the ``heading`` above it (none when empty)."""

    columns: Sequence[str]
    rows: Sequence[tuple[str, Sequence[object]]] = field(default_factory=list)
    heading: str = ""


VERDICT_CLASSES = {
    "killed": "good", "passed": "good", "pass": "good",
    "equivalent": "quiet", "skipped": "quiet",
    "not run": "pending",
}  # fmt: skip
"""Which colour a verdict gets: green for what held, grey for what needs no run, yellow for what
was not run; every other verdict (survived, failed, error, FAIL) red."""

STYLE = (
    "body{font:14px system-ui;margin:2em}td,th{border:1px solid #ccc;padding:4px;vertical-align:top}"
    "table{border-collapse:collapse;margin-bottom:1.5em}pre{white-space:pre-wrap;max-width:50em;margin:0}"
    ".good{background:#d4edda}.quiet{background:#e2e3e5}.pending{background:#fff3cd}.bad{background:#f8d7da}"
)


def render(title: str, summary: str, tables: Sequence[Table], *, heading: str = "") -> str:
    """The whole page: ``title`` (and ``heading``, default the title) on top, the ``summary``
    line, then each table."""
    parts = [
        f"<!doctype html><meta charset=utf-8><title>{html.escape(title)}</title><style>{STYLE}</style>",
        f"<h1>{html.escape(heading or title)}</h1>",
        f"<p>{html.escape(summary)}</p>",
    ]
    for table in tables:
        if table.heading:
            parts.append(f"<h2>{html.escape(table.heading)}</h2>")
        head = "".join(f"<th>{html.escape(c)}</th>" for c in table.columns)
        rows = "\n".join(
            f'<tr class="{VERDICT_CLASSES.get(verdict, "bad")}">'
            + "".join(f"<td>{_cell(c)}</td>" for c in cells)
            + "</tr>"
            for verdict, cells in table.rows
        )
        parts.append(f"<table><tr>{head}</tr>\n{rows}</table>")
    return "\n".join(parts) + "\n"
