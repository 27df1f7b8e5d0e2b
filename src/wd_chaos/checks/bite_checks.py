"""The bite checks: the evidence that a scenario's fault touched something. A run whose fault did
not bite proves nothing and is invalid."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from .. import clockstep, failover
from ..history import Op
from .core import (
    FENCED_WRITES,
    WRITES,
    Check,
    Operation,
    Verdict,
    _bit,
    _windows,
    bite_check,
    operations,
)


def _refused_after(
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


@bite_check("stall-fenced")
def stall_fenced(ops: list[Op], final: dict[str, Any]) -> Verdict:
    all_ops = operations(ops)
    windows = _windows(ops, "stall")
    hits = _refused_after(all_ops, windows, None, "stalled {duration}s, refused on waking")
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


@bite_check("kill-between")
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


@bite_check("partition-refused")
def partition_refused(ops: list[Op], final: dict[str, Any]) -> Verdict:
    all_ops = operations(ops)
    windows = _windows(ops, "partition")
    hits = _refused_after(
        all_ops, windows, FENCED_WRITES, "partitioned past its lease, refused after the heal"
    )
    return _bit("partition-refused", hits, len(windows), "write(s) refused after the heal")


@bite_check("restart-survived")
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
            hits.append(broken[0].brief(f"failed across the restart; {len(after)} writes succeeded after it"))
    return _bit("restart-survived", hits, len(windows), "restart(s) interrupted operations")


@bite_check("storm")
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


@bite_check("budget-fenced")
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


@bite_check("none")
def none(ops: list[Op], final: dict[str, Any]) -> Verdict:
    """For a scenario that injects no fault (a storm judges its own overlap): nothing to bite."""
    return Verdict("bite", True, "this scenario injects no fault")


failover_promoted = Check("failover-promoted", failover.failover_promoted, bite=True)
clock_step = Check(clockstep.KIND, clockstep.clock_step_bite, bite=True)
