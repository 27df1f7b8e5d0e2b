"""no-hung-pass: nothing a pass started outlives it, and every worker finishes.

When a pass's body ends, the Worker cancels its renewal ticker and waits for it, then records and
releases. A store call that swallows the cancellation keeps the ticker renewing a pass whose body
is over, for ever: the workflow stays claimed, the worker never takes another one, and it does
not stop when asked. The history shows it: ``body`` operations (the workflow body, as the
library Worker ran it, or a careless client's own pass, ``wd_chaos.client.clients``), ``pass``
operations (a careless client's pass, from its claim until its ticker has ended), the ``renew``
calls, and each process's ``start`` and ``exit`` lines; the controller writes ``stop`` when it
asks the processes to end.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ..history import Op
from ..rundir import FinalState
from .core import UNKNOWN, Operation, Verdict, checker, operations

MARGIN_NS = 5_000_000_000
"""How long after its body ends a pass may take to end (its ticker cancelled, its lifecycle record
and release made), and how long a renewal may still be invoked: 5 s, longer than any store call
takes to be cut off by its timeout."""

ROLES = ("worker", "careless")
"""The processes that run passes, each of which must exit when the controller stops the run."""


def _process_ends(ops: list[Op]) -> tuple[dict[int, float], dict[int, str], float | None]:
    """Each process's end (its exit line, or the fault that killed it), each started pass-running
    process's role, and when the controller asked them all to stop (None: older histories)."""
    ends: dict[int, float] = {}
    roles: dict[int, str] = {}
    stop: float | None = None
    for line in ops:
        pid = int(line.get("pid", 0))
        if line["type"] == "info" and line.get("what") == "start" and line.get("role") in ROLES:
            roles[pid] = str(line["role"])
        elif line["type"] == "info" and line.get("what") == "exit":
            ends.setdefault(pid, float(line["mono"]))
        elif line["type"] == "info" and line.get("what") == "stop" and line.get("process") == "controller":
            stop = float(line["mono"]) if stop is None else stop
        elif line["type"] == "fault" and line.get("phase") == "start" and line.get("failpoint"):
            ends.setdefault(pid, float(line["mono"]))  # it killed itself at a failpoint
        elif line["type"] == "fault" and line.get("restarted_pid") is not None:
            ends.setdefault(int(line["target_pid"]), float(line["mono"]))  # died, and restarted
    return ends, roles, stop


def _stalled(ops: list[Op]) -> dict[int, list[tuple[float, float]]]:
    """Windows in which a process was stopped by an injected fault (SIGSTOP), by pid."""
    out: dict[int, list[tuple[float, float]]] = defaultdict(list)
    starts: dict[tuple[int, str], float] = {}
    for line in ops:
        if line["type"] != "fault" or line.get("target_pid") is None or line.get("restarted_pid") is not None:
            continue
        key = (int(line["target_pid"]), str(line.get("id")))
        if line.get("phase") == "start":
            starts[key] = float(line["mono"])
        elif line.get("phase") == "stop" and key in starts:
            out[key[0]].append((starts.pop(key), float(line["mono"])))
    for (pid, _), s in starts.items():
        out[pid].append((s, float("inf")))
    return out


@checker("no-hung-pass")
def no_hung_pass(ops: list[Op], final: FinalState) -> Verdict:
    """No renewal of a pass is invoked more than ``MARGIN_NS`` after its body ended; no pass (a
    ``pass`` operation) ends more than that after its body, nor never while its process lived on
    past that; and every worker or careless-client process that started exits once the controller
    asks (or was killed by a fault). A pass whose process an injected fault stopped (SIGSTOP) in
    that window is not judged. Unknown when the history has neither bodies nor such processes."""
    del final
    all_ops = operations(ops)
    ends, roles, stop = _process_ends(ops)
    stalled = _stalled(ops)
    bodies = [o for o in all_ops if o.f == "body" and o.complete is not None and o.workflow is not None]
    renews: dict[tuple[int, str, int], list[Operation]] = defaultdict(list)
    passes: dict[tuple[int, str, int], Operation] = {}
    for o in all_ops:
        if o.workflow is None or o.token is None:
            continue
        key = (int(o.invoke["pid"]), o.workflow, o.token)
        if o.f == "renew":
            renews[key].append(o)
        elif o.f == "pass":
            passes[key] = o
    bad: list[dict[str, Any]] = []
    judged = 0
    for b in bodies:
        if b.token is None:
            continue
        key = (int(b.invoke["pid"]), str(b.workflow), b.token)
        deadline = b.end + MARGIN_NS
        if any(s <= deadline and b.end <= e for s, e in stalled.get(key[0], [])):
            continue
        judged += 1
        late = [r for r in renews.get(key, []) if r.start > deadline]
        if late:
            over = (late[-1].start - b.end) / 1e9
            bad.append(
                {
                    **b.brief(
                        f"{len(late)} renewal(s) of this pass invoked up to {over:.1f}s after its body ended"
                    ),
                    "renewals": [r.brief() for r in late[:3]],
                }
            )
        p = passes.get(key)
        if p is None:
            continue
        gone = ends.get(key[0], float("inf"))
        if p.end > deadline and gone > deadline:
            what = (
                "never ended" if p.complete is None else f"ended {(p.end - b.end) / 1e9:.1f}s after its body"
            )
            bad.append({**p.brief(f"the pass {what}: its ticker outlived its body"), "body": b.brief()})
    for pid, role in sorted(roles.items()):
        if stop is not None and pid not in ends:
            bad.append(
                {
                    "pid": pid,
                    "role": role,
                    "why": f"this {role} process never finished: no exit line after the controller asked it to stop",
                }
            )
    counts = {"bodies": len(bodies), "judged": judged, "processes": len(roles)}
    if bad:
        return Verdict("no-hung-pass", False, f"{len(bad)} pass(es) or process(es) hung", bad, counts)
    if not bodies and not (roles and stop is not None):
        return Verdict(
            "no-hung-pass", UNKNOWN, "no pass bodies and no stopped processes: nothing judged", [], counts
        )
    return Verdict(
        "no-hung-pass",
        True,
        f"{judged} pass bodies: each pass and its renewals ended within {MARGIN_NS / 1e9:.0f}s; "
        f"{len(roles)} processes exited",
        [],
        counts,
    )
