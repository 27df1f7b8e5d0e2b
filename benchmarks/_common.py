"""What every benchmark shares: the report folder, the machine's state, servers, fresh Postgres
schemas, tables printed and saved, plots, and the duplicate/loss check."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parent.parent
WORKERS = (1, 2, 4, 8, 16)
T = TypeVar("T")


def report_dir(given: str | None) -> Path:
    """``given``, or a new ``reports/bench/<UTC time>/``."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = Path(given) if given else ROOT / "reports" / "bench" / stamp
    path.mkdir(parents=True, exist_ok=True)
    return path


def parser(description: str) -> argparse.ArgumentParser:
    """The arguments every benchmark takes."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out", help="report folder (default: a new reports/bench/<time>/)")
    p.add_argument("--quick", action="store_true", help="a short run for development")
    return p


def machine() -> dict[str, Any]:
    """What was running and how busy the machine was: figures on a shared box need this beside them."""
    load = os.getloadavg()
    info: dict[str, Any] = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "loadavg": [round(x, 2) for x in load],
    }
    for tool in ("pgbench", "redis-benchmark"):
        with contextlib.suppress(Exception):
            out = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=10)
            info[tool] = (out.stdout or out.stderr).strip().splitlines()[0]
    return info


def save_json(folder: Path, name: str, data: Any) -> Path:
    path = folder / f"{name}.json"
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    return path


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A Markdown table (it also reads well printed)."""
    cells = [[str(h) for h in headers], *[[fmt(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value >= 100:
            return f"{value:,.0f}"
        if value >= 1:
            return f"{value:.2f}"
        return f"{value:.3f}"
    return str(value)


def ratio(a: float | None, b: float | None) -> float | None:
    return None if not a or not b else a / b


def check_exactly_once(name: str, expected: Iterable[str], got: Iterable[str]) -> dict[str, int]:
    """Count lost and duplicated items: every expected item must come back exactly once."""
    want = Counter(expected)
    seen = Counter(got)
    lost = sum(1 for k in want if seen[k] == 0)
    dup = sum(n - 1 for n in seen.values() if n > 1)
    extra = sum(1 for k in seen if k not in want)
    return {"lost": lost, "duplicated": dup, "unexpected": extra}


class Stopwatch:
    def __enter__(self) -> Stopwatch:
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.start


@contextlib.contextmanager
def servers(*kinds: str) -> Iterator[dict[str, Any]]:
    """The servers of the store kits asked for (``postgres``, ``redis``, ...), private instances with
    shipped durability settings (see each kit's server recipe)."""
    from without_durability.testing.kit import find_kit

    with contextlib.ExitStack() as stack:
        yield {k: stack.enter_context(find_kit(k).server()) for k in kinds}


async def postgres_settings(url: str) -> dict[str, str]:
    """The durability settings the server really runs with, recorded beside the figures."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        out = {}
        for name in ("fsync", "synchronous_commit", "wal_sync_method", "full_page_writes", "server_version"):
            row = await (await conn.execute(f"SHOW {name}")).fetchone()
            out[name] = row[0] if row else "?"
    return out


def plot(folder: Path, name: str, title: str, xlabel: str, ylabel: str,
         series: dict[str, tuple[Sequence[float], Sequence[float | None]]], *, logx: bool = False,
         logy: bool = False) -> Path:
    """One line per series, saved as ``<name>.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    colors = plt.get_cmap("tab20").colors
    for i, (label, (xs, ys)) in enumerate(series.items()):
        pts = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None]
        if pts:  # 20 colours, and a second line style past them, so no two series look alike
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label,
                    color=colors[i % 20], linestyle="-" if i < 20 else "--")
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = folder / f"{name}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


async def timed_on(conns: Sequence[Any], one: Any) -> float:
    """Run ``one(conn)`` on every connection at once and return the wall seconds it took; the
    connections are closed afterwards, whatever happened (the raw-driver rows of take and append)."""
    import asyncio

    try:
        start = time.perf_counter()
        await asyncio.gather(*(one(c) for c in conns))
        return time.perf_counter() - start
    finally:
        for c in conns:
            await c.close()


async def on_uvloop(make: Callable[[], Awaitable[T]]) -> T:
    """``make()`` run to its end on a uvloop event loop in a thread of its own (the caller's loop
    idle meanwhile): the opt-in loop's figures, measured beside the default loop's."""
    import asyncio

    import uvloop

    async def run() -> T:
        return await make()

    return await asyncio.to_thread(uvloop.run, run())


def uvloop_wanted(flag: bool | None) -> bool:
    """``--uvloop`` if given, else ``WD_BENCH_UVLOOP`` set to anything but 0."""
    return flag if flag is not None else os.environ.get("WD_BENCH_UVLOOP", "") not in ("", "0")


def write_summary(folder: Path, name: str, text: str) -> Path:
    path = folder / f"{name}.md"
    path.write_text(text.rstrip() + "\n")
    return path
