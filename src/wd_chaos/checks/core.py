"""What every checker shares: ``Verdict``, ``Operation`` (an invoke joined with its complete),
the helpers the real-time checks use, the ``Checker`` protocol and the ``checker`` decorator."""

from __future__ import annotations

import bisect
import contextlib
import contextvars
import functools
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from .. import wallclock
from ..history import Op, pair
from ..rundir import FinalState

Valid = bool | str
UNKNOWN = "unknown"
MAX_EVIDENCE = 20

WRITES = ("record", "supply", "transact")
FENCED_WRITES = ("record", "transact", "renew")


@dataclass
class Verdict:
    """One checker's answer: ``valid`` is True, False or ``"unknown"``."""

    name: str
    valid: Valid
    summary: str
    evidence: list[dict[str, Any]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The verdict as JSON-ready data."""
        return {
            "name": self.name,
            "valid": self.valid,
            "summary": self.summary,
            "evidence": self.evidence[:MAX_EVIDENCE],
            "evidence_total": len(self.evidence),
            "counts": self.counts,
        }


@dataclass
class Operation:
    """An invoke joined with its complete (None when indeterminate)."""

    invoke: Op
    complete: Op | None
    f: str = field(init=False, repr=False)
    """The operation's name (its invoke line's ``f``)."""
    workflow: str | None = field(init=False, repr=False)
    """The workflow the invoke names (else the complete), or None."""
    token: int | None = field(init=False, repr=False)
    """The token the complete names (else the invoke), or None. These three are plain
    attributes, set once: the checkers read them hundreds of thousands of times a sweep."""

    def __post_init__(self) -> None:
        self.f = str(self.invoke["f"])
        wf = self.invoke.get("workflow")
        if wf is None and self.complete is not None:
            wf = self.complete.get("workflow")
        self.workflow = None if wf is None else str(wf)
        self.token = None
        for line in (self.complete, self.invoke):
            if line is not None and line.get("token") is not None:
                self.token = int(line["token"])
                break

    @property
    def start(self) -> int:
        return int(self.invoke["mono"])

    @property
    def outcome(self) -> str:
        return "unknown" if self.complete is None else str(self.complete["outcome"])

    @property
    def ok(self) -> bool:
        return self.complete is not None and self.complete["outcome"] == "ok"

    @property
    def landed(self) -> bool:
        """Completed ok and, for a fenced write, wrote under its token. A transact that found its
        key recorded returns the stored value (``won`` false) having checked no fence, renewed
        nothing and written nothing, as the contract says, so it is a read here."""
        return self.ok and not (self.f == "transact" and not self.got("won"))

    @property
    def determinate(self) -> bool:
        return self.complete is not None and self.complete["outcome"] != "unknown"

    @property
    def end(self) -> float:
        return float("inf") if self.complete is None else int(self.complete["mono"])

    def got(self, name: str) -> Any:
        return None if self.complete is None else self.complete.get(name)

    def brief(self, why: str = "") -> dict[str, Any]:
        out = {
            k: self.invoke.get(k)
            for k in ("op", "f", "process", "pid", "workflow", "key", "token", "value", "at", "receipt")
            if self.invoke.get(k) is not None
        }
        out["outcome"] = self.outcome
        if self.complete is not None:
            for k in ("value", "won", "key", "token", "workflow", "receipt", "error"):
                if self.complete.get(k) is not None and k not in ("op",):
                    out["got_" + k] = self.complete[k]
        out["invoke_mono"] = self.start
        if self.complete is not None:
            out["complete_mono"] = self.complete["mono"]
        if why:
            out["why"] = why
        return out


def canon(value: object) -> str:
    """Canonical JSON of a value, the comparison the stores' JsonCodec makes."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


class _Prefix:
    """Operations sorted by a time, with the running maximum of a rank: which one, among those
    whose time is below some bound, has the highest rank. Keeps the real-time checks
    O(n log n) rather than comparing every pair."""

    def __init__(self, items: list[tuple[float, Any, Operation]]) -> None:
        items = sorted(items, key=lambda i: i[0])
        self.times = [t for t, _, _ in items]
        self.best: list[tuple[Any, Operation]] = []
        for _, rank, op in items:
            if not self.best or rank > self.best[-1][0]:
                self.best.append((rank, op))
            else:
                self.best.append(self.best[-1])

    def highest_before(self, bound: float) -> tuple[Any, Operation] | None:
        """The highest-ranked operation whose time is strictly below ``bound``."""
        i = bisect.bisect_left(self.times, bound)
        return self.best[i - 1] if i else None


def _inversions(items: list[tuple[Any, Operation]]) -> list[tuple[Operation, Operation]]:
    """Pairs (a, b) where a completed before b was invoked yet a's rank is not below b's."""
    prefix = _Prefix([(op.end, rank, op) for rank, op in items])
    out = []
    for rank, b in items:
        hit = prefix.highest_before(b.start)
        if hit is not None and hit[0] >= rank:
            out.append((hit[1], b))
    return out


def operations(ops: Iterable[Op]) -> list[Operation]:
    """Pair a history's lines into operations (a new list each call, which the caller may sort or
    filter). Inside ``paired_once(ops)`` the pairing of that very list is made once and shared."""
    memo = _PAIRED.get()
    if memo is not None and memo[0] is ops and memo[1] == _shape(ops):
        return list(memo[2])
    return [Operation(p["invoke"], p["complete"]) for p in pair(ops)]


def _shape(ops: Iterable[Op]) -> tuple[int, int, int]:
    """What must not have changed for a memo of ``ops`` to hold: its length and its end lines."""
    lines = ops if isinstance(ops, list) else []
    return (len(lines), id(lines[0]) if lines else 0, id(lines[-1]) if lines else 0)


_PAIRED: contextvars.ContextVar[tuple[list[Op], tuple[int, int, int], list[Operation]] | None] = (
    contextvars.ContextVar("wd_chaos_paired", default=None)
)


@contextlib.contextmanager
def paired_once(ops: list[Op]) -> Iterator[None]:
    """Judge ``ops`` with several checkers, pairing it once: inside this block ``operations(ops)``
    (called with this same list, unchanged in length and end lines) shares one pairing instead of
    pairing anew for each checker. The verdicts are the same; the memo ends with the block.
    Checkers must not change the lines or the ``Operation`` objects they are given (they are pure)."""
    memo = (ops, _shape(ops), [Operation(p["invoke"], p["complete"]) for p in pair(ops)])
    token = _PAIRED.set(memo)
    try:
        yield
    finally:
        _PAIRED.reset(token)


def _final_records(final: FinalState, workflow: str) -> list[list[Any]]:
    return list(final.get("workflows", {}).get(workflow, {}).get("history", []))


def _final_values(final: FinalState, workflow: str) -> dict[str, Any]:
    return {r[0]: r[1] for r in _final_records(final, workflow)}


def _store_steps(ops: list[Op], final: FinalState, *, leases: bool = False) -> list[dict[str, Any]]:
    """The wall-clock steps of this machine that moved the clock the store decided by (its leases'
    clock with ``leases``), or none where the store's clock is not this machine's wall clock."""
    if final.get("store_clock") != "local" or (leases and final.get("lease_clock") != "wall"):
        return []
    steps = final.get("wall_clock_steps")  # ``check`` reads them once for every checker
    return list(steps) if steps is not None else wallclock.steps(ops)


@dataclass
class _Breach:
    """A violation of a time-bound rule: its evidence, and how far a wall-clock step (``ahead`` or
    back) inside ``window`` (monotonic ns) must have moved the store's clock to account for it."""

    evidence: list[dict[str, Any]]
    window: tuple[float, float]
    shortfall_ns: float
    ahead: bool
    also: tuple[tuple[float, float], float] | None = None
    """Another (window, shortfall) that accounts for it just as well: a lease's budget is fixed
    when the pass claims, so a step anywhere after the claim shortens it, not only one after the
    renewal the breach is measured from."""

    def stepped(self, steps: list[dict[str, Any]]) -> bool:
        """Whether steps inside the window (or the ``also`` window) are large enough to account for
        the breach."""
        if not steps:
            return False
        for window, shortfall in (self.window, self.shortfall_ns), *([self.also] if self.also else []):
            if wallclock.jumped(steps, *window, ahead=self.ahead) * 1e9 + SLACK_NS >= shortfall:
                return True
        return False


def _unjudged(
    name: str, what: str, explained: list[dict[str, Any]], steps: list[dict[str, Any]], counts: dict[str, int]
) -> Verdict:
    """Unknown: every violation found lies where this machine's wall clock stepped under a store
    deciding by it, so the run cannot say whether the store is at fault."""
    jumps = ", ".join(f"{s['seconds']:+.3f}s near {s['wall']}" for s in steps)
    return Verdict(
        name,
        UNKNOWN,
        f"{what} where this machine's wall clock stepped ({jumps}); the store decides by that "
        "clock, so this run cannot judge them",
        explained + [{"wall_clock_step": s} for s in steps],
        {**counts, "explained by a wall-clock step": len(explained)},
    )


RENEWING = ("claim", "renew", "record", "transact")
SLACK_NS = 100_000_000
"""Allowance for the gap between a client's clock reading and the store's decision (100 ms)."""


NOT_TESTED = "not tested: the fault did not bite"
"""What a bite check that found no bite says first: the run did not test the store."""


def not_bitten(name: str, valid: Valid, counts: dict[str, int]) -> bool:
    """Whether a verdict (its name, valid and counts, as a ``Verdict`` or its ``as_dict`` has
    them) is a bite check's that found no bite: the store was not tested by the fault."""
    return name.startswith("bite") and valid is not True and valid is not False and counts.get("bit") == 0


CheckFn = Callable[[list[Op], FinalState], "Verdict"]
"""A checker's judgement: a run's history lines and the store's final state in, a verdict out."""


class Checker(Protocol):
    """What a checker is: its ``name`` (what a scenario's ``checks`` lists and a mutant's killer
    ``chaos:<scenario>:<name>`` says) and a call that judges one run's history and final state.
    It must be pure: the same history gives the same verdict."""

    name: str

    def __call__(self, ops: list[Op], final: FinalState) -> Verdict: ...


class Check:
    """A function made a ``Checker`` under ``name``; ``bite`` marks the evidence that a scenario's
    fault touched something (a scenario's ``bite``) rather than a property of the store. The
    registry (``wd_chaos.checks.registry``) finds every ``Check`` defined in a module of this
    package, so a new checker is one new module."""

    def __init__(self, name: str, fn: CheckFn, *, bite: bool = False) -> None:
        functools.update_wrapper(self, fn)
        self.name = name
        self.fn = fn
        self.bite = bite

    def __call__(self, ops: list[Op], final: FinalState) -> Verdict:
        return self.fn(ops, final)

    def __repr__(self) -> str:
        return f"Check({self.name!r}{', bite=True' if self.bite else ''})"


def checker(name: str) -> Callable[[CheckFn], Check]:
    """Decorate a checker function: the registry runs it as check ``name``."""
    return lambda fn: Check(name, fn)


def bite_check(name: str) -> Callable[[CheckFn], Check]:
    """Decorate a bite check: the registry runs it for a scenario whose ``bite`` is ``name``."""
    return lambda fn: Check(name, fn, bite=True)


def overall(verdicts: Iterable[Verdict]) -> Valid:
    """False if any is invalid, else unknown if any is unknown, else True."""
    vs = [v.valid for v in verdicts]
    if False in vs:
        return False
    if UNKNOWN in vs:
        return UNKNOWN
    return True


def exit_code(valid: Valid) -> int:
    """Jepsen's: 0 valid, 1 invalid, 2 unknown."""
    return 0 if valid is True else 1 if valid is False else 2
