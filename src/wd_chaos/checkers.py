"""Checkers: pure functions over a history and the store's final state.

Each returns a ``Verdict``: ``valid`` True, False or ``"unknown"``, a one-line summary, and the
operations that prove it (evidence). A checker that crashes yields unknown, never valid. Operations
whose process died before completing them are indeterminate: they may or may not have happened, so
a checker may use them to explain what it sees but never counts them as failures.

Times: ``mono`` is the system-wide monotonic clock in nanoseconds, comparable across the processes
of one machine; "A completed before B was invoked" is the real-time order the checkers rely on.
A store that decides by this machine's wall clock (``final["store_clock"] == "local"``: record
stamps, queue times, and leases too where ``final["lease_clock"] == "wall"``) cannot keep those
decisions across a step of that clock, so a violation that a wall-clock step seen in the history
(``wallclock``) accounts for makes the verdict unknown, with the step as evidence, never valid.
"""

from __future__ import annotations

import bisect
import itertools
import json
import traceback
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from . import wallclock
from .history import Op, pair

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

    @property
    def f(self) -> str:
        return str(self.invoke["f"])

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
    def start(self) -> int:
        return int(self.invoke["mono"])

    @property
    def end(self) -> float:
        return float("inf") if self.complete is None else int(self.complete["mono"])

    @property
    def workflow(self) -> str | None:
        wf = self.invoke.get("workflow")
        if wf is None and self.complete is not None:
            wf = self.complete.get("workflow")
        return None if wf is None else str(wf)

    @property
    def token(self) -> int | None:
        for line in (self.complete, self.invoke):
            if line is not None and line.get("token") is not None:
                return int(line["token"])
        return None

    def got(self, name: str) -> Any:
        return None if self.complete is None else self.complete.get(name)

    def brief(self, why: str = "") -> dict[str, Any]:
        out = {
            k: self.invoke.get(k)
            for k in ("op", "f", "process", "pid", "workflow", "key", "token", "value")
            if self.invoke.get(k) is not None
        }
        out["outcome"] = self.outcome
        if self.complete is not None:
            for k in ("value", "won", "key", "token", "error"):
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
    """Pair a history's lines into operations."""
    return [Operation(p["invoke"], p["complete"]) for p in pair(ops)]


def _final_records(final: dict[str, Any], workflow: str) -> list[list[Any]]:
    return list(final.get("workflows", {}).get(workflow, {}).get("history", []))


def _final_values(final: dict[str, Any], workflow: str) -> dict[str, Any]:
    return {r[0]: r[1] for r in _final_records(final, workflow)}


# -- fencing --------------------------------------------------------------------------------------


def fencing(ops: list[Op], final: dict[str, Any]) -> Verdict:
    """No write (record, transact, renew) by a pass lands once a claim with a higher token has
    completed; claim tokens are unique and grow in real-time order; a write refused as Fenced had a
    newer claim to be refused by."""
    operations_ = operations(ops)
    claims: dict[str, list[Operation]] = defaultdict(list)
    maybe_claims: dict[str, list[Operation]] = defaultdict(list)
    for o in operations_:
        if o.f == "claim" and o.workflow is not None:
            if o.ok:
                claims[o.workflow].append(o)
            elif not o.determinate:
                maybe_claims[o.workflow].append(o)
    bad: list[dict[str, Any]] = []
    for _wf, cs in claims.items():
        seen: dict[int, Operation] = {}
        for c in cs:
            t = c.token
            if t is None:
                continue
            if t in seen:
                bad += [
                    seen[t].brief("same token issued twice"),
                    c.brief("same token issued twice"),
                ]
            seen[t] = c
        for a, b in _inversions([(c.token or 0, c) for c in cs]):
            bad += [a.brief("earlier claim"), b.brief("later claim got a token not above it")]
    by_end = {wf: _Prefix([(c.end, c.token or 0, c) for c in cs]) for wf, cs in claims.items()}
    by_start = {wf: _Prefix([(c.start, c.token or 0, c) for c in cs]) for wf, cs in claims.items()}
    first_maybe = {wf: min(c.start for c in cs) for wf, cs in maybe_claims.items()}
    writes = refused = landed = 0
    for w in operations_:
        if w.f not in FENCED_WRITES or w.workflow is None or w.token is None:
            continue
        writes += 1
        if w.landed:
            landed += 1
            done = by_end[w.workflow].highest_before(w.start) if w.workflow in by_end else None
            if done is not None and done[0] > w.token:
                bad += [
                    w.brief(f"write with superseded token {w.token} was accepted"),
                    done[1].brief(f"claim with token {done[0]} had completed before it"),
                ]
        elif w.outcome == "fenced":
            refused += 1
            began = by_start[w.workflow].highest_before(w.end) if w.workflow in by_start else None
            newer = began is not None and began[0] > w.token
            unsure = first_maybe.get(w.workflow, float("inf")) < w.end
            if not newer and not unsure:
                bad.append(w.brief("refused as Fenced, but no newer claim was invoked before it"))
    steps = _store_steps(ops, final, leases=True)
    from .clockstep import lease_steps

    # a step this run made itself, of a known size and moment, on the clock the leases run on:
    # the lapse is the step's doing, and the fence (not the lease) is what safety rests on
    injected = lease_steps(ops, final)
    explained: list[dict[str, Any]] = []
    caused: list[dict[str, Any]] = []
    for breach in _exclusive(operations_, claims) + _budget_ends(operations_, claims, maybe_claims):
        if injected and breach.stepped(injected):
            caused.extend(breach.evidence)
        else:
            (explained if breach.stepped(steps) else bad).extend(breach.evidence)
    counts = {
        "writes": writes,
        "accepted": landed,
        "refused_fenced": refused,
        "claims": sum(len(c) for c in claims.values()),
    }
    if caused:
        counts["lease breaches caused by an injected clock step"] = len(caused) // 2
    if bad:
        return Verdict("fencing", False, f"{len(bad) // 2 or 1} fencing violation(s)", bad, counts)
    if explained:
        return _unjudged("fencing", f"{len(explained) // 2} lease breach(es)", explained, steps, counts)
    stepped = f"; {len(caused) // 2} lease(s) lapsed early by an injected clock step" if caused else ""
    return Verdict("fencing", True, f"{refused} stale write(s) refused, none accepted{stepped}", [], counts)


def _store_steps(ops: list[Op], final: dict[str, Any], *, leases: bool = False) -> list[dict[str, Any]]:
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

    def stepped(self, steps: list[dict[str, Any]]) -> bool:
        """Whether steps inside the window are large enough to account for the breach."""
        moved = wallclock.jumped(steps, *self.window, ahead=self.ahead) * 1e9
        return bool(steps) and moved + SLACK_NS >= self.shortfall_ns


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


def _exclusive(all_ops: list[Operation], claims: dict[str, list[Operation]]) -> list[_Breach]:
    """A claim granted while another pass was provably alive: that pass had a write accepted
    (a renewal) late enough that its liveness window, measured from when the write was invoked,
    still covered the moment the new claim completed, within its budget, and no release of it had
    been invoked by then.
    Needs the claim's ``alive`` and ``budget`` in the history; older histories skip this."""
    bad: list[_Breach] = []
    passes: dict[tuple[str, int], list[Operation]] = defaultdict(list)
    for o in all_ops:
        if o.workflow is not None and o.token is not None:
            passes[(o.workflow, o.token)].append(o)
    for wf, cs in claims.items():
        for a in cs:
            alive = a.invoke.get("alive")
            budget = a.invoke.get("budget")
            if alive is None or budget is None or a.token is None:
                continue
            mine = passes.get((wf, a.token), [])
            released = min((o.start for o in mine if o.f == "release"), default=float("inf"))
            held_until = a.start + float(budget) * 1e9
            for b in cs:
                # a claim still in flight when the release was invoked may have been decided
                # after it (SQLite queues writers; Postgres waits on the row): no proof of a breach
                if b.token is None or b.token <= a.token or b.end > released:
                    continue
                for x in mine:
                    if not (x.landed and x.f in RENEWING and x.end <= b.end):
                        continue
                    covered = min(x.start + float(alive) * 1e9, held_until)
                    if b.end + SLACK_NS < covered:
                        evidence = [
                            b.brief(f"claimed while token {a.token} was alive"),
                            x.brief(f"renewed token {a.token}'s liveness ({alive}s) from before this point"),
                        ]
                        bad.append(_Breach(evidence, (x.start, b.end), covered - b.end, True))
                        break
    return bad


def _budget_ends(
    all_ops: list[Operation],
    claims: dict[str, list[Operation]],
    maybe_claims: dict[str, list[Operation]],
) -> list[_Breach]:
    """A claim refused as Contended although the newest pass's budget had run out before the
    claim began: renewals must never carry a pass past its budget. Needs ``budget`` in the claim's
    history line; a concurrent or indeterminate claim that might be the holder skips it."""
    bad: list[_Breach] = []
    for c in all_ops:
        if c.f != "claim" or c.outcome != "contended" or c.workflow is None:
            continue
        before = [a for a in claims.get(c.workflow, []) if a.end < c.start]
        if not before:
            continue
        holder = max(before, key=lambda a: a.token or 0)
        budget = holder.invoke.get("budget")
        overlapping = [
            b for b in claims.get(c.workflow, []) + maybe_claims.get(c.workflow, [])
            if b is not holder and b.start < c.end and b.end > holder.start
            and (b.token or 0) >= (holder.token or 0)
        ]  # fmt: skip
        if budget is None or overlapping:
            continue
        ends = holder.end + float(budget) * 1e9
        if c.start > ends + SLACK_NS:
            evidence = [
                c.brief(f"refused as Contended {budget}s past token {holder.token}'s budget"),
                holder.brief("the newest claim, whose budget had run out"),
            ]
            bad.append(_Breach(evidence, (holder.start, c.end), c.start - ends, False))
    return bad


# -- first writer wins ----------------------------------------------------------------------------


def first_writer_wins(ops: list[Op], final: dict[str, Any]) -> Verdict:
    """Every acknowledged write of a key returns the value the store holds at the end; ``won`` is
    True exactly when the caller offered that value; the stored value was offered by some caller;
    at most one transact of a key won; no acknowledged write is missing from the final state; a
    supply or append from outside a pass is never refused for want of the claim."""
    by_key: dict[tuple[str, str], list[Operation]] = defaultdict(list)
    for o in operations(ops):
        if o.f in WRITES and o.workflow is not None and o.invoke.get("key") is not None:
            by_key[(o.workflow, str(o.invoke["key"]))].append(o)
    bad: list[dict[str, Any]] = []
    acked = 0
    for (wf, key), group in by_key.items():
        values = _final_values(final, wf)
        present = key in values
        stored = canon(values.get(key))
        oks = [o for o in group if o.ok]
        acked += len(oks)
        if oks and not present:
            bad += [o.brief(f"acknowledged, but {key!r} is not in the final state") for o in oks]
            continue
        for o in oks:
            if canon(o.got("value")) != stored:
                bad.append(o.brief(f"returned a value other than the stored {stored}"))
            if o.f != "transact" and "value" in o.invoke:
                offered = canon(o.invoke["value"])
                if bool(o.got("won")) != (offered == stored):
                    bad.append(
                        o.brief(
                            f"won={o.got('won')} but offered "
                            f"{'==' if offered == stored else '!='} stored {stored}"
                        )
                    )
        winners = [o for o in oks if o.f == "transact" and o.got("won")]
        if len(winners) > 1:
            bad += [o.brief("a second transact of this key reported winning") for o in winners]
        if present and not any(o.f == "transact" for o in group):
            offered_any = {
                canon(o.invoke.get("value")) for o in group if o.outcome not in ("fenced", "contended")
            }
            if stored not in offered_any:
                bad.append(
                    {
                        "workflow": wf,
                        "key": key,
                        "stored": values.get(key),
                        "why": "the stored value was offered by no write that may have landed",
                    }
                )
    for o in operations(ops):
        if o.f in ("supply", "append") and o.outcome in ("fenced", "contended"):
            bad.append(
                o.brief(
                    f"{o.f} from outside a pass was refused as {o.outcome}: "
                    "writes from outside a pass are not gated on the claim"
                )
            )
    counts = {"keys": len(by_key), "acknowledged": acked}
    if bad:
        return Verdict("first-writer-wins", False, f"{len(bad)} first-writer-wins violation(s)", bad, counts)
    return Verdict("first-writer-wins", True, f"{len(by_key)} keys agree with the store", [], counts)


# -- order ----------------------------------------------------------------------------------------


def order(ops: list[Op], final: dict[str, Any]) -> Verdict:
    """Load order equals history order and follows written_at; appends got distinct keys that sort
    in real-time append order, and every acknowledged append is in the final state with its value;
    a write acknowledged before another began sits before it in load order."""
    bad: list[dict[str, Any]] = []
    steps = _store_steps(ops, final)
    explained: list[dict[str, Any]] = []
    all_ops = operations(ops)
    firsts: dict[tuple[str, str], Operation] = {}
    for o in all_ops:
        if o.ok and o.workflow is not None and ((o.f in WRITES and o.got("won")) or o.f == "append"):
            key = str(o.got("key") if o.f == "append" else o.invoke.get("key"))
            firsts.setdefault((o.workflow, key), o)
    writers = firsts
    concurrent_inversions = 0
    for wf, state in final.get("workflows", {}).items():
        hist_keys = [r[0] for r in state.get("history", [])]
        load_keys = list(state.get("load_keys", hist_keys))
        if load_keys != hist_keys:
            bad.append(
                {
                    "workflow": wf,
                    "load": load_keys,
                    "history": hist_keys,
                    "why": "load order and history order differ",
                }
            )
        stamps = [r[2] for r in state.get("history", [])]
        who = [writers.get((wf, k)) for k in hist_keys]
        for j in range(1, len(stamps)):
            # only a write that completed before the later one began proves an order in real
            # time; concurrent writes may be stamped either way round (counted, not failed)
            for i in range(max(0, j - 64), j):
                if stamps[j] >= stamps[i]:
                    continue
                a, b = who[i], who[j]
                if a is not None and b is not None and a.end < b.start:
                    reversal = {
                        "workflow": wf,
                        "keys": [hist_keys[i], hist_keys[j]],
                        "written_at": [stamps[i], stamps[j]],
                        "ops": [a.brief(), b.brief()],
                        "why": "written_at goes backward along the load order between writes "
                        "ordered in real time",
                    }
                    back_ns = (_instant(stamps[i]) - _instant(stamps[j])) * 1e9
                    breach = _Breach([reversal], (a.start, b.end), back_ns, ahead=False)
                    (explained if breach.stepped(steps) else bad).append(reversal)
                else:
                    concurrent_inversions += 1
        inbox = [k for k in hist_keys if k.startswith("inbox/")]
        if inbox != sorted(inbox):
            bad.append({"workflow": wf, "inbox": inbox, "why": "inbox keys out of order in load"})
    appends: dict[str, list[Operation]] = defaultdict(list)
    for o in all_ops:
        if o.f == "append" and o.ok and o.workflow is not None:
            appends[o.workflow].append(o)
    total = 0
    for wf, group in appends.items():
        total += len(group)
        values = _final_values(final, wf)
        owners: dict[str, Operation] = {}
        for o in group:
            key = str(o.got("key"))
            if key in owners:
                bad += [
                    owners[key].brief("append key handed out twice"),
                    o.brief("append key handed out twice"),
                ]
            owners[key] = o
            if key not in values:
                bad.append(o.brief("acknowledged append missing from the final state"))
            elif canon(values[key]) != canon(o.invoke.get("value")):
                bad.append(o.brief(f"final state holds {values[key]!r} under this append's key"))
        for a, b in _inversions([(str(o.got("key")), o) for o in group]):
            bad += [a.brief("appended first"), b.brief("appended later, got a key not above")]
    # real-time order of winning writes against load position
    position = {
        wf: {r[0]: i for i, r in enumerate(s.get("history", []))}
        for wf, s in final.get("workflows", {}).items()
    }
    by_wf: dict[str, list[tuple[str, Operation]]] = defaultdict(list)
    for (wf, key), o in firsts.items():
        by_wf[wf].append((key, o))
    for wf, items in by_wf.items():
        pos = position.get(wf, {})
        ranked = [(pos[k], o) for k, o in items if k in pos]
        for a, b in _inversions(ranked):
            bad += [
                a.brief("acknowledged first"),
                b.brief("began after it was acknowledged, but loads before it"),
            ]
    counts = {
        "workflows": len(final.get("workflows", {})),
        "appends": total,
        "written_at inversions between concurrent writes": concurrent_inversions,
    }
    if bad:
        return Verdict("order", False, f"{len(bad)} order violation(s)", bad, counts)
    if explained:
        return _unjudged("order", f"{len(explained)} written_at reversal(s)", explained, steps, counts)
    return Verdict("order", True, f"{total} appends and every load in order", [], counts)


def _instant(stamp: object) -> float:
    """A stored ``written_at`` (ISO text) as seconds since the epoch."""
    return datetime.fromisoformat(str(stamp)).timestamp()


# -- exactly-once transact ------------------------------------------------------------------------


def exactly_once(ops: list[Op], final: dict[str, Any]) -> Verdict:
    """The store's ledger moved exactly once per recorded transact key and never otherwise; the
    recorded value names the ledger row that moved; a refused transact left no row."""
    bad: list[dict[str, Any]] = []
    rows: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in final.get("ledger", []):
        rows[(str(row["workflow"]), str(row["key"]))].append(row)
    keys: set[tuple[str, str]] = set(rows)
    tx_ops: dict[tuple[str, str], list[Operation]] = defaultdict(list)
    for o in operations(ops):
        if o.f == "transact" and o.workflow is not None:
            k = (o.workflow, str(o.invoke.get("key")))
            tx_ops[k].append(o)
            keys.add(k)
    for wf, key in sorted(keys):
        values = _final_values(final, wf)
        moved = rows.get((wf, key), [])
        evidence = [o.brief() for o in tx_ops.get((wf, key), [])]
        if key in values:
            if len(moved) != 1:
                bad.append(
                    {
                        "workflow": wf,
                        "key": key,
                        "ledger_rows": moved,
                        "ops": evidence,
                        "why": f"recorded once, but the ledger moved {len(moved)} times",
                    }
                )
            elif isinstance(values[key], dict) and values[key].get("row") != moved[0].get("row"):
                bad.append(
                    {
                        "workflow": wf,
                        "key": key,
                        "recorded": values[key],
                        "ledger_rows": moved,
                        "why": "the record names another ledger row",
                    }
                )
        elif moved:
            bad.append(
                {
                    "workflow": wf,
                    "key": key,
                    "ledger_rows": moved,
                    "ops": evidence,
                    "why": "the ledger moved for a key that is not recorded",
                }
            )
        for o in tx_ops.get((wf, key), []):
            if o.outcome == "fenced" and any(r.get("token") == o.token for r in moved):
                bad.append(o.brief("refused as Fenced, but its ledger row survived"))
    counts = {"keys": len(keys), "ledger_rows": sum(len(r) for r in rows.values())}
    if bad:
        return Verdict("exactly-once", False, f"{len(bad)} exactly-once violation(s)", bad, counts)
    return Verdict("exactly-once", True, f"{len(keys)} transact keys moved the ledger once each", [], counts)


# -- at-least-once step ---------------------------------------------------------------------------


def at_least_once(ops: list[Op], final: dict[str, Any]) -> Verdict:
    """Every recorded step's effect ran (its nonce is in the external effect log); every repeat of
    an effect is attributed to a kill, a forward clock step that lapsed its pass (``clockstep``), a
    fence or a store error of the pass that ran it first; a
    step that re-ran after its record was acknowledged and before its pass loaded is a violation."""
    effects: dict[tuple[str, str], list[Op]] = defaultdict(list)
    for line in ops:
        if line["type"] == "effect":
            effects[(str(line["workflow"]), str(line["key"]))].append(line)
    all_ops = operations(ops)
    killed = {int(line["pid"]) for line in ops if line["type"] == "fault" and line.get("fault") == "kill"}
    killed |= {
        int(line["target_pid"])
        for line in ops
        if line["type"] == "fault" and line.get("target_pid") is not None and line.get("fault") == "kill"
    }
    by_pass: dict[tuple[int, str, int], list[Operation]] = defaultdict(list)
    for o in all_ops:
        if o.workflow is not None and o.token is not None:
            by_pass[(int(o.invoke["pid"]), o.workflow, o.token)].append(o)
    acks: dict[tuple[str, str], list[Operation]] = defaultdict(list)
    for o in all_ops:
        if o.f == "record" and o.ok and o.workflow is not None:
            acks[(o.workflow, str(o.invoke.get("key")))].append(o)
    bad: list[dict[str, Any]] = []
    causes: dict[str, int] = defaultdict(int)
    from .clockstep import repeat_cause

    lapsed_by_step = repeat_cause(ops, final)
    steps = 0
    for wf, state in final.get("workflows", {}).items():
        for key, value, *_ in state.get("history", []):
            if isinstance(value, dict) and "nonce" in value:
                steps += 1
                ran = effects.get((wf, key), [])
                if not any(e.get("nonce") == value["nonce"] for e in ran):
                    bad.append(
                        {
                            "workflow": wf,
                            "key": key,
                            "recorded": value,
                            "why": "recorded, but its effect never ran",
                        }
                    )
    recorded = {
        (wf, key): value.get("nonce")
        for wf, state in final.get("workflows", {}).items()
        for key, value, *_ in state.get("history", [])
        if isinstance(value, dict)
    }
    for (wf, key), ran in effects.items():
        for e in ran:
            mine = by_pass.get((int(e["pid"]), wf, int(e["token"])), [])
            loads = [o.start for o in mine if o.f == "load"]
            started = min(loads, default=int(e["mono"]))
            acked = [a for a in acks.get((wf, key), []) if a.end < started]
            if acked:
                bad += [
                    acked[0].brief("record acknowledged"),
                    {
                        **e,
                        "why": "the effect ran in a pass that loaded after its record was acknowledged",
                    },
                ]
                continue
            if e.get("nonce") == recorded.get((wf, key)):
                continue  # the one that counts
            mine_key = [o for o in mine if o.invoke.get("key") == key and o.f == "record"]
            if int(e["pid"]) in killed and not any(o.complete for o in mine_key):
                causes["kill"] += 1
            elif lapsed_by_step(mine):  # a forward clock step lapsed this pass; a newer one re-ran it
                causes["clock step"] += 1
            elif any(o.outcome == "fenced" for o in mine):
                causes["fence"] += 1
            elif any(o.outcome in ("failed", "unknown") for o in mine):
                causes["store error"] += 1
            elif any(o.ok and not o.got("won") for o in mine_key):
                causes["lost the race to a concurrent pass"] += 1
            else:
                bad.append(
                    {
                        **e,
                        "why": "the effect ran again and nothing explains it (no kill, "
                        "fence, store error or lost race in its pass)",
                    }
                )
    counts = {
        "recorded_steps": steps,
        "effects": sum(len(v) for v in effects.values()),
        **{f"repeat: {k}": v for k, v in causes.items()},
    }
    if bad:
        return Verdict("at-least-once", False, f"{len(bad)} at-least-once violation(s)", bad, counts)
    repeats = sum(causes.values())
    return Verdict(
        "at-least-once",
        True,
        f"{steps} recorded steps ran, {repeats} repeat(s) all attributed",
        [],
        counts,
    )


# -- liveness -------------------------------------------------------------------------------------


def liveness(ops: list[Op], final: dict[str, Any]) -> Verdict:
    """Every workflow of the workload finished (holds its ``done`` record) after the final heal."""
    expected = list(final.get("expected_workflows", []))
    if not expected:
        return Verdict("liveness", UNKNOWN, "the final state names no workflows to check")
    stuck = []
    for wf in expected:
        keys = [r[0] for r in _final_records(final, wf)]
        if "done" not in keys:
            stuck.append({"workflow": wf, "records": keys, "why": "not finished after the final heal"})
    counts = {"workflows": len(expected), "finished": len(expected) - len(stuck)}
    if stuck:
        return Verdict(
            "liveness",
            False,
            f"{len(stuck)} of {len(expected)} workflows unfinished",
            stuck,
            counts,
        )
    return Verdict("liveness", True, f"all {len(expected)} workflows finished", [], counts)


# -- take exclusivity (storms) --------------------------------------------------------------------


def take_exclusive(ops: list[Op], final: dict[str, Any]) -> Verdict:
    """Two takes never hand out the same workflow while it is hidden: a second take of a workflow
    within 80% of the visibility of the first, with no wake_at, schedule, arrive or deliver of it
    in between, is a double delivery."""
    all_ops = operations(ops)
    takes: dict[str, list[Operation]] = defaultdict(list)
    opens: dict[str, list[Operation]] = defaultdict(list)
    for o in all_ops:
        if o.f == "take" and o.ok and o.got("workflow"):
            takes[str(o.got("workflow"))].append(o)
        elif o.f in ("wake_at", "schedule", "arrive", "deliver", "append", "supply") and o.workflow:
            opens[o.workflow].append(o)
    bad: list[dict[str, Any]] = []
    steps = _store_steps(ops, final)
    explained: list[dict[str, Any]] = []
    count = 0
    for wf, group in takes.items():
        group.sort(key=lambda o: o.end)
        count += len(group)
        reopened = _Prefix([(o.start, o.end, o) for o in opens.get(wf, [])])
        for a, b in itertools.pairwise(group):
            visibility = float(a.invoke.get("visibility", 0)) * 1e9
            hidden = 0.8 * visibility
            hit = reopened.highest_before(b.end)
            if b.start - a.end < hidden and (hit is None or hit[0] <= a.start):
                breach = _Breach(
                    [a.brief("took it"), b.brief("took it again while hidden")],
                    (a.start, b.end),
                    visibility - (b.end - a.start),  # the widest the gap can have been
                    ahead=True,
                )
                (explained if breach.stepped(steps) else bad).extend(breach.evidence)
    counts = {"takes": count}
    if bad:
        return Verdict("take-exclusive", False, f"{len(bad) // 2} double deliveries", bad, counts)
    if explained:
        return _unjudged(
            "take-exclusive", f"{len(explained) // 2} double deliveries", explained, steps, counts
        )
    return Verdict("take-exclusive", True, f"{count} takes, none doubled", [], counts)


# -- did the fault bite? --------------------------------------------------------------------------


def _windows(ops: list[Op], fault: str) -> list[tuple[Op, Op | None]]:
    starts: dict[str, Op] = {}
    out: list[tuple[Op, Op | None]] = []
    for line in ops:
        if line["type"] != "fault" or line.get("fault") != fault:
            continue
        if line.get("phase") == "start":
            starts[str(line.get("id"))] = line
        elif line.get("phase") == "stop" and str(line.get("id")) in starts:
            out.append((starts.pop(str(line.get("id"))), line))
    out += [(s, None) for s in starts.values()]
    return out


def bite(kind: str) -> Callable[[list[Op], dict[str, Any]], Verdict]:
    """The check that the scenario's fault touched something: a run where it did not proves
    nothing and is invalid."""

    def refused_after(
        all_ops: list[Operation], windows: list[tuple[Op, Op | None]], kinds: Any, why: str
    ) -> list[dict[str, Any]]:
        """For each healed fault window, the first operation of its target process, of a pass
        claimed before the fault began, that the store refused (fenced) once the fault was under
        way: the fault cost that pass its claim and the fence held."""
        claims = {(int(o.invoke["pid"]), o.workflow, o.token): o for o in all_ops if o.f == "claim" and o.ok}
        hits = []
        for start, stop in windows:
            if stop is None:
                continue
            pid = int(start["target_pid"])
            for o in all_ops:
                c = claims.get((pid, o.workflow, o.token))
                # the fault's stop line is written after SIGCONT/heal, so the refusal may precede it
                if (
                    int(o.invoke["pid"]) == pid
                    and (kinds is None or o.f in kinds)
                    and o.outcome == "fenced"
                    and c is not None
                    and c.end < start["mono"]
                    and o.end > start["mono"]
                ):
                    hits.append(o.brief(why.format(**start)))
                    break
        return hits

    def stall_fenced(ops: list[Op], final: dict[str, Any]) -> Verdict:
        all_ops = operations(ops)
        windows = _windows(ops, "stall")
        hits = refused_after(all_ops, windows, None, "stalled {duration}s, refused on waking")
        verdict = _bit("stall-fenced", hits, len(windows), "stalled pass(es) refused on waking")
        if not hits:
            woke = [
                o
                for start, stop in windows
                if stop is not None
                for o in all_ops
                if int(o.invoke["pid"]) == int(start["target_pid"])
                and o.landed
                and o.f in FENCED_WRITES
                and o.start > start["mono"]
                and (o.token or 0)
                < max(
                    (c.token or 0)
                    for c in all_ops
                    if c.f == "claim" and c.ok and c.workflow == o.workflow and c.end < o.start
                )
            ]
            if woke:
                verdict.summary = (
                    f"{len(woke)} stalled pass(es) wrote on waking and none was refused (see fencing)"
                )
                verdict.evidence = [o.brief("stale write accepted on waking") for o in woke]
        return verdict

    def kill_between(ops: list[Op], final: dict[str, Any]) -> Verdict:
        hits = []
        points = [
            line
            for line in ops
            if line["type"] == "fault" and line.get("fault") == "kill" and line.get("phase") == "start"
        ]
        for p in points:
            if p.get("failpoint") not in ("after-effect-before-record", "inside-transact"):
                continue
            pid = int(p["pid"])
            before = [
                line
                for line in ops
                if line["type"] == "effect"
                and int(line["pid"]) == pid
                and line["mono"] < p["mono"]
                and line.get("key") == p.get("key")
            ]
            if p["failpoint"] == "inside-transact" or before:
                hits.append({**p, "why": "killed between the effect and its record"})
        return _bit("kill-between", hits, len(points), "kill(s) landed between effect and record")

    def partition_refused(ops: list[Op], final: dict[str, Any]) -> Verdict:
        all_ops = operations(ops)
        windows = _windows(ops, "partition")
        hits = refused_after(
            all_ops, windows, FENCED_WRITES, "partitioned past its lease, refused after the heal"
        )
        return _bit("partition-refused", hits, len(windows), "write(s) refused after the heal")

    def restart_survived(ops: list[Op], final: dict[str, Any]) -> Verdict:
        all_ops = operations(ops)
        hits = []
        windows = _windows(ops, "restart")
        for start, stop in windows:
            if stop is None:
                continue
            broken = [
                o
                for o in all_ops
                if o.outcome in ("failed", "unknown") and o.start <= stop["mono"] and o.end >= start["mono"]
            ]
            after = [o for o in all_ops if o.ok and o.f in WRITES and o.start > stop["mono"]]
            if broken and after:
                hits.append(
                    broken[0].brief(f"failed across the restart; {len(after)} writes succeeded after it")
                )
        return _bit("restart-survived", hits, len(windows), "restart(s) interrupted operations")

    def storm(ops: list[Op], final: dict[str, Any]) -> Verdict:
        all_ops = [o for o in operations(ops) if o.f in ("take", "append") and o.determinate]
        all_ops.sort(key=lambda o: o.start)
        overlaps = 0
        active: list[Operation] = []
        for o in all_ops:
            active = [a for a in active if a.end > o.start]
            if active:
                overlaps += 1
            active.append(o)
        verdict = _bit("storm", [{"overlapping_ops": overlaps}] if overlaps else [], len(all_ops), "storm")
        if overlaps:
            verdict.summary = f"{overlaps} of {len(all_ops)} operations overlapped another"
        return verdict

    def budget_fenced(ops: list[Op], final: dict[str, Any]) -> Verdict:
        all_ops = operations(ops)
        passes: dict[tuple[str, int], list[Operation]] = defaultdict(list)
        for o in all_ops:
            if o.workflow is not None and o.token is not None:
                passes[(o.workflow, o.token)].append(o)
        hits = []
        tried = 0
        for o in all_ops:
            if o.f != "claim" or not o.ok or o.invoke.get("budget") is None:
                continue
            mine = passes.get((str(o.workflow), int(o.token or 0)), [])
            deadline = o.end + float(o.invoke["budget"]) * 1e9
            renewed = [x for x in mine if x.f == "renew" and x.ok]
            if len(renewed) < 2 or max(x.end for x in renewed) < o.end + 0.5 * (deadline - o.end):
                continue  # not a pass that kept renewing into its budget
            tried += 1
            refused = [x for x in mine if x.outcome == "fenced" and x.start > deadline]
            if refused:
                hits.append(refused[0].brief("renewed, but refused once its budget ran out"))
        return _bit("budget-fenced", hits, tried, "renewing pass(es) refused after their budget")

    def none(ops: list[Op], final: dict[str, Any]) -> Verdict:
        return Verdict("bite", True, "this scenario injects no fault")

    table = {
        "stall-fenced": stall_fenced,
        "kill-between": kill_between,
        "partition-refused": partition_refused,
        "restart-survived": restart_survived,
        "storm": storm,
        "budget-fenced": budget_fenced,
        "none": none,
        **LIFECYCLE_BITES,
        **FAILOVER_BITES,
        **CLOCK_BITES,
    }
    return table[kind]


def _bit(kind: str, hits: list[dict[str, Any]], tried: int, what: str) -> Verdict:
    counts = {"faults": tried, "bit": len(hits)}
    if not hits:
        return Verdict(
            f"bite: {kind}",
            False,
            f"the fault did not bite ({tried} injected, 0 {what}): this run proves nothing",
            [],
            counts,
        )
    return Verdict(f"bite: {kind}", True, f"{len(hits)} {what}", hits, counts)


CHECKERS: dict[str, Callable[[list[Op], dict[str, Any]], Verdict]] = {
    "fencing": fencing,
    "first-writer-wins": first_writer_wins,
    "order": order,
    "exactly-once": exactly_once,
    "at-least-once": at_least_once,
    "liveness": liveness,
    "take-exclusive": take_exclusive,
}

# -- lifecycle (issue 14): the long-wait scenario's checkers, in their own module ----------------

from .clockstep import CLOCK_BITES  # noqa: E402
from .failover import FAILOVER_BITES  # noqa: E402
from .lifecycle_checks import LIFECYCLE_BITES, LIFECYCLE_CHECKERS  # noqa: E402

CHECKERS.update(LIFECYCLE_CHECKERS)


def _register_observed() -> None:
    # observed.py builds on this module's Verdict and operations, so it registers once they exist
    from .durability import durability
    from .observed import monotonic_loads
    from .probe_checks import PROBE_CHECKERS

    CHECKERS.update(PROBE_CHECKERS)

    CHECKERS["monotonic-loads"] = monotonic_loads
    CHECKERS["durability"] = durability
    from .misuse import misuse
    from .stamp_order import written_at

    CHECKERS["misuse"] = misuse
    CHECKERS["written-at"] = written_at
    from .stale_landing import stale_landing

    CHECKERS["stale-landing"] = stale_landing


_register_observed()


def run_checker(
    name: str,
    fn: Callable[[list[Op], dict[str, Any]], Verdict],
    ops: list[Op],
    final: dict[str, Any],
) -> Verdict:
    """Run one checker; a crash is ``unknown`` with the traceback, never valid."""
    try:
        verdict = fn(ops, final)
    except Exception:
        return Verdict(name, UNKNOWN, "the checker crashed", [{"traceback": traceback.format_exc()}])
    verdict.name = name
    return verdict


def check(ops: list[Op], final: dict[str, Any], checks: Iterable[str], bite_kind: str) -> list[Verdict]:
    """Run the named checkers and the bite check, reading the history's wall-clock steps once for
    all of them (into ``final["wall_clock_steps"]`` unless the caller already did)."""
    if "wall_clock_steps" not in final:
        final = {**final, "wall_clock_steps": wallclock.steps(ops)}
    out = [run_checker(name, CHECKERS[name], ops, final) for name in checks]
    out.append(run_checker(f"bite: {bite_kind}", bite(bite_kind), ops, final))
    return out


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
