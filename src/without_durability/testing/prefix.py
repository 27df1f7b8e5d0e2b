"""Monotonic reads, judged from observations: a load never shows a record before one that an
earlier load returned.

For two completed reads of one workflow where the first ended before the second began (real
time), the first's (key, value) sequence must be a prefix of the second's, unless a discard of the
workflow may have taken effect between them. The conformance suite and wd-chaos's
``monotonic-loads`` checker both judge with ``non_prefix``; nothing here knows a store.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

MAX_FRONTIER = 64
"""How many mutually incompatible earlier reads ``non_prefix`` keeps comparing against; only a
history that is already invalid has more than one."""


@dataclass(frozen=True)
class Read:
    """One completed read: when it began and ended (one clock for all reads), and what it returned
    in load order as (key, value) pairs, the values in any comparable form (a digest will do).
    ``label`` is the caller's own handle on it (an operation, a line of history)."""

    start: float
    end: float
    items: tuple[tuple[str, Hashable], ...]
    label: Any = None


@dataclass(frozen=True)
class NonPrefix:
    """``later`` began after ``earlier`` ended, yet ``earlier`` is not a prefix of it: they first
    differ at position ``at``."""

    earlier: Read
    later: Read
    at: int

    @property
    def key(self) -> str | None:
        """The key the later read shows out of place (None when it merely stops short)."""
        return self.later.items[self.at][0] if self.at < len(self.later.items) else None

    def why(self) -> str:
        """One line saying what went wrong, naming the key."""
        mine = self.later.items[self.at] if self.at < len(self.later.items) else None
        theirs = self.earlier.items[self.at] if self.at < len(self.earlier.items) else None
        if mine is None:
            assert theirs is not None
            return f"shows no {theirs[0]!r}, which an earlier read returned at position {self.at}"
        if theirs is None:  # pragma: no cover - a prefix; never reported
            return "is a prefix"
        if mine[0] == theirs[0]:
            return f"shows {mine[0]!r} with another value than an earlier read returned"
        seen = {k for k, _ in self.earlier.items}
        if mine[0] in seen:
            return f"shows {mine[0]!r} at position {self.at}, where an earlier read returned {theirs[0]!r}"
        return (
            f"shows {mine[0]!r} at position {self.at}, before {theirs[0]!r}, which an earlier read "
            "returned there"
        )


def _split(a: Read, b: Read) -> int | None:
    """Where ``a`` stops being a prefix of ``b`` (None: it is one)."""
    n = len(a.items)
    if n <= len(b.items) and b.items[:n] == a.items:
        return None
    for i, (x, y) in enumerate(zip(a.items, b.items, strict=False)):
        if x != y:
            return i
    return len(b.items)


def _sweep(reads: Sequence[Read], later: Sequence[Read]) -> list[NonPrefix]:
    """Each read of ``later`` against every read of ``reads`` that ended before it began, keeping
    only the maximal earlier reads under the prefix order (everything below one is its prefix)."""
    by_end = sorted(reads, key=lambda r: r.end)
    frontier: list[Read] = []
    out: list[NonPrefix] = []
    i = 0
    for b in sorted(later, key=lambda r: r.start):
        while i < len(by_end) and by_end[i].end < b.start:
            a = by_end[i]
            i += 1
            if any(_split(a, m) is None for m in frontier):
                continue
            frontier = [m for m in frontier if _split(m, a) is not None] + [a]
            del frontier[:-MAX_FRONTIER]
        for m in frontier:
            at = _split(m, b)
            if at is not None:
                out.append(NonPrefix(m, b, at))
                break  # one witness per later read
    return out


def non_prefix(reads: Sequence[Read], discards: Sequence[tuple[float, float]] = ()) -> list[NonPrefix]:
    """The reads of one workflow that broke the rule, each once, with an earlier read it
    contradicts. ``discards`` are the (start, end) of every discard of the workflow that may have
    taken effect (an unfinished one ends at infinity): a pair with one between them is exempt."""
    if not discards:
        return _sweep(reads, reads)

    def bound(b: Read) -> float:  # earlier reads must begin after every discard begun before b ended
        return max((end for start, end in discards if start < b.end), default=float("-inf"))

    groups: dict[float, list[Read]] = {}
    for b in reads:
        groups.setdefault(bound(b), []).append(b)
    out: list[NonPrefix] = []
    for floor, later in groups.items():
        out += _sweep([a for a in reads if a.start >= floor], later)
    return out
