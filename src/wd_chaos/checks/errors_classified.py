"""errors-classified: input the store refuses is refused as input, and refusing it harms no one else.

A caller that sends what the store cannot hold (an id or key too long for its index, a value nested
deeper than its codec or server can take, a value its codec cannot encode) must be told so: an
``InvalidInput`` error, which says "do not retry this". A ``StoreUnavailable`` or ``StoreError``
says "the store failed, try again", so a client retries refused input for ever and an operator
chases an outage that is not there. And a refusal must stay the refused caller's: the valid calls
sent beside it (in one batch, say) still succeed.

The workload marks what it sends (``wd_chaos.client.clients``): a refused-input call carries ``refused``
(what is wrong with it: ``oversize-id``, ``oversize-key``, ``deep``, ``codec``) and its ``burst``;
the valid calls it sends at the same moment carry ``beside`` (that burst). Errors are judged by
their type names (the complete line's ``error_types``, the exception's classes, else the name the
``error`` text starts with).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ..history import Op
from ..rundir import FinalState
from .core import UNKNOWN, Operation, Verdict, checker, operations

MUST_REFUSE = ("codec",)
"""Kinds of refused input no store may accept: a value the codec cannot encode (a set, NaN) has
nothing to store. The others (a long id or key, a deep value) a store may hold if it can."""


def _refusals() -> set[str]:
    """The names of ``InvalidInput`` and every subclass of it imported so far."""
    from without_durability.errors import InvalidInput

    names: set[str] = set()
    todo: list[type] = [InvalidInput]
    while todo:
        cls = todo.pop()
        names.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    return names


def error_types(o: Operation) -> list[str]:
    """The class names of the error ``o`` completed with (most specific first), as recorded."""
    types = o.got("error_types")
    if isinstance(types, list):
        return [str(t) for t in types]
    error = str(o.got("error") or "")
    return [error.split(":", 1)[0]] if error else []


def refused_as_input(o: Operation) -> bool:
    """Whether ``o`` failed with an error of the ``InvalidInput`` family."""
    return bool(set(error_types(o)) & ({"InvalidInput"} | _refusals()))


def _faulted(o: Operation, windows: list[tuple[float, float]]) -> bool:
    return any(start <= o.end and o.start <= stop for start, stop in windows)


def fault_windows(ops: list[Op]) -> list[tuple[float, float]]:
    """Every injected fault's (start, stop) in monotonic ns (an unhealed one runs to the end)."""
    starts: dict[str, float] = {}
    out: list[tuple[float, float]] = []
    last = float(ops[-1]["mono"]) if ops else 0.0
    for line in ops:
        if line["type"] != "fault" or line.get("fault") == "heal":
            continue
        key = f"{line.get('fault')}:{line.get('id')}:{line.get('target_pid')}"
        if line.get("phase") == "start":
            starts[key] = float(line["mono"])
        elif line.get("phase") == "stop" and key in starts:
            out.append((starts.pop(key), float(line["mono"])))
    out += [(s, last) for s in starts.values()]
    return out


@checker("errors-classified")
def errors_classified(ops: list[Op], final: FinalState) -> Verdict:
    """Every call the workload sent with refused input (``refused`` on its invoke) either succeeded
    (a store that can hold it; never for input the codec cannot encode) or failed with an error of
    the ``InvalidInput`` family, never ``StoreUnavailable``, ``StoreError`` or an unknown outcome;
    and every valid call sent beside it (``beside`` its burst) succeeded. A call cut off by its
    process's death is not judged; one overlapping an injected fault is excused (the verdict is
    then unknown if nothing else is wrong). Unknown when no refused input was sent."""
    del final
    all_ops = operations(ops)
    windows = fault_windows(ops)
    refused = [o for o in all_ops if o.invoke.get("refused") and o.complete is not None]
    beside: dict[str, list[Operation]] = defaultdict(list)
    for o in all_ops:
        if o.invoke.get("beside") is not None and o.complete is not None:
            beside[str(o.invoke["beside"])].append(o)
    bad: list[dict[str, Any]] = []
    excused: list[dict[str, Any]] = []
    counts = {"refused input sent": len(refused), "refused as input": 0, "accepted": 0, "valid beside": 0}
    bursts: set[str] = set()
    for o in refused:
        kind = str(o.invoke["refused"])
        bursts.add(str(o.invoke.get("burst")))
        if o.ok:
            counts["accepted"] += 1
            if kind in MUST_REFUSE:
                bad.append(o.brief(f"input the codec cannot encode ({kind}) was accepted"))
            continue
        if o.outcome == "failed" and refused_as_input(o):
            counts["refused as input"] += 1
            continue
        why = (
            f"refused input ({kind}) got {', '.join(error_types(o)) or 'no error'} (outcome "
            f"{o.outcome}), not InvalidInput: the caller is told the store failed and retries"
        )
        (excused if _faulted(o, windows) else bad).append(o.brief(why))
    for burst in sorted(bursts):
        for o in beside.get(burst, []):
            counts["valid beside"] += 1
            if o.ok:
                continue
            why = f"a valid call sent beside refused input (burst {burst}) failed: {o.got('error')}"
            (excused if _faulted(o, windows) else bad).append(o.brief(why))
    if bad:
        return Verdict("errors-classified", False, f"{len(bad)} call(s) misclassified or harmed", bad, counts)
    if excused:
        counts["excused by a fault"] = len(excused)
        return Verdict(
            "errors-classified",
            UNKNOWN,
            f"{len(excused)} refusal(s) misreported while a fault was injected: cannot tell whose doing",
            excused,
            counts,
        )
    if not refused:
        return Verdict("errors-classified", UNKNOWN, "no refused input was sent: nothing judged", [], counts)
    return Verdict(
        "errors-classified",
        True,
        f"{counts['refused as input']} of {len(refused)} refused-input calls refused as InvalidInput "
        f"({counts['accepted']} held), {counts['valid beside']} valid calls beside them all succeeded",
        [],
        counts,
    )
