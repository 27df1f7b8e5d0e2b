"""Steps of the wall clock during a run, read off the history.

Every history line carries two clocks read one after the other: ``mono`` (the system-wide monotonic
clock, what the checkers order operations by) and ``wall``. Their difference is constant on a
healthy machine, drifting by at most NTP's slew. A step (NTP stepping, an operator, a virtual machine
resumed from a snapshot) changes it at once. A store whose leases run on the wall clock, as a
server's ``now()`` or ``TIME`` does, grants a claim early across a forward step; the checkers use
these steps to say so instead of blaming the store.

A thread preempted between the two reads makes one line's difference too large, never too small, so
the floor of each window of lines is the true offset: a step is a change of that floor between two
adjacent windows. A line whose difference is on the near side of the midpoint between the two floors
was certainly read before a forward step (or after a backward one), which bounds when it happened.
"""

from __future__ import annotations

import itertools
from datetime import datetime
from typing import Any

from .history import Op

WINDOW_NS = 500_000_000
"""Lines are grouped into windows of this much monotonic time (0.5 s)."""

STEP_NS = 20_000_000
"""A change of the offset floor larger than this (20 ms) between adjacent windows is a step."""


def _offset(line: Op) -> int | None:
    try:
        wall = datetime.fromisoformat(str(line["wall"]))
        return round(wall.timestamp() * 1e9) - int(line["mono"])
    except (KeyError, TypeError, ValueError):
        return None


def steps(ops: list[Op]) -> list[dict[str, Any]]:
    """The wall-clock steps in ``ops``, each with ``seconds`` (positive: the wall clock jumped
    ahead), ``wall`` (a wall time just after it) and ``between``: monotonic times ``[lo, hi]`` the
    step happened strictly between."""
    lines = sorted(
        ((int(o["mono"]), off, str(o["wall"])) for o in ops if (off := _offset(o)) is not None),
        key=lambda line: line[0],
    )
    windows: list[list[tuple[int, int, str]]] = []
    for line in lines:
        if windows and windows[-1][0][0] // WINDOW_NS == line[0] // WINDOW_NS:
            windows[-1].append(line)
        else:
            windows.append([line])
    found = []
    for before, after in itertools.pairwise(windows):
        low, high = min(o for _, o, _ in before), min(o for _, o, _ in after)
        if abs(high - low) <= STEP_NS:
            continue
        middle = (low + high) / 2
        if high > low:  # ahead: after the last line of ``before`` still on the old offset
            lo = max(m for m, o, _ in before if o < middle)
            hi, wall = after[0][0], after[0][2]
        else:  # back: before the first line of ``after`` already on the new offset
            lo = before[-1][0]
            hi, wall = next((m, w) for m, o, w in after if o < middle)
        found.append({"seconds": (high - low) / 1e9, "wall": wall, "between": [lo, hi]})
    return found


def jumped(found: list[dict[str, Any]], start: float, end: float, *, ahead: bool = True) -> float:
    """How far the wall clock may have jumped ahead (``ahead``) or back, in all, between monotonic
    times ``start`` and ``end``: the size in seconds (never negative) of every step in that
    direction that could lie inside them."""
    return sum(
        abs(float(s["seconds"]))
        for s in found
        if (s["seconds"] > 0) == ahead and s["between"][0] < end and s["between"][1] > start
    )
