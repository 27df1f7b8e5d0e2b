"""What the checkers read of two fault kinds' lines in the history, kept below both ``checks``
and ``faults`` so a checker reads them without importing a fault kind: the clock steps a
``clock-step`` fault made, the passes a forward step lapsed (``repeat_cause``, which
``at_least_once`` attributes repeated effects to; ``lease_steps``, which ``fencing`` excuses), and
the processes a ``reboot`` killed (``reboots_by_pid``). The fault modules
(``wd_chaos.faults.clock_step``, ``wd_chaos.faults.reboot``) take their kinds' names from here and
build their bite checks on these readers."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

from ..history import Op
from ..rundir import FinalState
from .core import FENCED_WRITES, RENEWING, SLACK_NS, Operation, operations

CLOCK_STEP = "clock-step"
"""The ``fault`` of a clock step's lines (the kind ``wd_chaos.faults.clock_step`` injects)."""
REBOOT = "reboot"
"""The ``fault`` of a reboot's lines (the kind ``wd_chaos.faults.reboot`` injects)."""


# -- clock steps ----------------------------------------------------------------------------------


def clock_steps(ops: list[Op]) -> list[dict[str, Any]]:
    """The clock steps this run made, in the form ``wallclock.steps`` gives: ``seconds``,
    ``wall`` and ``between`` (monotonic ns just before and after the control file changed)."""
    return [
        {
            "seconds": float(line["seconds"]),
            "wall": line.get("wall"),
            "between": [int(line["before_mono"]), int(line["mono"])],
            "injected": True,
        }
        for line in ops
        if line["type"] == "fault" and line.get("fault") == CLOCK_STEP and line.get("phase") == "start"
    ]


def lease_steps(ops: list[Op], final: FinalState) -> list[dict[str, Any]]:
    """The injected steps that moved the clock the store's leases run on: every step on a store
    whose leases are on its wall clock (a server's ``now()``/``TIME``), none on a store that keeps
    them on the monotonic clock (SQLite), where a lapse at a step is the store's fault."""
    return clock_steps(ops) if final.get("lease_clock") == "wall" else []


def window_end(x: Operation, mine: list[Operation]) -> float:
    """When the liveness ``x`` (a landed write of a pass) gave ran out in real time: its alive
    window from when it was invoked, never past the budget from when the claim was invoked."""
    claim = next((o for o in mine if o.f == "claim" and o.invoke.get("alive") is not None), None)
    if claim is None:
        return float("-inf")
    held_until = claim.start + float(claim.invoke.get("budget") or "inf") * 1e9
    return min(x.start + float(claim.invoke["alive"]) * 1e9, held_until)


def live_at(mine: list[Operation], at: float) -> Operation | None:
    """The last write of a pass that kept it alive, landed before ``at`` with its liveness window
    still open at ``at``; None if there is none."""

    kept = [x for x in mine if x.landed and x.f in RENEWING and x.end <= at and window_end(x, mine) > at]
    return max(kept, key=lambda x: x.end, default=None)


def passes_of(all_ops: list[Operation]) -> dict[tuple[str, int], list[Operation]]:
    passes: dict[tuple[str, int], list[Operation]] = defaultdict(list)
    for o in all_ops:
        if o.workflow is not None and o.token is not None:
            passes[(o.workflow, o.token)].append(o)
    return passes


def lapsed(ops: list[Op], final: FinalState) -> list[tuple[Operation, Operation, Operation]]:
    """For each forward step on a store whose leases run on the stepped clock, the passes it
    lapsed: ``(held, taken, refused)``: ``held`` the old pass's last write before ``taken`` (a
    newer claim of its workflow, decided after the step began), whose liveness window still
    covered the moment ``taken`` completed, with the step between the two; and ``refused`` the old
    pass's next write, refused as Fenced. The breach is the one ``checkers.fencing`` lays on the
    step, plus the fence that must follow it."""

    steps = [s for s in lease_steps(ops, final) if s["seconds"] > 0]
    if not steps:
        return []
    all_ops = operations(ops)
    passes = passes_of(all_ops)
    claims = [o for o in all_ops if o.f == "claim" and o.ok and o.token is not None]
    found = []
    for step in steps:
        lo, hi = step["between"]
        for taken in claims:
            if taken.end < lo:
                continue
            assert taken.workflow is not None and taken.token is not None
            for (wf, token), mine in passes.items():
                if wf != taken.workflow or token >= taken.token:
                    continue
                released = min((o.start for o in mine if o.f == "release"), default=float("inf"))
                kept = [x for x in mine if x.landed and x.f in RENEWING and x.end <= taken.end]
                held = max(kept, key=lambda x: x.end, default=None)
                if held is None or released < taken.end or held.start > hi:
                    continue  # released first, or renewed only after the step: no lapse to see
                if taken.end + SLACK_NS >= window_end(held, mine):
                    continue  # the old pass's own window had run out by then: no step needed
                later = sorted(
                    (o for o in mine if o.f in FENCED_WRITES and o.start > held.end), key=lambda o: o.start
                )
                if later and later[0].outcome == "fenced":
                    found.append((held, taken, later[0]))
    # one lapse per old pass is enough evidence
    unique: dict[tuple[str | None, int | None], tuple[Operation, Operation, Operation]] = {}
    for held, taken, refused in found:
        unique.setdefault((held.workflow, held.token), (held, taken, refused))
    return list(unique.values())


def repeat_cause(ops: list[Op], final: FinalState) -> Callable[[list[Operation]], bool]:
    """Whether a pass (its operations) was lapsed by a forward step: its repeated effects are the
    step's doing (at-least-once attributes them to it)."""
    hit = {(held.workflow, held.token) for held, _, _ in lapsed(ops, final)}

    def caused(mine: list[Operation]) -> bool:
        return any((o.workflow, o.token) in hit for o in mine)

    return caused


# -- reboots --------------------------------------------------------------------------------------


def reboot_lines(ops: list[Op]) -> list[Op]:
    return [
        line
        for line in ops
        if line["type"] == "fault" and line.get("fault") == REBOOT and line.get("phase") == "start"
    ]


def reboots_by_pid(ops: list[Op]) -> dict[int, list[int]]:
    """Each process a reboot killed (by pid), with the moments (monotonic ns) of the reboots that
    killed it. A pass of such a process held nothing after that moment: the store's rule (a claim
    row written before the lease clock restarted is free) lets the workflow be claimed at once, and
    ``fencing`` does not count such a claim as taken from a live pass."""
    out: dict[int, list[int]] = defaultdict(list)
    for r in reboot_lines(ops):
        for pid in r.get("target_pids") or []:
            out[int(pid)].append(int(r["mono"]))
    return dict(out)
