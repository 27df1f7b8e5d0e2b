"""The lifecycle checkers (the ``long-wait`` scenario): nothing live is lost while waits outlast a
small retention, and failed workflows stop at their attempt limit.

With retention set small, a finished or failed workflow may be gone from the store by the final
read (that is allowed: only terminal workflows may go), so these judge from what clients observed
in the history: a write acknowledged, a load's keys, a body's attempt. A workflow is terminal from
the moment a ``wd/finished`` or ``wd/failed/`` record of it was acknowledged.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ..history import Op
from ..rundir import FinalState
from .bitten import bit
from .core import UNKNOWN, Operation, Verdict, _final_records, bite_check, checker, operations

LANDING = ("record", "supply", "transact", "append")
"""Operations that add a record when they complete ok."""


def _terminal_key(key: object) -> bool:
    return key == "wd/finished" or str(key).startswith("wd/failed/")


class _Life:
    """The history read once: acknowledged writes, loads and terminal moments per workflow."""

    def __init__(self, ops: list[Op], final: FinalState) -> None:
        self.ops = operations(ops)
        self.lines = ops
        self.final = final
        self.expected: list[str] = list(final.get("expected_workflows", []))
        self.failing: set[str] = set(final.get("failing", []))
        self.acks: dict[str, list[Operation]] = defaultdict(list)
        self.loads: dict[str, list[Operation]] = defaultdict(list)
        self.terminal_at: dict[str, float] = {}
        self.finished: set[str] = set()
        self.failed: set[str] = set()
        for o in self.ops:
            wf = o.workflow
            if wf is None or not o.ok:
                continue
            if o.f in LANDING:
                self.acks[wf].append(o)
                key = o.invoke.get("key") if o.f != "append" else o.got("key")
                if o.f == "record" and _terminal_key(key):
                    self.terminal_at[wf] = min(self.terminal_at.get(wf, float("inf")), o.end)
                    (self.finished if key == "wd/finished" else self.failed).add(wf)
            elif o.f == "load":
                self.loads[wf].append(o)
        for wf in self.expected:  # what the final read still shows counts too
            keys = [r[0] for r in _final_records(final, wf)]
            if "wd/finished" in keys:
                self.finished.add(wf)
            if any(str(k).startswith("wd/failed/") for k in keys):
                self.failed.add(wf)

    def terminal_before(self, wf: str, mono: float) -> bool:
        return self.terminal_at.get(wf, float("inf")) < mono

    @staticmethod
    def key_of(o: Operation) -> str:
        return str(o.got("key") if o.f == "append" else o.invoke.get("key"))


@checker("ledger-once")
def ledger_once(ops: list[Op], final: FinalState) -> Verdict:
    """Every workflow's transact moved the in-store ledger at most once, and exactly once for one
    that finished or failed (both pass its transact first), whether or not its records are still
    there; a transact refused as Fenced left no row."""
    life = _Life(ops, final)
    rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in final.get("ledger", []):
        rows[str(row["workflow"])].append(row)
    bad: list[dict[str, Any]] = []
    for wf in life.expected:
        moved = rows.get(wf, [])
        if len(moved) > 1:
            bad.append({"workflow": wf, "ledger_rows": moved, "why": f"the ledger moved {len(moved)} times"})
        elif not moved and (wf in life.finished or wf in life.failed):
            bad.append({"workflow": wf, "why": "terminal, but its transact never moved the ledger"})
    for o in life.ops:
        mine = rows.get(o.workflow or "", [])
        if o.f == "transact" and o.outcome == "fenced" and any(r.get("token") == o.token for r in mine):
            bad.append(o.brief("refused as Fenced, but its ledger row survived"))
    counts = {"workflows": len(life.expected), "ledger_rows": sum(len(r) for r in rows.values())}
    if bad:
        return Verdict("ledger-once", False, f"{len(bad)} exactly-once violation(s)", bad, counts)
    return Verdict(
        "ledger-once", True, f"{len(life.expected)} workflows moved the ledger at most once", [], counts
    )


@checker("no-rerun")
def no_rerun(ops: list[Op], final: FinalState) -> Verdict:
    """No step's effect ran in a pass that loaded after the step's record was acknowledged (that
    pass found the record gone: the workflow restarted)."""
    life = _Life(ops, final)
    first_load: dict[tuple[int, str, int], float] = {}
    for wf, loads in life.loads.items():
        for o in loads:
            if o.token is not None:
                k = (int(o.invoke["pid"]), wf, o.token)
                first_load[k] = min(first_load.get(k, float("inf")), o.start)
    acked: dict[tuple[str, str], float] = {}
    for wf, acks in life.acks.items():
        for o in acks:
            if o.f == "record":
                k2 = (wf, life.key_of(o))
                acked[k2] = min(acked.get(k2, float("inf")), o.end)
    bad: list[dict[str, Any]] = []
    effects = 0
    for line in life.lines:
        if line["type"] != "effect":
            continue
        effects += 1
        wf, key = str(line["workflow"]), str(line["key"])
        started = first_load.get((int(line["pid"]), wf, int(line["token"])), float(line["mono"]))
        if acked.get((wf, key), float("inf")) < started:
            bad.append({**line, "why": "ran in a pass that loaded after its record was acknowledged"})
    counts = {"effects": effects, "acknowledged_steps": len(acked)}
    if bad:
        return Verdict("no-rerun", False, f"{len(bad)} step(s) ran again after their record", bad, counts)
    return Verdict("no-rerun", True, f"{effects} effects, none after its record", [], counts)


@checker("nothing-lost")
def nothing_lost(ops: list[Op], final: FinalState) -> Verdict:
    """No open workflow loses a record: every load shows every write to its workflow that was
    acknowledged before the load began, unless the workflow had become terminal by then; a workflow
    that never became terminal still holds them all at the final read."""
    life = _Life(ops, final)
    bad: list[dict[str, Any]] = []
    checked = 0
    for wf, loads in life.loads.items():
        acks = sorted(life.acks.get(wf, []), key=lambda o: o.end)
        for load in loads:
            if life.terminal_before(wf, load.start):
                continue
            checked += 1
            keys = set(load.got("keys") or [])
            missing = [a for a in acks if a.end < load.start and life.key_of(a) not in keys]
            if missing:
                bad += [
                    missing[0].brief("acknowledged"),
                    load.brief("a later load of the open workflow lacks it"),
                ]
    for wf in life.expected:
        if wf in life.terminal_at or wf in life.finished or wf in life.failed:
            continue
        held = {r[0] for r in _final_records(final, wf)}
        gone = sorted({life.key_of(a) for a in life.acks.get(wf, [])} - held)
        if gone:
            bad.append(
                {"workflow": wf, "missing": gone, "why": "open at the end, and these records are gone"}
            )
    counts = {"loads_checked": checked}
    if bad:
        return Verdict("nothing-lost", False, f"{len(bad)} lost record(s) of open workflows", bad, counts)
    return Verdict(
        "nothing-lost", True, f"{checked} loads of open workflows showed every acknowledged write", [], counts
    )


@checker("arrivals")
def arrivals(ops: list[Op], final: FinalState) -> Verdict:
    """Every acknowledged ``arrive`` reaches its workflow: a pass loads it afterwards (or the
    workflow was already terminal, when its body need not see it)."""
    life = _Life(ops, final)
    bad: list[dict[str, Any]] = []
    arrived = 0
    for o in life.ops:
        if o.f != "supply" or o.invoke.get("via") != "arrive" or not o.ok or o.workflow is None:
            continue
        arrived += 1
        wf, key = o.workflow, str(o.invoke.get("key"))
        if life.terminal_before(wf, o.start):
            continue
        seen = any(load.start > o.end and key in (load.got("keys") or []) for load in life.loads.get(wf, []))
        if not seen and key not in {r[0] for r in _final_records(final, wf)} and wf not in life.finished:
            bad.append(o.brief("acknowledged, but no later pass loaded it"))
    counts = {"arrivals": arrived}
    if bad:
        return Verdict("arrivals", False, f"{len(bad)} arrival(s) never reached their workflow", bad, counts)
    return Verdict("arrivals", True, f"{arrived} arrivals all reached their workflows", [], counts)


@checker("attempt-limit")
def attempt_limit(ops: list[Op], final: FinalState) -> Verdict:
    """A failing workflow records one ``wd/error`` per failed attempt, fails after exactly
    ``max_attempts`` of them, and its body never runs after its failure was acknowledged; no other
    workflow fails."""
    life = _Life(ops, final)
    settings = final.get("lifecycle") or {}
    if "max_attempts" not in settings:
        return Verdict("attempt-limit", UNKNOWN, "the final state names no attempt limit")
    limit = int(settings["max_attempts"])
    attempts: dict[str, list[Op]] = defaultdict(list)
    for line in life.lines:
        if line["type"] == "info" and line.get("what") == "attempt":
            attempts[str(line["workflow"])].append(line)
    bad: list[dict[str, Any]] = []
    for wf in life.expected:
        errors = {life.key_of(o) for o in life.acks.get(wf, []) if life.key_of(o).startswith("wd/error/")}
        errors |= {str(r[0]) for r in _final_records(final, wf) if str(r[0]).startswith("wd/error/")}
        if wf not in life.failing:
            if wf in life.failed:
                bad.append({"workflow": wf, "why": "failed, but its body never raises"})
            continue
        if wf not in life.failed:
            bad.append({"workflow": wf, "attempts": len(attempts[wf]), "why": "never failed"})
            continue
        if len(errors) != limit:
            bad.append(
                {"workflow": wf, "errors": sorted(errors), "why": f"failed after {len(errors)}, not {limit}"}
            )
        after = [a for a in attempts[wf] if a["mono"] > life.terminal_at.get(wf, float("inf"))]
        if after:
            bad.append({**after[0], "why": "the body ran again after the failure was acknowledged"})
    counts = {
        "failing": len(life.failing),
        "failed": len(life.failed),
        "attempts": sum(map(len, attempts.values())),
    }
    if bad:
        return Verdict("attempt-limit", False, f"{len(bad)} attempt-limit violation(s)", bad, counts)
    return Verdict(
        "attempt-limit",
        True,
        f"{len(life.failing)} failing workflows stopped at {limit} attempts",
        [],
        counts,
    )


@checker("lifecycle-liveness")
def lifecycle_liveness(ops: list[Op], final: FinalState) -> Verdict:
    """After the final heal every workflow is terminal: failed if it fails on purpose, else
    finished (acknowledged ``wd/finished``, whether or not its records are still kept)."""
    life = _Life(ops, final)
    if not life.expected:
        return Verdict("lifecycle-liveness", UNKNOWN, "the final state names no workflows to check")
    stuck = []
    for wf in life.expected:
        want = life.failed if wf in life.failing else life.finished
        if wf not in want:
            kind = "failed" if wf in life.failing else "finished"
            keys = [r[0] for r in _final_records(final, wf)]
            stuck.append({"workflow": wf, "records": keys, "why": f"not {kind} after the final heal"})
    counts = {"workflows": len(life.expected), "terminal": len(life.expected) - len(stuck)}
    if stuck:
        return Verdict(
            "lifecycle-liveness", False, f"{len(stuck)} of {len(life.expected)} not terminal", stuck, counts
        )
    return Verdict("lifecycle-liveness", True, f"all {len(life.expected)} workflows terminal", [], counts)


@bite_check("long-wait")
def long_wait_bit(ops: list[Op], final: FinalState) -> Verdict:
    """The bite: some open workflow sat unwritten for longer than the sweep age and than the TTL
    plus a claim's budget (what a write used to keep the records for), and the next pass still
    loaded all its records (a store that expired or swept it would not)."""
    life = _Life(ops, final)
    settings = final.get("lifecycle") or {}
    ttl = float(settings.get("ttl", 0)) + float(settings.get("claim_budget", 0))
    idle_ns = max(ttl, float(settings.get("sweep_age", 0))) * 1e9
    hits: list[dict[str, Any]] = []
    for wf, loads in life.loads.items():
        acks = sorted(life.acks.get(wf, []), key=lambda o: o.end)
        for load in loads:
            before = [a for a in acks if a.end < load.start]
            if before and not life.terminal_before(wf, load.start) and load.start - before[-1].end > idle_ns:
                hits.append(load.brief(f"loaded after {(load.start - before[-1].end) / 1e9:.1f}s idle"))
                break
    return bit("long-wait", hits, len(life.expected), "workflow(s) idle past the TTL and sweep age, kept")
