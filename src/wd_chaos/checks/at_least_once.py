"""at-least-once: every step's effect ran, and ran again only where a fault explains it."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ..history import Op
from ..rundir import FinalState
from .core import (
    Operation,
    Verdict,
    checker,
    operations,
)
from .fault_reads import repeat_cause


@checker("at-least-once")
def at_least_once(ops: list[Op], final: FinalState) -> Verdict:
    """Every recorded step's effect ran (its nonce is in the external effect log); every repeat of
    an effect is attributed to a kill, a forward clock step that lapsed its pass (``faults.clock_step``), a
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
