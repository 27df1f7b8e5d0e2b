"""What a bite check is written with, public for the fault kinds in ``wd_chaos.faults`` and the
checkers here alike: the verdict a bite check gives (``bit``), a fault's injections as its start
and stop lines in the history (``injections``) and the refusals a fault cost a pass
(``refused_after``). A fault module imports these, never a private name of ``core``."""

from __future__ import annotations

from typing import Any

from ..history import Op
from .core import NOT_TESTED, UNKNOWN, Operation, Verdict


def bit(kind: str, hits: list[dict[str, Any]], tried: int, what: str) -> Verdict:
    """A bite check's verdict: valid with the hits as evidence, or, with none, unknown (never
    invalid: a fault that touched nothing says nothing about the store, so the run can only be
    unknown, exit 2, unless a checker found a real violation)."""
    counts = {"faults": tried, "bit": len(hits)}
    if not hits:
        return Verdict(
            f"bite: {kind}",
            UNKNOWN,
            f"{NOT_TESTED} ({tried} injected, 0 {what})",
            [],
            counts,
        )
    return Verdict(f"bite: {kind}", True, f"{len(hits)} {what}", hits, counts)


def injections(ops: list[Op], fault: str) -> list[tuple[Op, Op | None]]:
    """Each injection of ``fault`` in the history: its start line and its stop line (None while
    it was never healed), in the order they ended, the unhealed last."""
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
